"""The queue at scale: many events, several worker processes, prune beside them.

    python benchmarks/scale.py                # make scale: PostgreSQL 1,000,000, SQLite 200,000
    python benchmarks/scale.py --scale small  # make scale SCALE=small: a tenth
    python benchmarks/scale.py --ci           # the small form; only the audit decides the exit

On each store one ``general`` queue (ids are UUIDs, as real sources send)
takes its events in phases, one per worker count (PostgreSQL 1, 2, 4 and 8
worker processes, SQLite 1, 2 and 4). A phase's events are enqueued first
(not timed); then that many worker processes (``scale_worker.py``: the
package's ``drain`` in a process of its own) process them until nothing is
due, while a pruning process runs ``prune`` on a short retention beside them
for the whole run. Each phase's rate is divided by the rate of raw
single-row commits from the same number of client processes, measured just
before and just after it, on the same store. A control queue runs without
prune (2 workers, in a few chunks), for its rate and its bytes per event.

Durability: every commit here is durable as the queue's callers are told:
the workers' ACKs (SQLite ``synchronous=FULL``; PostgreSQL
``synchronous_commit = on``) and the raw commits alike. The commits
without an fsync of their own are SQLite's claims and prune's transactions,
as the package makes them (``Queue.claim_batch`` and ``queue_core.retention``
say why that loses nothing a caller was told); on PostgreSQL every claim
waits for the flush too.

Checks: after each phase, the workers' outcomes (every one ``done``, their
count and money) and the queue's stored counts; at the end the audit over
the whole queue (``queue_core.audit``: one effect per done event, money
exact, the journal or its compacted record consistent) and nothing ready,
leased or dead. Any of these failing exits 1. A figure beside its target is
printed with a verdict; a missed target exits 0 (a benchmark reports),
except with ``--strict``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # the helpers live next to this file
    sys.path.insert(0, str(HERE))

import scale_probe as probe  # noqa: E402
from scale_worker import Process, quantile, start_all  # noqa: E402

from queue_core import Queue, audit  # noqa: E402
from queue_core.lab.speed.scaling import busy_share, cpu_ticks  # noqa: E402
from queue_core.sqlite import is_connection_string  # noqa: E402

CATEGORIES = ("book", "pen", "bag")
FILL_BATCH = 1000  # events per enqueue commit: the batch limit of a JSONL file
_IDS = uuid.UUID("6f1c8d52-0000-4000-8000-000000000000")


@dataclass(frozen=True)
class Plan:
    """How many events each store takes, through which worker counts."""

    pg_events: int
    pg_workers: tuple[int, ...]
    sqlite_events: int
    sqlite_workers: tuple[int, ...]
    control: int  # events of each store's control queue (no prune), in 3 chunks
    retention_s: int  # prune's older_than, in seconds
    raw_s: float  # each raw-commit slice
    sample_s: float  # sizes and the claim's work, every this many seconds
    postgres: bool = True
    sqlite: bool = True
    # A trial, not what the package does: the pruner also runs VACUUM messages on
    # PostgreSQL after every this many messages pruned (0: never; autovacuum only).
    vacuum_every: int = 0
    # The private server's autovacuum_naptime, in seconds, set as README advises for a
    # server that serves a busy queue (0: PostgreSQL's default, a minute). The schema's
    # storage parameters say when ``messages`` needs a vacuum; the naptime is how often
    # autovacuum looks. A server that ``QUEUE_CORE_PG_DSN`` names keeps its own
    # (``naptime_of``: the report gives the one it had).
    naptime: int = 1


FULL = Plan(pg_events=1_000_000, pg_workers=(1, 2, 4, 8), sqlite_events=200_000,
            sqlite_workers=(1, 2, 4), control=12_000, retention_s=3, raw_s=2.0, sample_s=10.0)
SMALL = replace(FULL, pg_events=100_000, sqlite_events=20_000, control=3_000, retention_s=3,
                raw_s=2.0, sample_s=2.0)
TINY = replace(FULL, pg_events=300, pg_workers=(1, 2), sqlite_events=300, sqlite_workers=(1, 2),
               control=150, retention_s=1, raw_s=0.3, sample_s=0.5)
PLANS = {"full": FULL, "small": SMALL, "tiny": TINY}


class CheckFailed(Exception):
    """A phase or the final audit found a message not processed exactly once."""


def event_id(i: int) -> str:
    return str(uuid.uuid5(_IDS, str(i)))


def amount_of(i: int) -> int:
    return 100 + i % 900


def money_of(first: int, count: int) -> int:
    return sum(amount_of(i) for i in range(first, first + count))


def jsonl(first: int, count: int) -> str:
    return "\n".join(f'{{"event_id": "{event_id(i)}", "payload": {{"amount_cents": '
                     f'{amount_of(i)}, "category": "{CATEGORIES[i % 3]}"}}}}'
                     for i in range(first, first + count))


def shares(total: int, workers: tuple[int, ...]) -> list[int]:
    """Each phase's events: in proportion to its worker count (more workers, more
    work: a phase long enough to reach its pace), the rest to the last."""
    weight = sum(workers)
    counts = [total * n // weight for n in workers]
    counts[-1] += total - sum(counts)
    return counts


class Run:
    """One store's run: its queue, the pruner beside it, its phases and samples."""

    def __init__(self, store: str, db: str, raw_db: str, plan: Plan,
                 say: Callable[[str], None], prune: bool = True) -> None:
        self.store, self.db, self.raw_db, self.plan, self.say = store, db, raw_db, plan, say
        self.queue = Queue(db, ids="general")
        self.next_id = 0
        self.started = time.perf_counter()
        self.samples: list[dict[str, Any]] = []
        self.phases: list[dict[str, Any]] = []
        vacuum = plan.vacuum_every if is_connection_string(db) else 0
        self.pruner = (Process("prune", db, plan.retention_s, vacuum, keep_stderr=True)
                       if prune else None)
        if self.pruner is not None:
            self.pruner.go()
        self.sample(0, settled=True)  # the empty queue's size

    def fill(self, count: int) -> float:
        """Enqueue ``count`` new events, ``FILL_BATCH`` a commit; the seconds it took."""
        started = time.perf_counter()
        with self.queue.session():
            for first in range(self.next_id, self.next_id + count, FILL_BATCH):
                self.queue.enqueue_jsonl(jsonl(first, min(FILL_BATCH,
                                                          self.next_id + count - first)))
        return time.perf_counter() - started

    def raw_rate(self, clients: int) -> float:
        answers = [proc.result() for proc in start_all("raw", clients, self.raw_db,
                                                        self.plan.raw_s)]
        return sum(a["commits"] for a in answers) / statistics.mean(a["seconds"] for a in answers)

    def sample(self, phase: int, settled: bool = False) -> None:
        """Sizes and the claim's work now (``settled``: nothing done is left unpruned)."""
        status = self.queue.status()
        done = status.states["done"]
        self.samples.append({"t": time.perf_counter() - self.started, "phase": phase,
                             "settled": settled, "done": done, "ready": status.states["ready"],
                             "pruned": status.pruned, **probe.sizes(self.db),
                             **{f"claim_{k}": v for k, v in
                                probe.claim_work(self.db, int(time.time())).items()},
                             **(probe.pg_vacuum_state(self.db) if is_connection_string(self.db) else {})})

    def phase(self, workers: int, count: int) -> dict[str, Any]:
        """Fill, then ``workers`` processes drain it; raw commits before and after.
        Raises ``CheckFailed`` unless every event was done once, its money exact."""
        first = self.next_id
        fill_s = self.fill(count)
        self.next_id += count
        before = self.raw_rate(workers)
        self.sample(len(self.phases))
        cpu = cpu_ticks()
        answers = self._drain(workers)
        busy = busy_share(cpu, cpu_ticks()) or 0.0  # no /proc/stat: reported as 0 % busy
        after = self.raw_rate(workers)
        self.wait_for_prune()
        self.sample(len(self.phases), settled=True)
        found = self._check_phase(answers, first, count)
        # perf_counter is the system's monotonic clock: the workers' readings compare
        span = max(a["ended"] for a in answers) - min(a["started"] for a in answers)
        rate = count / span
        result = {"workers": workers, "events": count, "fill_s": fill_s, "seconds": span,
                  "rate": rate, "raw_before": before, "raw_after": after,
                  "vs_raw": rate / ((before + after) / 2), "cpu_busy": busy,
                  **_latency(answers), **_memory(answers), **found}
        self.phases.append(result)
        self.say(f"{self.store}: {workers} worker(s), {count:,} events in {span:.1f} s: "
                 f"{rate:,.0f}/s, {result['vs_raw']:.2f} of raw commits; claim to ACK "
                 f"p50 {result['p50_s'] * 1e3:.1f} ms, p99 {result['p99_s'] * 1e3:.1f} ms")
        return result

    def _drain(self, workers: int) -> list[dict[str, Any]]:
        """Start ``workers`` processes, sample every ``sample_s`` until each has
        answered; their answers."""
        procs = start_all("work", workers, self.db)
        answers: list[dict[str, Any]] = [{} for _ in procs]
        readers = [threading.Thread(target=lambda i=i: answers.__setitem__(i, procs[i].result()))
                   for i in range(len(procs))]
        for reader in readers:
            reader.start()
        while any(reader.is_alive() for reader in readers):
            for reader in readers:
                reader.join(timeout=self.plan.sample_s / len(readers))
            if any(reader.is_alive() for reader in readers):
                self.sample(len(self.phases))
        return answers

    def _check_phase(self, answers: list[dict[str, Any]], first: int,
                     count: int) -> dict[str, Any]:
        kinds: dict[str, int] = {}
        for answer in answers:
            for kind, n in answer["kinds"].items():
                kinds[kind] = kinds.get(kind, 0) + n
        money = sum(a["money"] for a in answers)
        status = self.queue.status()
        wanted = {"done": self.next_id, "ready": 0, "leased": 0, "dead": 0}
        if kinds != {"done": count} or money != money_of(first, count) \
                or dict(status.states) != wanted or status.effects != self.next_id \
                or status.total != money_of(0, self.next_id):
            raise CheckFailed(f"{self.store}: workers reported {kinds} and money {money} for "
                              f"{count} events worth {money_of(first, count)}; the queue holds "
                              f"{dict(status.states)}, {status.effects} effects, money "
                              f"{status.total} (wanted {wanted}, {money_of(0, self.next_id)})")
        return {"kinds": kinds}

    def wait_for_prune(self) -> None:
        """Wait until the pruner has pruned every message done by now (at most
        the retention and 30 s more); without a pruner, return at once. The
        message that owns the journal's last row waits for a later prune (a
        journal number is never reused: ``retention``), so one stays whole."""
        deadline = time.perf_counter() + self.plan.retention_s + 30
        while self.pruner is not None and not self.pruner.ended() \
                and time.perf_counter() < deadline:
            if self.queue.status().pruned >= self.next_id - 1:
                return
            time.sleep(0.25)

    def stop_pruner(self) -> dict[str, Any]:
        """Stop the pruner; what it did, or ``{"died": its last words}`` if it
        ended before it was told to (the queue is then still audited whole)."""
        pruner, self.pruner = self.pruner, None
        if pruner is None:
            return {}
        if not pruner.ended():
            try:
                return pruner.result(close_stdin=True)
            except RuntimeError:  # it ended meanwhile, without an answer
                pass
        return {"died": pruner.last_words(), "messages": self.queue.status().pruned}

    def audit(self) -> dict[str, Any]:
        """The audit over the whole queue; raises ``CheckFailed`` unless it is clean,
        every event done once, its money exact, nothing ready, leased or dead."""
        started = time.perf_counter()
        snap = audit.snapshot(self.db)
        problems = [str(finding) for finding in audit.check(snap)]
        states = dict(snap.status.states)
        wanted = {"done": self.next_id, "ready": 0, "leased": 0, "dead": 0}
        verdict = {"events": self.next_id, "states": states, "effects": len(snap.effect_rows),
                   "money": snap.money, "money_wanted": money_of(0, self.next_id),
                   "pruned": snap.status.pruned, "findings": problems[:5],
                   "seconds": time.perf_counter() - started}
        if problems or states != wanted or verdict["effects"] != self.next_id \
                or snap.money != verdict["money_wanted"]:
            raise CheckFailed(f"{self.store} audit: {verdict}")
        return verdict

    def close(self) -> None:
        if self.pruner is not None:
            self.pruner.kill()


