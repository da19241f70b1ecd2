"""Throughput of queue_core against raw commits and peer queues, measured in one run.

    python benchmarks/bench.py            # make bench: the full run, a few minutes
    python benchmarks/bench.py --quick    # a small run (the notebook uses it)

The disk under this machine switches between fsync regimes that differ about
tenfold for tens of seconds, so an absolute rate means little and two rates
from different minutes mean nothing. Every case therefore runs in short
slices, round-robin, in one process tree, on one file system, and each
slice is divided by the rate of raw commits of its own store measured just
before and just after it. Each figure is the median of its slices; only
ratios from this run are compared to targets.

The headline is the consumer side, where the protocol lives: the queue is
filled first (not timed), then our claim + ACK through ``drain`` (the
worker loop; effect and ACK in one transaction) is timed against each
peer's get + ack. End to end adds the producer: our single-message case
and every peer put one item per commit, our batched cases enqueue JSONL
batches (the table names each). Durability is compared like for like: each
peer on its own defaults and, where the library lets a caller set it, at
``synchronous=FULL``; our default (every acknowledged commit fsynced) is
compared with the fastest peer that fsyncs every commit, our
``synchronous=NORMAL`` option with the fastest peer at NORMAL.

Two regimes. This machine's flush (a raw commit costs about 0.1-0.2 ms:
the queue is CPU-bound), and a slow disk: the same cases in a child
process tree started with a shim in ``LD_PRELOAD`` that delays every fsync
and fdatasync by 2 ms (``slowsync.c``; ``make bench`` builds it where a C
compiler exists, otherwise the regime is reported as skipped, with the
reason). There one fsync per message is the limit, as on a consumer SSD or
a cloud volume, and the ratio to raw commits is what matters.

Cases: the limit (a raw single-row ``BEGIN IMMEDIATE ... COMMIT``); a bare
two-commit protocol for scale; single messages with 1, 2 and 4 worker
processes; batched claim/complete at K = 1, 10, 100; the consume rate with
1,000, 10,000 and 100,000 messages queued; the NORMAL option; the SQLite
peers (``peers.py``). PostgreSQL (``QUEUE_CORE_PG_DSN`` or a private server,
``queue_core.lab.private_postgres``): its raw commits, ours with 1, 2 and 4
workers at K = 1 and 100, and pgqueuer and procrastinate (``pgpeers.py``) on
the same server.

Beside that bare comparison (a peer's get + ack, no effect), each peer runs
on the same work as ours (``peers.SameWorkCase``): its consumer gets a
message, commits the message's effect in the application's own database
(an effects table keyed by the event id, its own commit, ``INSERT ... ON
CONFLICT DO NOTHING``: ``app_effects.py``), then acks; the SQLite peers at
their settings that fsync every commit, the application's file at
``synchronous=FULL``, the PostgreSQL peers with an effects table in the same
database. Our side of that table is our ordinary worker loop, whose effect
is already in the ACK's transaction. The table says what each peer then
guarantees: at least once with idempotent effects where the message stays
in the queue until the ack, at most once where the library deletes it
before the work runs (huey).
After every slice the store is checked: ours with the shared audit (one
effect per done event, the money right, a legal journal), a peer by the
items it handed back (each once), on PostgreSQL by its own tables, and on
the same work by the application's effects table (one effect per event put,
its amount exact).
``peer_safety.py`` then runs two consumer processes and a crashing
consumer against every queue.

The queue over its lifetime (``bench_retention.py``): a steady load of
events with 2 KB payloads processed in rolling windows, on a file pruned
after every window and on one never pruned (file and ``-wal`` sizes, the
payload and journal bytes window by window, the bytes every pruned event
keeps, read with ``dbstat``, the longest prune transaction to the end of its
commit call); how long a prune keeps the write lock from a probe beside it
that takes and releases the lock in a loop; our single
message with a process running ``prune`` beside the worker, in the same
rounds as the case without it; on PostgreSQL the tables' sizes before a
prune and after it and a ``VACUUM``; and ``migrate`` of a queue that the
previous engine wrote (exported from git history), timed while a worker of
that engine runs on it. Each is checked like the slices: the audit clean,
every state, effect and the money exact.

Priorities (``bench_priority.py``): what they cost the worker loop's step, on
two queues of one store holding the same events, one with each event's
priority 0 to 9 in turn and one with every event at 0, consumed step for step
in turn (the disk changes speed too often for slices side by side), on both
stores; and on a model clock, how long a message of priority 0 waits under a
steady load of priority 9 at the workers' whole rate, against the bound the
engine states for it (``priority.wait_bound``), beside strict priority on the
same arrivals. Both checked: every state, effect and the money exact, the
done messages of each priority as enqueued.

A failed check exits 1; a figure below its target is printed as such and the
exit status stays 0: a benchmark reports.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterator

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # the cases live next to this file
    sys.path.insert(0, str(HERE))

import bench_idcheck  # noqa: E402
import fsyncs  # noqa: E402
from bench_cases import (ROOT, BareProtocol, Case, CheckFailed, EndToEnd,  # noqa: E402
                         PgRawCommits, QueueSize, RawCommits, Schemas, Slice, Worker)
from bench_priority import MIXED, PLAIN, starvation, step_costs  # noqa: E402
from bench_report import evaluate, summarise  # noqa: E402
from bench_retention import (PrunedEndToEnd, ack_pages, migrations, pg_space,  # noqa: E402
                             prune_hold, steady_load)
from bench_text import report  # noqa: E402
from fencing import late_acks  # noqa: E402
from peer_safety import describe, probe_all  # noqa: E402
from peers import PeerWorker, build_peer_cases, build_same_work_cases, missing_peers  # noqa: E402

from queue_core.lab.servers.postgres_server import NoPostgres, private_postgres  # noqa: E402
from queue_core.lab.speed.slowdisk import (DELAY_US, NoShim, flush_calls, flush_latency,  # noqa: E402
                                     shim_env)

WORKER_COUNTS = (1, 2, 4)


@dataclass(frozen=True)
class Plan:
    """How much work each slice does, how many rounds, and which cases run."""

    rounds: int
    budget_s: float  # no new round starts after this many seconds (at least two run)
    raw: int
    single: int
    k10: int
    k100: int
    sizes: tuple[int, ...]
    full: bool  # also 2 and 4 workers, NORMAL, the memory check and the strace count
    peers: bool = False  # the peers, our single-message drain and the safety probe
    safety: tuple[int, int] = (200, 3)  # items per two-consumer round, rounds (0: no probe)
    postgres: int = 0  # messages per PostgreSQL single-message slice; 0: no PostgreSQL
    slow: bool = False  # also the slow-disk regime, in a child process tree
    batches: tuple[int, ...] = (1, 10, 100)
    durable_peers_only: bool = False  # only peers whose every commit fsyncs (the slow regime)
    normal: bool = False  # our synchronous=NORMAL option beside the NORMAL peers (full runs it)
    bare: bool = True  # the bare two-commit protocol, for scale
    same_work: bool = False  # also each peer on the same work: its effect committed, then acked
    # the queue over its lifetime (``bench_retention``): the steady load's (events, window);
    # our single message with a pruning process beside it; migrate's (messages, ready) of a
    # previous engine's queue with its worker running; PostgreSQL space after prune + VACUUM
    retention: tuple[int, int] = (0, 0)
    prune_case: bool = False
    migrate: tuple[int, int] = (0, 0)
    pg_space: int = 0
    workers: bool = False  # the 2 and 4 worker cases without the rest of ``full``
    # priorities (``bench_priority``): the worker loop's step on a queue with priorities 0-9
    # and on one without, turn and turn about, per store: (steps per round, rounds); a low
    # priority's longest wait under a steady urgent load on a model clock, the workers
    # finishing this many messages a second (0: not run)
    priorities: tuple[int, int] = (0, 0)
    starvation: int = 0
    pg_workers: tuple[int, ...] = WORKER_COUNTS  # PostgreSQL's worker counts (K = 1 and 100)
    # ``queue-core --help`` timed against a bare Python start, 21 of each (two seconds here);
    # the notebook's run, the slow-disk child and the runs of one question leave it to
    # make bench's own run (full or quick)
    startup: bool = True


FULL = Plan(rounds=12, budget_s=150.0, raw=40, single=100, k10=400, k100=2000,
            sizes=(1_000, 10_000, 100_000), full=True, peers=True, postgres=200, slow=True,
            same_work=True, retention=(10_000, 500), prune_case=True, migrate=(10_000, 3_000),
            pg_space=2_000, priorities=(200, 20), starvation=10)
QUICK = Plan(rounds=4, budget_s=1.0, raw=8, single=15, k10=60, k100=200,
             sizes=(1_000, 10_000), full=False, retention=(400, 100), prune_case=True,
             migrate=(1_500, 1_000), priorities=(20, 4), starvation=2)
# A few seconds for notebook 08: ours (one at a time, batched, NORMAL) and the peers, at
# like durability, consumer side; and one probe round.
PEERS_QUICK = Plan(rounds=3, budget_s=1.0, raw=8, single=30, k10=60, k100=300, sizes=(),
                   full=False, peers=True, safety=(100, 1), normal=True, bare=False,
                   startup=False)
# SQLite's writers alone (``--writers``): one worker, 2 and 4 worker processes, and a
# prune looping beside one worker; the figures the write lock's hand-over decides.
# Slices of 1,000 messages (a quarter of a second): in slices of 200 the workers'
# start and their last messages, when some have finished and one runs alone, were a
# fifth of each slice, and the ratios moved by 0.1 between runs.
WRITERS = Plan(rounds=10, budget_s=90.0, raw=40, single=1000, k10=0, k100=0, sizes=(),
               full=False, batches=(), bare=False, prune_case=True, workers=True,
               startup=False)
# Priorities alone (``--priorities``): what they cost the worker loop's step on both stores,
# as in the full run, beside our single message for scale, and the low priority's waits.
PRIORITIES = Plan(rounds=4, budget_s=30.0, raw=40, single=100, k10=0, k100=0, sizes=(),
                  full=False, postgres=200, batches=(), bare=False, priorities=(200, 20),
                  starvation=10, pg_workers=(1,), startup=False)
# The slow-disk regime: every flush 2 ms; ours against the peers that fsync every commit.
SLOW = Plan(rounds=8, budget_s=60.0, raw=25, single=60, k10=0, k100=1000, sizes=(),
            full=False, peers=True, safety=(0, 0), batches=(100,), durable_peers_only=True,
            same_work=True, startup=False)


def same_file_system_dir() -> Path:
    """The system temp dir if it is on the repository's file system (not a
    RAM disk), else the benchmarks folder: the files must meet the same disk."""
    tmp = Path(tempfile.gettempdir())
    return tmp if os.stat(tmp).st_dev == os.stat(ROOT).st_dev else ROOT / "benchmarks"


def build_cases(workdir: Path, plan: Plan, pool: list[Worker],
                peer_worker: PeerWorker | None = None,
                schemas: Schemas | None = None, pruner: Worker | None = None) -> Iterator[Case]:
    """The cases; all but the several-worker ones share the first worker
    process; the peers share a process of their own; PostgreSQL's cases
    (with ``schemas``) put each queue in a fresh schema; ``pruner``: the
    process that prunes beside our single-message case (``plan.prune_case``)."""
    n, one = plan.single, pool[:1]
    if plan.bare and not plan.durable_peers_only:
        yield BareProtocol(workdir, n)
    if plan.full or plan.peers or plan.prune_case or plan.priorities[0]:
        yield EndToEnd("single", "ours, single message, 1 worker", workdir, n,
                       op="drain", workers=one, producer="single")
    if plan.prune_case and pruner is not None and not plan.durable_peers_only:
        yield PrunedEndToEnd(workdir, n, one, pruner)
    if plan.full or plan.workers:
        # Filled as the one worker's case is, an event per commit: a file filled by one
        # batch meets its checkpoint in the timed drain where one filled commit by
        # commit met it in the untimed fill, and four workers came out 0.05 slower.
        yield EndToEnd("two_workers", "ours, single message, 2 workers", workdir, n,
                       op="drain", workers=pool[:2], producer="single")
        yield EndToEnd("four_workers", "ours, single message, 4 workers", workdir, n,
                       op="drain", workers=pool[:4], producer="single")
    for k in plan.batches:
        count = {1: n, 10: plan.k10, 100: plan.k100}[k]
        yield EndToEnd(f"batch_{k}", f"ours, batched claim + complete, K={k}", workdir, count,
                       op="batch", k=k, workers=one)
    for size in plan.sizes:
        yield QueueSize(workdir, size, n, pool[0])
    if plan.full or plan.normal:
        yield EndToEnd("single_normal", "ours, single message, NORMAL (option)",
                       workdir, n, op="drain", sync="NORMAL", workers=one)
    if peer_worker is not None:
        peers = build_peer_cases(workdir, n, peer_worker)
        yield from (peer for peer in peers
                    if not plan.durable_peers_only or peer.fsyncs_every_commit())
        if plan.same_work:
            yield from build_same_work_cases(workdir, n, peer_worker)
    if schemas is not None:
        for k, count in ((1, plan.postgres), (100, plan.k100)):
            for workers in plan.pg_workers if count else ():
                name = f"pg_{'single' if k == 1 else f'batch_{k}'}_{workers}"
                yield EndToEnd(name, f"ours pg, {'single message' if k == 1 else f'K={k}'}, "
                               f"{workers} worker{'s' if workers > 1 else ''}",
                               workdir, count, op="drain", k=k, workers=pool[:workers],
                               schemas=schemas, producer="single" if name == "pg_single_1"
                               else "batch")
        if peer_worker is not None:
            yield from build_peer_cases(schemas, plan.postgres, peer_worker, store="postgres")
            if plan.same_work:
                yield from build_same_work_cases(schemas, plan.postgres, peer_worker,
                                                 store="postgres")


def run(quick: bool = False, log: Callable[[str], None] | None = None,
        plan: Plan | None = None) -> dict[str, Any]:
    """Run every case in interleaved slices; return medians, ratios and the targets.

    Each round runs every case once (the first one rotates), with a slice of
    raw commits between any two slices. Raises ``CheckFailed`` as soon as a
    slice leaves a store without exactly one acknowledgement per item, or
    when the safety probe finds our queue delivering an item twice, never, or
    not again after a crash.
    """
    plan = plan or (QUICK if quick else FULL)
    say = log or (lambda text: None)
    with tempfile.TemporaryDirectory(prefix="queue-bench-", dir=same_file_system_dir()) as tmp, \
            _postgres(plan.postgres > 0, say) as server:
        workdir = Path(tmp)
        raws: dict[str, Case] = {"raw": RawCommits(workdir, plan.raw)}
        schemas = None if server is None else Schemas(server, "queue_bench")
        pool = [Worker() for _ in range(max(WORKER_COUNTS) if plan.full or plan.workers else 1)]
        peer_worker = PeerWorker() if plan.peers else None
        pruner = Worker() if plan.prune_case else None
        cases: list[Case] = []
        lifetime: dict[str, Any] = {}
        id_check: dict[str, dict[str, float]] = {}
        waits: dict[str, Any] = {}
        costs: dict[str, Any] = {}
        safety: dict[str, dict[str, Any]] = {}
        pg_safety: dict[str, dict[str, Any]] = {}
        fenced: dict[str, dict[str, Any]] = {}
        memory = None
        try:
            if schemas is not None:
                raws["pg_raw"] = PgRawCommits(schemas.fresh("raw"), plan.raw)
            cases.extend(build_cases(workdir, plan, pool, peer_worker, schemas, pruner))
            say(f"{len(cases)} cases and the raw limit in {tmp}; {plan.rounds} rounds")
            interleave(cases, raws, plan.rounds, plan.budget_s, say)
            if plan.full:
                largest = max((c for c in cases if isinstance(c, QueueSize)), key=lambda c: c.size)
                memory = largest.peak_rss_after_draining()
            items, rounds = plan.safety
            if plan.peers and rounds:
                say(f"safety probe: {rounds} rounds of two consumer processes on {items} "
                    "items, and a crash, per queue")
                (workdir / "safety").mkdir()
                safety = probe_all(workdir / "safety", items, rounds)
                check_our_safety(safety["queue_core"])
                if schemas is not None:
                    pg_safety = probe_all(workdir / "safety", items, rounds, schemas=schemas)
                    check_our_safety(pg_safety["queue_core_pg"])
                    say("a late ack, per PostgreSQL queue")
                    fenced = late_acks(schemas)
                    check_our_fence(fenced["queue_core_pg"])
            lifetime = lifetime_figures(workdir, plan, cases, schemas, say)
            if plan.priorities[0]:
                costs = priority_costs(workdir / "priorities", plan.priorities, schemas, say)
            if plan.starvation:
                (workdir / "starvation").mkdir()
                waits = starvation(workdir / "starvation", plan.starvation, say)
            if plan.full:
                say("timing the event id's CHECK per UPDATE, each rule, each store")
                id_check = id_check_costs(workdir, server)
        finally:
            for case in (*raws.values(), *cases):
                case.close()
            for worker in [*pool, *([peer_worker] if peer_worker else []),
                           *([pruner] if pruner else [])]:
                worker.close()
            if schemas is not None:
                schemas.close()
    results = summarise(cases, list(raws.values()), memory, safety,
                        missing_peers() if plan.peers else [])
    results["pg_safety"], results["fencing"] = pg_safety, fenced
    results["lifetime"] = lifetime
    if costs:
        results["priority_costs"] = costs
    if waits:
        results["starvation"] = waits
    if id_check:
        results["id_check"] = id_check
    if plan.full:
        say("counting fsyncs per message with strace")
        results["fsyncs"] = (fsyncs.count(fsync_claims=False), fsyncs.count(fsync_claims=True))
    if plan.slow:
        results["slow"] = slow_regime(say)
    if plan.startup:
        say("timing the command line's start against a bare Python start")
        results["startup"] = startup()
    results["targets"] = evaluate(results)
    return results


def priority_costs(folder: Path, plan: tuple[int, int], schemas: Schemas | None,
                   say: Callable[[str], None]) -> dict[str, Any]:
    """What priorities cost the worker loop's step (``bench_priority.step_costs``): on
    two SQLite files in ``folder`` and, where the run has a server, two schemas."""
    folder.mkdir()
    found = {"sqlite": step_costs({name: str(folder / f"{name}.sqlite3")
                                   for name in (MIXED, PLAIN)}, *plan, say)}
    if schemas is not None:
        found["postgres"] = step_costs({name: schemas.fresh(f"step_{name}")
                                        for name in (MIXED, PLAIN)}, *plan, say)
    return found


def id_check_costs(workdir: Path, server: str | None) -> dict[str, dict[str, float]]:
    """What each id rule's CHECK adds per UPDATE (``bench_idcheck``), on SQLite in
    ``workdir`` and, where the run has a server, on PostgreSQL (a scratch schema)."""
    costs = {"sqlite": bench_idcheck.sqlite_costs(workdir)}
    if server is not None:
        costs["postgres"] = bench_idcheck.postgres_costs(server)
    return costs


def startup(runs: int = 21) -> dict[str, float]:
    """How long ``queue-core --help`` takes to start and answer, against a bare
    ``python -c pass``: the medians of interleaved runs of each, in seconds, with
    this interpreter. ``import queue_core`` loads no module of the engine, and the
    command line loads the engine only once its arguments are sound."""
    def once(args: list[str]) -> float:
        started = time.perf_counter()
        subprocess.run([sys.executable, *args], stdout=subprocess.DEVNULL, check=True, cwd=ROOT)
        return time.perf_counter() - started
    bare: list[float] = []
    helped: list[float] = []
    for _ in range(runs):
        bare.append(once(["-c", "pass"]))
        helped.append(once(["-m", "queue_core", "--help"]))
    return {"bare_s": sorted(bare)[runs // 2], "help_s": sorted(helped)[runs // 2]}


def lifetime_figures(workdir: Path, plan: Plan, cases: list[Case], schemas: Schemas | None,
                     say: Callable[[str], None]) -> dict[str, Any]:
    """The queue over its lifetime (``bench_retention``): the steady load with and
    without prune, the pruning process beside the workers, PostgreSQL's space
    after prune and VACUUM, and migrate beside a previous engine's worker.
    Raises ``CheckFailed`` where a state, an effect or the money is not exact."""
    found: dict[str, Any] = {}
    if plan.retention[0]:
        (workdir / "steady").mkdir()
        found["steady"] = steady_load(workdir / "steady", *plan.retention, say=say)
        (workdir / "hold").mkdir()
        found["hold"] = prune_hold(workdir / "hold", plan.retention[0] // 2)
    beside = next((case for case in cases if isinstance(case, PrunedEndToEnd)), None)
    if beside is not None:
        found["beside"] = beside.summary()
        found["ack_pages"] = ack_pages()
    if plan.pg_space and schemas is not None:
        found["pg_space"] = pg_space(schemas.fresh("space"), plan.pg_space, say)
    if plan.migrate[0]:
        (workdir / "migrate").mkdir()
        found["migrate"] = migrations(workdir / "migrate", *plan.migrate,
                                      schemas.fresh("migrate") if schemas is not None else None,
                                      say)
    return found


# The cases compared with one worker on the same work (``PAIRED_BASE``): 2 and 4
# worker processes, and one worker with a pruning process beside it.
PAIRED_BASE = "single"
PAIRED = ("two_workers", "four_workers", "single_pruned")


def round_order(cases: list[Case], round_no: int) -> list[Case]:
    """One round's slices: every case once (the first one rotates), but each case
    of ``PAIRED`` between two slices of ``PAIRED_BASE`` (A, B, A, C, A ...), in
    an order that rotates too, before the rest."""
    turn = round_no % len(cases)
    order = cases[turn:] + cases[:turn]
    base = [case for case in cases if case.name == PAIRED_BASE]
    paired = [case for case in cases if case.name in PAIRED]
    if not base or not paired:
        return order
    turn = round_no % len(paired)
    paired = paired[turn:] + paired[:turn]
    rest = [case for case in order if case not in base and case not in paired]
    return [base[0], *(case for one in paired for case in (one, base[0])), *rest]


def interleave(cases: list[Case], raws: dict[str, Case], rounds: int, budget_s: float,
               say: Callable[[str], None]) -> None:
    """Run every case once per round (``round_order``); after each slice, a slice
    of the raw commits it is divided by (its ``baseline``), so each case is
    judged against the limit measured just before and just after it. A case of
    ``PAIRED`` is also judged against the one worker of the slices just before
    and just after it (``Case.paired``): the disk under this machine changes
    speed from one second to the next, so that even raw commits measured around
    a slice swing by tens of percent; two slices of the same work a few tenths
    of a second apart share the disk's state, and their ratio is what the
    figures "N workers vs 1" and "prune beside vs without" ask for."""
    before = {}
    for name, raw in raws.items():
        before[name] = raw.slice()
        raw.slices.append(before[name])
    started = time.perf_counter()
    for round_no in range(rounds):
        if round_no >= 2 and time.perf_counter() - started > budget_s:
            break
        waiting: Case | None = None  # a PAIRED case's slice, waiting for the base's next
        base_rate: float | None = None  # the base case's last slice
        for case in round_order(cases, round_no):
            raw = raws[case.baseline]
            measured = case.slice()
            after = raw.slice()
            raw.slices.append(after)
            limit = (_rate(before[case.baseline]) + _rate(after)) / 2
            case.slices.append(measured)
            case.relative.append(_rate(measured) / limit)
            case.relative_total.append(measured.messages / measured.total_s / limit)
            before[case.baseline] = after
            if case.name == PAIRED_BASE:
                if waiting is not None and base_rate is not None:
                    waiting.paired.append(_rate(waiting.slices[-1]) * 2
                                          / (base_rate + _rate(measured)))
                waiting, base_rate = None, _rate(measured)
            elif case.name in PAIRED:
                waiting = case
        say(f"round {round_no + 1}/{rounds} done")


@contextmanager
def _postgres(wanted: bool, say: Callable[[str], None]) -> Iterator[str | None]:
    """A PostgreSQL server for the run: ``QUEUE_CORE_PG_DSN``, else a private
    one stopped at the end; ``None`` if not wanted or not available."""
    if not wanted:
        yield None
        return
    with ExitStack() as stack:  # leaving it stops a private server
        try:
            dsn = stack.enter_context(private_postgres())
        except NoPostgres as exc:
            say(f"PostgreSQL not measured: {exc}")
            dsn = None
        yield dsn


def slow_regime(say: Callable[[str], None], plan: Plan = SLOW,
                delay_us: int = DELAY_US) -> dict[str, Any]:
    """The ``plan`` in a child process tree whose every flush waits ``delay_us``
    more: its results, and the shim's verification; ``{"skipped": why}``
    where the shim cannot be had."""
    try:
        env = shim_env(delay_us)
    except NoShim as exc:
        return {"skipped": str(exc)}
    say(f"slow-disk regime: {delay_us / 1000:g} ms added to every fsync and fdatasync")
    child = subprocess.run([sys.executable, __file__, "--slow-json", json.dumps(plan.__dict__)],
                           env=env, capture_output=True, text=True, check=False)
    for line in child.stderr.splitlines():
        say(f"  slow-disk: {line}")
    if child.returncode != 0:
        raise CheckFailed(f"the slow-disk run failed ({child.returncode}): "
                          f"{child.stdout.strip()[-400:]}")
    results = dict(json.loads(child.stdout.strip().splitlines()[-1]))
    if "shim" in results:
        with tempfile.TemporaryDirectory(dir=same_file_system_dir()) as tmp:
            results["shim"]["native_ms"] = flush_latency(tmp) * 1000
    return results


def _slow_child(plan_fields: dict[str, Any]) -> int:
    """The slow-disk child: check the shim applies here, run the plan, print JSON."""
    plan = replace(SLOW, **{key: tuple(v) if isinstance(v, list) else v
                            for key, v in plan_fields.items()})
    delay_ms = int(os.environ.get("SLOWSYNC_US", DELAY_US)) / 1000
    with tempfile.TemporaryDirectory(dir=same_file_system_dir()) as tmp:
        flush_ms = flush_latency(tmp) * 1000
        raw = RawCommits(Path(tmp), 20)
        before = flush_calls()
        raw.slice()
        counted = flush_calls()
        raw.close()
    if before is None or counted is None or flush_ms < 0.9 * delay_ms:
        print(json.dumps({"skipped": f"the shim did not apply here (an fdatasync took "
                                     f"{flush_ms:.2f} ms, at least {delay_ms:g} ms expected)"}))
        return 0
    try:
        results = run(plan=plan, log=lambda text: print(text, file=sys.stderr))
    except CheckFailed as exc:
        print(f"EXACTLY-ONCE CHECK FAILED: {exc}")
        return 1
    results["shim"] = {"flush_ms": flush_ms, "delay_ms": delay_ms,
                       "per_raw_commit": (counted - before) / 20}
    results.pop("targets", None)
    print(json.dumps(results))
    return 0


def check_our_safety(result: dict[str, Any]) -> None:
    """Raise ``CheckFailed`` unless our queue delivered every item exactly once
    to the two consumers and delivered the crashed consumer's item again."""
    if any(result["duplicates"]) or any(result["missing"]) or result["errors"] \
            or result.get("crash_errors") or result["crash"] != "redelivered" \
            or result["others_missing"]:
        raise CheckFailed(f"safety probe of {result.get('name', 'queue_core')}: "
                          f"{describe(result)}; {result}")


