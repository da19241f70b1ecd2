"""Write tests/files/schema1-<commit>.sqlite3 again, each with the engine of its commit.

    python tests/files/make_files.py        (from the checkout's top folder)

Each file holds one state of every kind, written by that release's own code
on a model clock: E0001 and E0003 done (E0003 after a retry: generations 1
and 2), E0002 dead (a permanent failure), E0004 leased (claimed at 1007, its
lease until 1037), E0005 ready (enqueued at 1010), and a journal
of every step. The tests open these files, migrate copies of them and audit
the result.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import previous_engine  # noqa: E402

SCRIPT = r"""
import sys
from queue_core import Handler, ModelClock, Queue
clock = ModelClock(1000)
queue = Queue(sys.argv[1], clock=clock, lease_seconds=30)
queue.enqueue_jsonl(
    '{"event_id": "E0001", "payload": {"category": "book", "amount_cents": 10000}}\n'
    '{"event_id": "E0002", "payload": {"category": "toy", "amount_cents": 3000}}\n'
    '{"event_id": "E0003", "payload": {"category": "book", "amount_cents": 5000}}\n'
    '{"event_id": "E0004", "payload": {"category": "pen", "amount_cents": 2000}}\n')
handler = Handler()
queue.complete(queue.claim(), handler)                 # E0001 done
clock.advance(1)
queue.fail(queue.claim(), "invalid_payload", permanent=True)   # E0002 dead
clock.advance(1)
queue.fail(queue.claim())                              # E0003 retried ...
clock.advance(5)
lease = queue.claim()                                  # E0004 first (due earlier)
clock.advance(3)                                       # ... and E0003 due again
third = queue.claim()
assert third.event_id == "E0003" and third.generation == 2, third
queue.complete(third, handler)                         # E0003 done, generation 2
queue.enqueue_jsonl('{"event_id": "E0005", "payload": {"category": "bag", "amount_cents": 700}}')
assert lease.event_id == "E0004" and queue.status().states == {
    "ready": 1, "leased": 1, "done": 2, "dead": 1}, queue.status()
# That release's status() read through a read-only connection, which leaves an
# empty -wal and -shm behind; the last connection that may write removes them.
import sqlite3
last = sqlite3.connect(sys.argv[1])
last.execute('SELECT count(*) FROM sqlite_master').fetchone()
last.close()
"""


def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        for commit, what in previous_engine.ENGINES.items():
            engine = previous_engine.export(commit, Path(folder))
            target = HERE / f"schema1-{commit}.sqlite3"
            target.unlink(missing_ok=True)
            previous_engine.run(engine, SCRIPT, str(target))
            print(f"wrote {target.name} ({what}, {target.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