def _latency(answers: list[dict[str, Any]]) -> dict[str, float]:
    """Claim to ACK over every worker of a phase: their histograms added."""
    histogram: dict[int, int] = {}
    for answer in answers:
        for key, n in answer["histogram"].items():
            histogram[int(key)] = histogram.get(int(key), 0) + n
    return {"p50_s": quantile(histogram, 0.5), "p99_s": quantile(histogram, 0.99)}


def _memory(answers: list[dict[str, Any]]) -> dict[str, float]:
    """The largest of each memory figure among a phase's workers (``scale_worker``)."""
    keys = ("peak_rss_mb", "rss_before_mb", "rss_holding_mb", "rss_after_mb", "ru_maxrss_mb")
    found = {key: max(a[key] for a in answers) for key in keys}
    return {**found, "most_held": max(a["outcomes_held"] for a in answers)}


def run_store(store: str, db: str, control_db: str, raw_db: str, plan: Plan,
              say: Callable[[str], None]) -> dict[str, Any]:
    """One store: the phases with prune beside them, then the control queue."""
    probe.prepare_raw(raw_db)
    events, workers = ((plan.pg_events, plan.pg_workers) if store == "postgres"
                       else (plan.sqlite_events, plan.sqlite_workers))
    found: dict[str, Any] = {"store": store}
    main = Run(store, db, raw_db, plan, say)
    try:
        for n, count in zip(workers, shares(events, workers)):
            main.phase(n, count)
        found["prune"] = main.stop_pruner()
        if is_connection_string(db):  # what a vacuum does to the claim's reads, now nothing is ready
            found["vacuum_test"] = probe.vacuum_test(db, int(time.time()))
        found["relations"] = probe.relations(db)
        say(f"{store}: the audit over {main.next_id:,} events")
        found["audit"] = main.audit()
    finally:
        main.close()
    found["phases"], found["samples"] = main.phases, main.samples
    control = Run(store, control_db, raw_db, plan, say, prune=False)
    for count in shares(plan.control, (1, 1, 1)):
        control.phase(2, count)
    found["control_audit"] = control.audit()
    found["control_relations"] = probe.relations(control_db)
    found["control"], found["control_samples"] = control.phases, control.samples
    return found


