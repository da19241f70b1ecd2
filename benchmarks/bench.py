"""Throughput of queue_core against the SQLite commit limit, measured in one run.

    python benchmarks/bench.py            # make bench: the full run, 1-2 minutes
    python benchmarks/bench.py --quick    # a small run (the notebook uses it)

The disk under this machine switches between fsync regimes that differ about
tenfold for tens of seconds, so an absolute rate means little and two rates
from different minutes mean nothing. Every case therefore runs in short
slices, round-robin, in one process tree, on one file system, with the same
pragmas (WAL, ``synchronous=FULL``); each figure is the median of its
slices, and only ratios between figures of this run are compared to targets.

Cases: the limit (a raw single-row ``BEGIN IMMEDIATE ... COMMIT``);
end to end (enqueue, claim, complete) per message with 1 and 2 real worker
processes; batched claim/complete at K = 1, 10, 100; the consume rate with
1,000, 10,000 and 100,000 messages queued; and, labelled as an explicit
trade, single-message mode at ``synchronous=NORMAL``. After every slice the
database is checked: each done event has exactly one effect, no effect
without a done event, the money equals the sum of the payloads. A failed
check makes the exit code 1; a ratio below its target is printed as such.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout: the package sits next to us
    sys.path.insert(0, str(ROOT))

from queue_core import Handler, Queue, drain, process_one  # noqa: E402
from queue_core.storage import connect  # noqa: E402

CATEGORIES = ("book", "pen", "bag")
IDS_PER_FILE = 10_000  # E0000..E9999: the event id shape allows no more
TARGETS = {  # name: (numerator, denominator, minimum ratio); "size_max" is the largest queue
    "single vs raw commit": ("single", "raw", 0.45),
    "K=100 vs single": ("batch_100", "single", 10.0),
    "largest queue vs 1k": ("size_max", "size_1000", 0.8),
    "2 workers vs 1": ("two_workers", "single", 0.8),
}
MEMORY_LIMIT_MB = 150.0


def amount_of(i: int) -> int:
    """The payload amount of the i-th generated event (known, so money can be checked)."""
    return 100 + i % 900


def payload_of(i: int) -> str:
    return json.dumps({"amount_cents": amount_of(i), "category": CATEGORIES[i % 3]})


# -- the worker process -------------------------------------------------------

def worker_main() -> None:
    """Serve commands from stdin, one JSON object a line, one reply a line.

    A long-lived process, so that a slice measures processing, not Python
    start-up. ``drain``: ``worker.drain`` with ``batch_size=k`` (k=1 is the
    single-message path); ``batch``: ``claim_batch(k)`` + ``complete_batch``
    until nothing is due; ``take``: ``n`` single-message claims and ACKs.
    """
    queues: dict[tuple[str, str], Queue] = {}
    handler = Handler()
    for line in sys.stdin:
        cmd = json.loads(line)
        key = (cmd.get("db", ""), cmd.get("sync", "FULL"))
        if cmd["op"] == "open":
            queues[key] = Queue(key[0], synchronous=key[1])
            reply: dict[str, Any] = {}
        elif cmd["op"] == "rss":
            reply = {"rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
        else:
            reply = {"kinds": _work(queues[key], handler, cmd)}
        print(json.dumps(reply), flush=True)


def _work(queue: Queue, handler: Handler, cmd: dict[str, Any]) -> dict[str, int]:
    kinds: dict[str, int] = {}
    if cmd["op"] == "drain":
        for outcome in drain(queue, handler, batch_size=cmd["k"]):
            kinds[outcome.kind] = kinds.get(outcome.kind, 0) + 1
    elif cmd["op"] == "batch":
        with queue.session():
            while leases := queue.claim_batch(cmd["k"]):
                for result in queue.complete_batch(leases, handler):
                    kind = type(result).__name__
                    kinds[kind] = kinds.get(kind, 0) + 1
    else:
        with queue.session():
            for _ in range(cmd["n"]):
                outcome = process_one(queue, handler)
                kind = "nothing_due" if outcome is None else outcome.kind
                kinds[kind] = kinds.get(kind, 0) + 1
    return {"done" if kind == "Effect" else kind: n for kind, n in kinds.items()}


class Worker:
    """A worker process of this file, driven through its stdin and stdout."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, __file__, "--worker"], text=True,
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

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=30)


