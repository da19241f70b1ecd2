"""Our worker process for ``bench.py``, and the handle that drives it.

Run as a script with ``--worker``, this file is the worker: a long-lived
process that takes commands on stdin, so that a slice measures processing,
not Python start-up. Every consuming command goes through the worker loop's
entry point, ``drain``, except ``batch``, which speaks the batch API itself.
"""

from __future__ import annotations

import json
import resource
import time
from contextlib import ExitStack
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout: the package sits next to us
    sys.path.insert(0, str(ROOT))


def worker_main() -> None:
    """Serve commands from stdin, one JSON object a line, one reply a line.

    ``drain``: ``drain`` with ``batch_size=k`` (k=1 is the single-message
    path) until nothing is due; ``take``: ``drain`` one message at a time,
    at most ``n`` (its last ACK claims nothing more); ``batch``: ``claim_batch(k)`` + ``complete_batch``
    until nothing is due. Each reply counts the outcomes by kind, and the
    fsync + fdatasync calls the slow-disk shim counted meanwhile (``None``
    where the shim is not loaded). ``prune_start`` starts a thread that calls
    ``Queue.prune(0)`` on its own connection every ``PRUNE_EVERY_S`` while the
    consumers run; ``prune_count`` answers how many it pruned so far;
    ``prune_stop`` stops it, prunes once more (what the
    consumers finished last) and answers what it did (``Pruner.totals``).
    """
    from queue_core import Handler, Queue
    from queue_core.lab.speed.slowdisk import flush_calls

    queues: dict[tuple[str, str], Queue] = {}
    sessions = ExitStack()  # one connection per queue for the whole run, as a worker keeps it
    handler = Handler()
    pruner: Pruner | None = None
    for line in sys.stdin:
        cmd = json.loads(line)
        key = (cmd.get("db", ""), cmd.get("sync", "FULL"))
        reply: dict[str, Any] = {}
        if cmd["op"] == "open":
            queues[key] = Queue(key[0], synchronous=key[1])
            sessions.enter_context(queues[key].session())
        elif cmd["op"] == "prune_start":
            pruner = Pruner(Queue(cmd["db"]))
        elif cmd["op"] == "prune_count":  # the thread goes on
            assert pruner is not None
            reply = {"messages": pruner.messages}
        elif cmd["op"] == "prune_stop":
            assert pruner is not None
            reply = pruner.stop()
            pruner = None
        elif cmd["op"] == "rss":
            reply = {"rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
        else:
            before = flush_calls()
            reply = {"kinds": _work(queues[key], handler, cmd)}
            after = flush_calls()
            reply["flushes"] = None if before is None or after is None else after - before
        print(json.dumps(reply), flush=True)
    sessions.close()


# The pause from the end of one of the pruner's calls to the start of the next. Each
# call then prunes what finished since the last: about 80 messages, two batches,
# beside a worker at 4,000 a second. Called again the moment the last returned, it
# pruned one or two messages per transaction, each taking the write lock and, with
# it, the worker's page cache (SQLite drops a connection's cache once another has
# written): the worker kept 0.6 of its rate, a cost of pruning every message the
# moment it is done, which no retention asks for.
PRUNE_EVERY_S = 0.02


class Pruner:
    """A thread of the pruning process: ``prune(0)`` every ``PRUNE_EVERY_S``,
    beside the consumers.

    Each call prunes every done message finished by now, in transactions of
    ``PRUNE_BATCH``. ``longest`` is the longest batch transaction, from ``BEGIN IMMEDIATE`` to
    its commit: beside running consumers that includes waiting for the write
    lock, so it is an upper bound of the hold.
    """

    def __init__(self, queue: Any) -> None:
        import threading

        self.queue, self.halt = queue, threading.Event()
        self.messages = self.batches = self.calls = 0
        self.longest, self.kept = 0.0, 0
        self.started = time.perf_counter()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _once(self) -> int:
        done = self.queue.prune(0)
        self.calls += 1
        self.messages += done.messages
        self.batches += done.batches
        self.kept = len(done.kept)
        self.longest = max(self.longest, done.longest_batch_seconds)
        return int(done.messages)

    def _loop(self) -> None:
        with self.queue.session():
            while not self.halt.is_set():
                self._once()
                self.halt.wait(PRUNE_EVERY_S)

    def stop(self) -> dict[str, Any]:
        self.halt.set()
        self.thread.join()
        during, seconds = self.messages, time.perf_counter() - self.started
        self._once()  # what the consumers finished after the last call
        return {"during": during, "messages": self.messages, "batches": self.batches,
                "calls": self.calls, "longest_s": self.longest, "kept": self.kept,
                "seconds": seconds}


def _work(queue: Any, handler: Any, cmd: dict[str, Any]) -> dict[str, int]:
    from queue_core import drain

    kinds: dict[str, int] = {}

    def count(kind: str) -> None:
        kinds[kind] = kinds.get(kind, 0) + 1
    if cmd["op"] == "drain":
        for outcome in drain(queue, handler, batch_size=cmd["k"]):
            count(outcome.kind)
    elif cmd["op"] == "take":
        for outcome in drain(queue, handler, max_messages=cmd["n"]):
            count(outcome.kind)
    else:
        with queue.session():
            while leases := queue.claim_batch(cmd["k"]):
                for result in queue.complete_batch(leases, handler):
                    count("done" if type(result).__name__ == "Effect" else type(result).__name__)
    return kinds


class Worker:
    """A worker process of ``script`` (this file by default), run with ``--worker``
    and driven through its stdin and stdout, one JSON object a line each way."""

    def __init__(self, script: str | Path = __file__) -> None:
        self.proc = subprocess.Popen([sys.executable, str(script), "--worker"], text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def send(self, **cmd: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()

    def reply(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"worker process ended with {self.proc.wait()}")
        return dict(json.loads(line))

    def call(self, **cmd: Any) -> dict[str, Any]:
        """``send``, then wait for the ``reply``."""
        self.send(**cmd)
        return self.reply()

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=30)


if __name__ == "__main__" and sys.argv[1:] == ["--worker"]:
    worker_main()