def run(plan: Plan, say: Callable[[str], None], workdir: Path) -> dict[str, Any]:
    """Every store of ``plan``; raises ``CheckFailed`` as soon as a check fails."""
    from queue_core.lab.servers.pgcases import Schemas
    from queue_core.lab.servers.postgres_server import NoPostgres, private_postgres

    results: dict[str, Any] = {"plan": plan.__dict__}
    started = time.perf_counter()
    if plan.sqlite:
        results["sqlite"] = run_store("sqlite", str(workdir / "scale.sqlite3"),
                                      str(workdir / "control.sqlite3"),
                                      str(workdir / "raw.sqlite3"), plan, say)
    if plan.postgres:
        with ExitStack() as stack:
            try:
                server = stack.enter_context(private_postgres())
            except NoPostgres as exc:
                if os.environ.get("QUEUE_CORE_PG_REQUIRED") == "1":  # CI: must be measured
                    raise CheckFailed(f"PostgreSQL is required here: {exc}") from None
                results["postgres_skipped"] = str(exc)
                server = None
            if server is not None:
                results["naptime"] = naptime_of(server, plan)
                schemas = stack.enter_context(Schemas(server, "queue_scale"))
                results["postgres"] = run_store("postgres", schemas.fresh("main"),
                                                schemas.fresh("control"),
                                                schemas.fresh("raw"), plan, say)
    results["seconds"] = time.perf_counter() - started
    return results