# -- checks -------------------------------------------------------------------

class CheckFailed(Exception):
    """The database does not show exactly one effect per done event."""


def check_exactly_once(db: Path, done: int, money: int, ready: int = 0) -> None:
    """Raise ``CheckFailed`` unless states, effects, journal and money agree."""
    conn = sqlite3.connect(db)
    try:
        states = dict(conn.execute("SELECT state, count(*) FROM messages GROUP BY state"))
        effects, total = conn.execute("SELECT count(*), coalesce(sum(amount_cents), 0) "
                                      "FROM effects").fetchone()
        orphans = conn.execute("SELECT count(*) FROM effects JOIN messages USING (event_id) "
                               "WHERE state <> 'done'").fetchone()[0]
        paid = conn.execute("SELECT coalesce(sum(json_extract(payload, '$.amount_cents')), 0) "
                            "FROM messages WHERE state = 'done'").fetchone()[0]
        acks = conn.execute("SELECT count(*) FROM transitions WHERE reason = 'completed'"
                            ).fetchone()[0]
    finally:
        conn.close()
    found = (states.get("done", 0), states.get("ready", 0), effects, orphans, total, paid, acks)
    wanted = (done, ready, done, 0, money, money, done)
    if found != wanted or set(states) - {"done", "ready"}:
        raise CheckFailed(f"{db.name}: (done, ready, effects, orphan effects, money, paid, "
                          f"ACKs) = {found}, expected {wanted}; states {states}")


# -- cases --------------------------------------------------------------------

@dataclass(frozen=True)
class Slice:
    """One measured slice: messages, seconds to claim and complete them, and
    seconds including their enqueue (equal when nothing is enqueued)."""

    messages: int
    consume_s: float
    total_s: float


@dataclass
class Case:
    """One measured configuration and its slices.

    ``relative`` holds each slice's consume rate divided by the raw commit
    rate measured just before and just after it, which cancels most of the
    drift of the disk between slices of different cases.
    """

    name: str
    label: str
    slices: list[Slice] = field(default_factory=list)
    relative: list[float] = field(default_factory=list)

    def slice(self) -> Slice:
        raise NotImplementedError

    def rate(self) -> float:
        return statistics.median(s.messages / s.consume_s for s in self.slices)

    def end_to_end(self) -> float:
        return statistics.median(s.messages / s.total_s for s in self.slices)

    def vs_raw(self) -> float:
        return statistics.median(self.relative)


class RawCommits(Case):
    """The limit: one single-row INSERT per ``BEGIN IMMEDIATE ... COMMIT``."""

    def __init__(self, workdir: Path, n: int) -> None:
        super().__init__("raw", "raw single-row commit (the limit)")
        self.conn = connect(workdir / "raw.sqlite3")  # the pragmas the queue uses
        self.conn.execute("PRAGMA journal_mode = WAL")
        self.conn.execute("CREATE TABLE raw (id INTEGER PRIMARY KEY, payload TEXT NOT NULL) STRICT")
        self.n = n

    def slice(self) -> Slice:
        conn, text = self.conn, payload_of(0)
        start = time.perf_counter()
        for _ in range(self.n):
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO raw (payload) VALUES (?)", (text,))
            conn.execute("COMMIT")
        elapsed = time.perf_counter() - start
        return Slice(self.n, elapsed, elapsed)

    def close(self) -> None:
        self.conn.close()