def check_our_fence(result: dict[str, Any]) -> None:
    """Raise ``CheckFailed`` unless our queue refused the late ACK and took the new owner's."""
    if not result["late_ack"].startswith("refused") or result["b_ack"] != "accepted" \
            or tuple(result["settled"]) != (1, 0):
        raise CheckFailed(f"late ACK on queue_core_pg: {result}")


def _rate(measured: Slice) -> float:
    return measured.messages / measured.consume_s


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a small run (a few seconds)")
    parser.add_argument("--writers", action="store_true",
                        help="only SQLite's writers: 1, 2 and 4 workers, prune beside one")
    parser.add_argument("--priorities", action="store_true",
                        help="only priorities: what they cost the worker loop's step on "
                             "both stores, and a low priority's waits")
    parser.add_argument("--slow-json", help=argparse.SUPPRESS)  # the slow-disk child
    args = parser.parse_args(argv)
    if args.slow_json:
        return _slow_child(json.loads(args.slow_json))
    try:
        plan = WRITERS if args.writers else PRIORITIES if args.priorities else None
        results = run(quick=args.quick, plan=plan, log=lambda text: print(text, file=sys.stderr))
    except CheckFailed as exc:
        print(f"EXACTLY-ONCE CHECK FAILED: {exc}")
        return 1
    print("\n".join(report(results)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