def naptime_of(server: str, plan: Plan) -> dict[str, Any]:
    """The server's ``autovacuum_naptime`` for this run, in seconds, and whether this
    run set it: on this run's private server, ``plan.naptime`` (unless 0); a server
    that ``QUEUE_CORE_PG_DSN`` names is another's, never changed (``main`` refuses
    ``--naptime`` for it), and its own is read."""
    import psycopg

    from queue_core.lab.servers.postgres_server import DSN_VARIABLE

    here = bool(plan.naptime) and not os.environ.get(DSN_VARIABLE)
    with psycopg.connect(server, autocommit=True) as conn:
        if here:
            conn.execute(f"ALTER SYSTEM SET autovacuum_naptime = {int(plan.naptime)}")
            conn.execute("SELECT pg_reload_conf()")
            deadline = time.perf_counter() + 10  # the reload is asynchronous
            while conn.execute("SELECT setting::int FROM pg_settings WHERE name = "
                               "'autovacuum_naptime'").fetchone()[0] != plan.naptime \
                    and time.perf_counter() < deadline:
                time.sleep(0.05)
        seconds = conn.execute("SELECT setting::int FROM pg_settings "
                               "WHERE name = 'autovacuum_naptime'").fetchone()[0]
    return {"seconds": int(seconds), "set": here}