class EndToEnd(Case):
    """Enqueue a JSONL batch, then worker processes claim and complete it all."""

    def __init__(self, name: str, label: str, workdir: Path, n: int, *, op: str,
                 workers: list[Worker], k: int = 1, sync: str = "FULL") -> None:
        super().__init__(name, label)
        self.workdir, self.n, self.op, self.k, self.sync = workdir, n, op, k, sync
        self.workers = workers
        self.files = 0
        self._new_file()

    def _new_file(self) -> None:
        self.files += 1
        self.db = self.workdir / f"{self.name}-{self.files}.sqlite3"
        self.queue = Queue(self.db, synchronous=self.sync)
        self.next_id, self.money = 0, 0
        for worker in self.workers:
            worker.send(op="open", db=str(self.db), sync=self.sync)
            worker.reply()

    def slice(self) -> Slice:
        if self.next_id + self.n > IDS_PER_FILE:
            self._new_file()
        ids = range(self.next_id, self.next_id + self.n)
        texts = ["\n".join(json.dumps({"event_id": f"E{i:04d}", "payload": json.loads(
            payload_of(i))}) for i in ids[start:start + 1000]) for start in range(0, self.n, 1000)]
        start = time.perf_counter()
        for text in texts:
            self.queue.enqueue_jsonl(text)
        enqueued = time.perf_counter()
        for worker in self.workers:
            worker.send(op=self.op, db=str(self.db), sync=self.sync, k=self.k)
        replies = [worker.reply()["kinds"] for worker in self.workers]
        end = time.perf_counter()
        self.next_id += self.n
        self.money += sum(amount_of(i) for i in ids)
        done = sum(reply.get("done", 0) for reply in replies)
        if done != self.n or any(set(reply) - {"done"} for reply in replies):
            raise CheckFailed(f"{self.name}: workers reported {replies} for {self.n} messages")
        check_exactly_once(self.db, self.next_id, self.money)
        return Slice(self.n, end - enqueued, end - start)


class QueueSize(Case):
    """Consume a fixed slice, one message per claim and ACK, from a queue kept at ``size``.

    ``size`` may exceed the 10,000 ids that ``E`` + four digits allow, so the
    fill (not measured) writes ids of six digits with the id-shape CHECK off
    on the filling connection only; the fill writes what ``enqueue`` writes
    (the row and its journal entry). Claim and complete run unchanged: no
    other constraint is switched off, and none of them reads the id's shape.
    """

    def __init__(self, workdir: Path, size: int, n: int, worker: Worker) -> None:
        super().__init__(f"size_{size}", f"single message, {size:,} queued")
        self.db, self.size, self.n = workdir / f"size-{size}.sqlite3", size, n
        Queue(self.db)
        self.next_id = self.consumed = self.money = 0
        self._fill(size)
        self.worker = worker
        self.worker.send(op="open", db=str(self.db), sync="FULL")
        self.worker.reply()

    def _fill(self, count: int) -> None:
        ids = range(self.next_id, self.next_id + count)
        conn = connect(self.db)
        try:
            conn.execute("PRAGMA ignore_check_constraints = ON")
            conn.execute("BEGIN IMMEDIATE")
            due = int(time.time()) - 1
            conn.executemany("INSERT INTO messages (event_id, payload, available_at) "
                             "VALUES (?, ?, ?)", ((f"E{i:06d}", payload_of(i), due) for i in ids))
            conn.executemany("INSERT INTO transitions (at, event_id, from_state, to_state, "
                             "generation, attempts, reason) VALUES (?, ?, NULL, 'ready', 0, 0, "
                             "'enqueued')", ((due, f"E{i:06d}") for i in ids))
            conn.execute("COMMIT")
        finally:
            conn.close()
        self.next_id += count

    def slice(self) -> Slice:
        if self.consumed:
            self._fill(self.n)  # back to ``size`` queued before each measured slice
        start = time.perf_counter()
        self.worker.send(op="take", db=str(self.db), sync="FULL", n=self.n)
        kinds = self.worker.reply()["kinds"]
        elapsed = time.perf_counter() - start
        # FIFO by (available_at, event_id): the slice took the oldest ids
        first = self.consumed
        self.consumed += self.n
        self.money += sum(amount_of(i) for i in range(first, self.consumed))
        if kinds != {"done": self.n}:
            raise CheckFailed(f"{self.name}: worker reported {kinds} for {self.n} messages")
        check_exactly_once(self.db, self.consumed, self.money, ready=self.size - self.n)
        return Slice(self.n, elapsed, elapsed)

    def peak_rss_after_draining(self) -> tuple[int, float]:
        """Drain everything queued (K=100) in a new worker process; return the
        messages this queue has had and the peak RSS of that process."""
        self.worker = Worker()
        self.worker.send(op="open", db=str(self.db), sync="FULL")
        self.worker.reply()
        left = self.next_id - self.consumed
        self.worker.send(op="drain", db=str(self.db), sync="FULL", k=100)
        kinds = self.worker.reply()["kinds"]
        self.money += sum(amount_of(i) for i in range(self.consumed, self.next_id))
        self.consumed = self.next_id
        if kinds != {"done": left}:
            raise CheckFailed(f"{self.name}: drain reported {kinds} for {left} messages")
        check_exactly_once(self.db, self.consumed, self.money)
        self.worker.send(op="rss")
        rss = float(self.worker.reply()["rss_mb"])
        self.worker.close()
        return self.consumed, rss


