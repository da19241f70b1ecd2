"""Count the fsyncs one message costs, where the machine can count them.

    python benchmarks/fsyncs.py        # prints fsyncs per message, or why not

A worker process drains ``MESSAGES`` messages one at a time (``drain``, the
worker loop) under ``strace -f -c -e trace=fsync,fdatasync``, once at the default durability
(claims commit without an fsync of their own) and once with
``fsync_claims=True``. The enqueue happens before, in this process, so only
the worker's calls are counted. Without strace (or where ptrace is not
allowed) the count is ``None`` and the reason is printed instead.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout: the package sits next to us
    sys.path.insert(0, str(ROOT))

from queue_core import Queue  # noqa: E402

MESSAGES = 200
WORKER = """
import sys
from queue_core import Handler, Queue, drain
drain(Queue(sys.argv[1], fsync_claims=sys.argv[2] == "1"), Handler())
"""


def count(fsync_claims: bool, messages: int = MESSAGES) -> float | None:
    """fsync + fdatasync calls per message of a worker process, or ``None``."""
    strace = shutil.which("strace")
    if strace is None:
        return None
    with tempfile.TemporaryDirectory(prefix="queue-fsyncs-") as tmp:
        db, summary = Path(tmp) / "q.sqlite3", Path(tmp) / "strace.txt"
        queue = Queue(db)
        queue.enqueue_jsonl("".join(
            json.dumps({"event_id": f"E{i:04d}",
                        "payload": {"category": "book", "amount_cents": 100 + i}}) + "\n"
            for i in range(1, messages + 1)))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
        traced = subprocess.run(
            [strace, "-f", "-c", "-e", "trace=fsync,fdatasync", "-o", str(summary),
             sys.executable, "-c", WORKER, str(db), "1" if fsync_claims else "0"],
            capture_output=True, text=True, env=env, check=False)
        if traced.returncode != 0 or not summary.exists():
            return None
        if queue.status().states["done"] != messages or queue.audit():
            raise RuntimeError("the counted worker did not finish every message exactly once")
        return _calls(summary.read_text()) / messages


def _calls(summary: str) -> int:
    """The ``calls`` column summed over fsync and fdatasync in ``strace -c`` output."""
    total = 0
    for line in summary.splitlines():
        fields = line.split()
        if fields and fields[-1] in ("fsync", "fdatasync"):
            total += int(fields[3])  # % time, seconds, usecs/call, calls, [errors,] syscall
    return total


def main() -> int:
    default, all_full = count(False), count(True)
    if default is None or all_full is None:
        print("fsyncs per message: not counted here (strace is missing or not allowed)")
        return 0
    print(f"fsyncs per message: {default:.2f} at the default (claims without their own fsync), "
          f"{all_full:.2f} with fsync_claims=True")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