def main(argv: list[str] | None = None) -> int:
    from scale_report import picture, report, verdicts

    from queue_core.lab.servers.postgres_server import DSN_VARIABLE

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scale", choices=sorted(PLANS), default="full")
    parser.add_argument("--ci", action="store_true",
                        help="the small form; the exit status depends on the checks only")
    parser.add_argument("--strict", action="store_true", help="a missed target exits 1 too")
    parser.add_argument("--only", choices=("postgres", "sqlite"), help="one store only")
    parser.add_argument("--vacuum-every", type=int, default=0, metavar="N",
                        help="a trial: the pruner runs VACUUM messages on PostgreSQL after "
                             "every N messages pruned (the package never does)")
    parser.add_argument("--naptime", type=int, default=None, metavar="S",
                        help="the private PostgreSQL server's autovacuum_naptime in seconds "
                             "(default 1, as README advises for a busy queue; 0: PostgreSQL's "
                             "own default, 60)")
    parser.add_argument("--png", default=str(HERE.parent / "build" / "scale.png"),
                        help="where the picture goes")
    args = parser.parse_args(argv)
    if args.naptime is not None and os.environ.get(DSN_VARIABLE) and args.only != "sqlite":
        parser.error(f"--naptime sets this run's private PostgreSQL server only: a server "
                     f"that {DSN_VARIABLE} names keeps its own settings (unset it, or drop "
                     "--naptime)")
    plan = replace(SMALL if args.ci else PLANS[args.scale], vacuum_every=args.vacuum_every,
                   naptime=FULL.naptime if args.naptime is None else args.naptime,
                   postgres=args.only != "sqlite", sqlite=args.only != "postgres")

    def say(text: str) -> None:
        print(text, file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory(prefix="queue-scale-") as tmp:
        try:
            results = run(plan, say, Path(tmp))
        except CheckFailed as exc:
            print(f"EXACTLY-ONCE CHECK FAILED: {exc}")
            return 1
    judged = verdicts(results)
    print("\n".join(report(results, judged)))
    print(f"picture: {picture(results, Path(args.png))}")
    figures = Path(args.png).with_suffix(".json")
    figures.write_text(json.dumps(results, indent=1, default=str), encoding="utf-8")
    print(f"every figure and sample: {figures}")
    missed = [name for name, ok in judged.items() if ok is False]
    if args.ci:
        print("CI form: only the exactly-once checks and the audit decide the exit status; "
              "the rates and sizes above depend on the machine and are not judged")
        return 0
    return 1 if args.strict and missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
