"""The processes of ``scale.py``: a worker, a client of raw commits, a pruner.

Each is a real OS process (``Process`` starts this file with a role) that
opens its queue or its table, answers ``ready`` on stdout, waits for ``go``
on stdin (so Python's start-up is never timed), does its work and answers
one JSON line. The worker is the package's own loop, ``drain``, one message
per transaction (its ACK claims the next due message); it stops when nothing
is due.

Claim to ACK: in ``drain`` each ACK commits in the transaction that claims
the next message, and ``on_outcome`` is called right after that commit, so
the time between two outcomes of one worker is the time from the claim of
the second message to its ACK. The first message of a worker (claimed on
its own) is not counted. Times are kept in a histogram of 2 % wide buckets,
merged across workers by adding counts.

Memory: the worker reports its peak resident set (``VmHWM``; see
``peak_rss_mb`` for why not ``ru_maxrss``), its resident set before the
loop, after it while ``drain``'s returned list of outcomes is still held,
and after that list is dropped, so what the list costs per message is
measured, not guessed.
"""

from __future__ import annotations

import json
import math
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout: the package sits next to us
    sys.path.insert(0, str(ROOT))

BUCKET = math.log(1.02)  # histogram buckets 2 % wide


def bucket_of(seconds: float) -> int:
    return int(math.log(max(seconds, 1e-6) * 1e6) / BUCKET)


def quantile(histogram: dict[int, int], q: float) -> float:
    """The ``q`` quantile, in seconds, of a merged histogram (the bucket's middle)."""
    total = sum(histogram.values())
    if not total:
        return float("nan")
    seen, wanted = 0, q * total
    for key in sorted(histogram):
        seen += histogram[key]
        if seen >= wanted:
            return math.exp((key + 0.5) * BUCKET) / 1e6
    return math.exp((max(histogram) + 0.5) * BUCKET) / 1e6


def rss_now_mb() -> float:
    """The resident set of this process now (``VmRSS``), in MB."""
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def peak_rss_mb() -> float:
    """The peak resident set of this process image (``VmHWM``), in MB.

    Not ``ru_maxrss``: Linux carries the peak of the image an ``exec``
    replaces into it, and ``subprocess`` starts a child by ``vfork`` and
    ``exec``, so a worker's ``ru_maxrss`` starts at its parent's peak (here
    the main process's, which has held a whole audit snapshot).
    """
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def inherited_rss_mb() -> float:
    """``ru_maxrss`` as the kernel reports it (see ``peak_rss_mb``), to show the difference."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _handshake() -> None:
    print(json.dumps({"ready": True}), flush=True)
    if sys.stdin.readline().strip() != "go":
        raise SystemExit(0)


def work(db: str) -> dict[str, Any]:
    """Drain ``db`` with the package's worker loop; the outcomes by kind, the
    money of the effects, claim-to-ACK times and memory."""
    from queue_core import Handler, Queue, drain

    queue = Queue(db)
    handler = Handler()
    histogram: dict[int, int] = {}
    kinds: dict[str, int] = {}
    money = 0
    last = [0.0]

    def seen(outcome: Any) -> None:
        nonlocal money
        now = time.perf_counter()
        if last[0]:
            key = bucket_of(now - last[0])
            histogram[key] = histogram.get(key, 0) + 1
        last[0] = now
        kinds[outcome.kind] = kinds.get(outcome.kind, 0) + 1
        if outcome.effect is not None:
            money += outcome.effect.amount_cents

    with queue.session():  # connected before ``go``: the loop's session reuses it
        before = rss_now_mb()
        _handshake()
        started = time.perf_counter()
        outcomes = drain(queue, handler, on_outcome=seen)
        ended = last[0] or time.perf_counter()
    holding = rss_now_mb()
    held = len(outcomes)
    del outcomes
    return {"kinds": kinds, "money": money, "histogram": histogram,
            "started": started, "ended": ended, "seconds": ended - started,
            "rss_before_mb": before, "rss_holding_mb": holding, "rss_after_mb": rss_now_mb(),
            "peak_rss_mb": peak_rss_mb(), "ru_maxrss_mb": inherited_rss_mb(),
            "outcomes_held": held}


def raw(db: str, seconds: float) -> dict[str, Any]:
    """Single-row commits for ``seconds``, each fsynced as an ACK is: SQLite
    ``BEGIN IMMEDIATE`` at ``synchronous=FULL`` (the queue's own connection
    and transaction helper), PostgreSQL ``synchronous_commit = on``: the
    package's ``queue_core.lab.speed.rawcommits``, which notebook 10 times too."""
    from queue_core.lab.speed.rawcommits import committer

    once, close = committer(db)
    _handshake()
    count, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        once()
        count += 1
    elapsed = time.perf_counter() - started
    close()
    return {"commits": count, "seconds": elapsed}