# -- the run ------------------------------------------------------------------

@dataclass(frozen=True)
class Plan:
    """How much work each slice does, and how many rounds of slices."""

    rounds: int
    budget_s: float  # no new round starts after this many seconds (at least two run)
    raw: int
    single: int
    k10: int
    k100: int
    sizes: tuple[int, ...]
    full: bool  # also 2 workers, single-message drain, NORMAL, and the memory check


FULL = Plan(rounds=12, budget_s=150.0, raw=40, single=100, k10=400, k100=2000,
            sizes=(1_000, 10_000, 100_000), full=True)
QUICK = Plan(rounds=4, budget_s=1.5, raw=10, single=15, k10=80, k100=300,
             sizes=(1_000, 10_000), full=False)


def same_file_system_dir() -> Path:
    """The system temp dir if it is on the repository's file system (not a
    RAM disk), else the benchmarks folder: the files must meet the same disk."""
    tmp = Path(tempfile.gettempdir())
    return tmp if os.stat(tmp).st_dev == os.stat(ROOT).st_dev else ROOT / "benchmarks"


def build_cases(workdir: Path, plan: Plan, pool: list[Worker]) -> Iterator[Case]:
    """The cases; all but the two-worker one share the first worker process."""
    n, one = plan.single, pool[:1]
    if plan.full:
        yield EndToEnd("single", "single message, 1 worker process", workdir, n,
                       op="drain", workers=one)
        yield EndToEnd("two_workers", "single message, 2 worker processes", workdir, n,
                       op="drain", workers=pool[:2])
    for k, count in ((1, n), (10, plan.k10), (100, plan.k100)):
        yield EndToEnd(f"batch_{k}", f"batched claim + complete, K={k}", workdir, count,
                       op="batch", k=k, workers=one)
    for size in plan.sizes:
        yield QueueSize(workdir, size, n, pool[0])
    if plan.full:
        yield EndToEnd("single_normal", "single message, synchronous=NORMAL (option)",
                       workdir, n, op="drain", sync="NORMAL", workers=one)