def prune(db: str, retention: int, vacuum_every: int = 0) -> dict[str, Any]:
    """``prune(retention)`` in a loop until stdin closes; a call that pruned
    nothing waits 0.2 s. Answers what it pruned and its longest batch.

    ``vacuum_every`` (PostgreSQL, a trial, not what the package does): after
    each call that brings the messages pruned since the last vacuum to at
    least this many, ``VACUUM messages`` on a connection of its own."""
    from queue_core import Queue

    queue = Queue(db)
    halt = threading.Event()
    totals = {"messages": 0, "calls": 0, "longest_s": 0.0, "vacuums": 0, "vacuum_s": 0.0}
    since = 0
    _handshake()
    threading.Thread(target=lambda: (sys.stdin.read(), halt.set()), daemon=True).start()
    with queue.session():
        while not halt.is_set():
            done = queue.prune(retention)
            totals["calls"] += 1
            totals["messages"] += done.messages
            totals["longest_s"] = max(totals["longest_s"], done.longest_batch_seconds)
            since += done.messages
            if vacuum_every and since >= vacuum_every:
                totals["vacuum_s"] += _vacuum(db)
                totals["vacuums"] += 1
                since = 0
            if not done.messages:
                halt.wait(0.2)
    totals["peak_rss_mb"] = peak_rss_mb()
    return totals


def _vacuum(db: str) -> float:
    import psycopg

    started = time.perf_counter()
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("VACUUM messages")
    return time.perf_counter() - started


class Process:
    """One process of this file in ``role``, started now, told ``go`` later."""

    def __init__(self, role: str, *args: Any, keep_stderr: bool = False) -> None:
        """``keep_stderr``: keep what the process says on stderr, to tell why it
        ended (a process that says much must not be given a pipe nobody reads)."""
        self.proc = subprocess.Popen([sys.executable, __file__, role, *map(str, args)],
                                     text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE if keep_stderr else None,
                                     env={**os.environ, "PYTHONHASHSEED": "0"})
        self._answer("ready")

    def ended(self) -> bool:
        return self.proc.poll() is not None

    def last_words(self) -> str:
        """The last line an ended process wrote on stderr (``keep_stderr``)."""
        if self.proc.stderr is None:
            return ""
        lines = self.proc.stderr.read().strip().splitlines()
        return lines[-1] if lines else ""

    def _answer(self, what: str) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"a {what} answer was due; the process ended with "
                               f"{self.proc.wait()}")
        return dict(json.loads(line))

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def result(self, close_stdin: bool = False) -> dict[str, Any]:
        """Its one answer (``close_stdin``: first tell it to stop, as the pruner needs)."""
        if close_stdin and self.proc.stdin is not None:
            self.proc.stdin.close()
        answer = self._answer("result")
        self.proc.wait(timeout=60)
        return answer

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def start_all(role: str, count: int, *args: Any) -> list[Process]:
    """``count`` processes, each ready; then every one told ``go`` at once."""
    procs = [Process(role, *args) for _ in range(count)]
    for proc in procs:
        proc.go()
    return procs


def main(argv: list[str]) -> int:
    role, *args = argv
    if role == "work":
        answer = work(args[0])
    elif role == "raw":
        answer = raw(args[0], float(args[1]))
    elif role == "prune":
        answer = prune(args[0], int(args[1]), int(args[2]) if args[2:] else 0)
    else:
        raise SystemExit(f"unknown role {role!r}")
    print(json.dumps(answer), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