def run(quick: bool = False, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run every case in interleaved slices; return medians, ratios and memory.

    Each round runs every case once (the first one rotates), with a slice of
    raw commits between any two slices. Raises ``CheckFailed`` as soon as a
    slice leaves the database without exactly one effect per done event.
    """
    plan = QUICK if quick else FULL
    say = log or (lambda text: None)
    with tempfile.TemporaryDirectory(prefix="queue-bench-", dir=same_file_system_dir()) as tmp:
        raw = RawCommits(Path(tmp), plan.raw)
        pool = [Worker() for _ in range(2 if plan.full else 1)]
        cases: list[Case] = []
        try:
            cases.extend(build_cases(Path(tmp), plan, pool))
            say(f"{len(cases)} cases and the raw limit in {tmp}; {plan.rounds} rounds")
            before = raw.slice()
            raw.slices.append(before)
            started = time.perf_counter()
            for round_no in range(plan.rounds):
                if round_no >= 2 and time.perf_counter() - started > plan.budget_s:
                    break
                turn = round_no % len(cases)
                for case in cases[turn:] + cases[:turn]:
                    measured = case.slice()
                    after = raw.slice()
                    raw.slices.append(after)
                    limit = (_rate(before) + _rate(after)) / 2
                    case.slices.append(measured)
                    case.relative.append(_rate(measured) / limit)
                    before = after
                say(f"round {round_no + 1}/{plan.rounds} done")
            memory = None
            if plan.full:
                largest = max((c for c in cases if isinstance(c, QueueSize)), key=lambda c: c.size)
                memory = largest.peak_rss_after_draining()
        finally:
            raw.close()
            for worker in pool:
                worker.close()
    return summarise(raw, cases, memory)


def _rate(measured: Slice) -> float:
    return measured.messages / measured.consume_s


def summarise(raw: Case, cases: list[Case], memory: tuple[int, float] | None) -> dict[str, Any]:
    """Medians per case and the target ratios, all from this run."""
    vs_raw = {case.name: case.vs_raw() for case in cases}
    vs_raw["raw"] = 1.0
    largest = max(case.size for case in cases if isinstance(case, QueueSize))
    lookup = dict(vs_raw, size_max=vs_raw[f"size_{largest}"])
    ratios = {name.replace("largest queue", f"{largest:,} queued"): (lookup[top] / lookup[bottom],
                                                                    minimum)
              for name, (top, bottom, minimum) in TARGETS.items()
              if top in lookup and bottom in lookup}
    every = [raw, *cases]
    return {
        "rates": {case.name: case.rate() for case in every},
        "end_to_end": {case.name: case.end_to_end() for case in every},
        "vs_raw": vs_raw,
        "labels": {case.name: case.label for case in every},
        "sizes": {case.size: case.name for case in cases if isinstance(case, QueueSize)},
        "ratios": ratios,
        "slices": sum(len(case.slices) for case in cases),
        "memory": memory,
        "parent_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def report(results: dict[str, Any]) -> list[str]:
    """The printed table: medians, ratios against targets, memory, the option."""
    rates, e2e, vs_raw = results["rates"], results["end_to_end"], results["vs_raw"]
    lines = [f"queue_core throughput, SQLite {sqlite3.sqlite_version}, WAL, synchronous=FULL "
             "unless named; medians of interleaved slices",
             "msgs/s = claim + complete; with enqueue = the same slice including the "
             "enqueue of its JSONL batch; x raw = against the raw commits right around it",
             f"{'case':<46}{'msgs/s':>8}{'with enqueue':>14}{'x raw':>8}"]
    for name, rate in rates.items():
        lines.append(f"{results['labels'][name]:<46}{rate:>8.0f}{e2e[name]:>14.0f}"
                     f"{vs_raw[name]:>8.2f}")
    lines.append("ratios measured in this run, against their targets:")
    for name, (value, minimum) in results["ratios"].items():
        verdict = "ok" if value >= minimum else "BELOW TARGET"
        lines.append(f"  {name:<24}{value:>7.2f}   target >= {minimum:<5g} {verdict}")
    if results["memory"] is not None:
        messages, mb = results["memory"]
        verdict = "ok" if mb < MEMORY_LIMIT_MB else "ABOVE LIMIT"
        lines.append(f"peak RSS of the worker process that claimed and completed all "
                     f"{messages:,} messages of the largest queue: {mb:.0f} MB "
                     f"(limit {MEMORY_LIMIT_MB:.0f} MB) {verdict}")
        lines.append(f"peak RSS of this process (it filled the queues): "
                     f"{results['parent_rss_mb']:.0f} MB")
    lines.append(f"exactly-once: checked after each of {results['slices']} slices "
                 "(one effect per done event, no other effect, money = sum of payloads)")
    if "single_normal" not in vs_raw:
        return lines
    normal = vs_raw["single_normal"] / vs_raw["single"]
    lines.append(f"explicit option, not the default: synchronous=NORMAL runs {normal:.1f}x "
                 "FULL here; in WAL mode it skips the fsync at each commit, so a power loss "
                 "(not a process crash) may lose the last commits")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a small run (a few seconds)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker_main()
        return 0
    try:
        results = run(quick=args.quick, log=lambda text: print(text, file=sys.stderr))
    except CheckFailed as exc:
        print(f"EXACTLY-ONCE CHECK FAILED: {exc}")
        return 1
    print("\n".join(report(results)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
