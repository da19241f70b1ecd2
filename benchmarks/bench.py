"""Throughput of queue_core against the SQLite commit limit, measured in one run.

    python benchmarks/bench.py            # make bench: the full run, 1 to 3 minutes
    python benchmarks/bench.py --quick    # a small run (the notebook uses it)

The disk under this machine switches between fsync regimes that differ about
tenfold for tens of seconds, so an absolute rate means little and two rates
from different minutes mean nothing. Every case therefore runs in short
slices, round-robin, in one process tree, on one file system, with the same
pragmas (WAL, ``synchronous=FULL``), and each slice is divided by the rate
of raw commits measured just before and just after it. Each figure is the
median of its slices; only ratios from this run are compared to targets.

Cases: the limit (a raw single-row ``BEGIN IMMEDIATE ... COMMIT``); for
scale, a bare two-commit protocol (a claim transaction and an ACK
transaction with nothing else: no journal, no CHECKs, no fence read);
end to end (enqueue, claim, complete) per message with 1 and 2 real worker
processes; batched claim/complete at K = 1, 10, 100; the consume rate with
1,000, 10,000 and 100,000 messages queued; and, labelled as an explicit
trade, single-message mode at ``synchronous=NORMAL``. After every slice the
database is checked: each done event has exactly one effect, no effect
without a done event, the money equals the sum of the payloads. A failed
check makes the exit code 1; a ratio below its target is printed as such.

Why not use a library? The full run also puts the SQLite queues a Python
user would pick (``peers.py``: persist-queue, litequeue, huey's SQLite
storage; ``pip install -e '.[bench]'``) into the same rounds, each on its
own defaults, with its pragmas read back; each does put + get + ack per
message, so it is compared with our end-to-end figures (enqueue, claim,
ACK). Then ``peer_safety.py`` runs two consumer processes and a crashing
consumer against each of them and against ours; ours must show no
duplicate, no missing item and a crashed item delivered again.

Worker processes: the full run drains single messages with 1, 2 and 4
worker processes on SQLite (one writer at a time: the rate stays flat) and
on PostgreSQL (many writers: it should grow), and K=100 batches with 1, 2
and 4 on PostgreSQL. PostgreSQL runs on ``QUEUE_CORE_PG_DSN`` or on a
private ``pgserver`` started and stopped here, each queue in a fresh
schema; its cases are divided by PostgreSQL's own raw commit rate (a
single-row INSERT per ``BEGIN ... COMMIT``, ``synchronous_commit = on``),
measured after each of them in the same interleaved rounds (notebook 10
draws a small version of that comparison with ``queue_core.lab.scaling``).
"""

from __future__ import annotations

import argparse
import os
import resource
import sqlite3
import sys
import tempfile
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # the cases live next to this file
    sys.path.insert(0, str(HERE))

import fsyncs  # noqa: E402
from bench_cases import (ROOT, BareProtocol, Case, CheckFailed, EndToEnd,  # noqa: E402
                         PgRawCommits, QueueSize, RawCommits, Schemas, Slice, Worker)
from peer_safety import describe, probe_all  # noqa: E402
from peers import PeerCase, PeerWorker, build_peer_cases, missing_peers  # noqa: E402

from queue_core.lab.postgres_server import NoPostgres, private_postgres  # noqa: E402

TARGETS = {  # name: (numerator, denominator, minimum ratio); "size_max" is the largest queue
    "single vs raw commit": ("single", "raw", 0.45),
    "K=100 vs single": ("batch_100", "single", 10.0),
    "largest queue vs 1k": ("size_max", "size_1000", 0.8),
    "2 workers vs 1": ("two_workers", "single", 0.8),
    # end to end (enqueue + claim + ACK against put + get + ack); the fastest
    # peer is the fastest of every peer's variants, batched ones included
    "single vs fastest peer": ("e2e:single", "e2e:fastest_peer", 1.0),
    "K=100 vs fastest peer": ("e2e:batch_100", "e2e:fastest_peer", 5.0),
    # PostgreSQL: many writers at once on 2 cores, and its own commit limit
    "PG 4 workers vs 1": ("pg_single_4", "pg_single_1", 1.5),
    "PG single vs PG raw": ("pg_single_1", "pg_raw", 0.4),
}
WORKER_COUNTS = (1, 2, 4)
MEMORY_LIMIT_MB = 150.0


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
    full: bool  # also 2 workers, single-message drain, NORMAL, the memory check and the peers
    peers: bool = False  # the peers, our single-message drain and the safety probe
    safety: tuple[int, int] = (200, 3)  # items per two-consumer round, rounds
    postgres: int = 0  # messages per PostgreSQL single-message slice; 0: no PostgreSQL


FULL = Plan(rounds=12, budget_s=120.0, raw=40, single=100, k10=400, k100=2000,
            sizes=(1_000, 10_000, 100_000), full=True, peers=True, postgres=400)
QUICK = Plan(rounds=4, budget_s=1.0, raw=8, single=15, k10=60, k100=200,
             sizes=(1_000, 10_000), full=False)
# A few seconds for notebook 08: ours and the peers end to end, and one probe round.
PEERS_QUICK = Plan(rounds=3, budget_s=1.0, raw=8, single=30, k10=60, k100=300, sizes=(),
                   full=False, peers=True, safety=(100, 1))


def same_file_system_dir() -> Path:
    """The system temp dir if it is on the repository's file system (not a
    RAM disk), else the benchmarks folder: the files must meet the same disk."""
    tmp = Path(tempfile.gettempdir())
    return tmp if os.stat(tmp).st_dev == os.stat(ROOT).st_dev else ROOT / "benchmarks"


def build_cases(workdir: Path, plan: Plan, pool: list[Worker],
                peer_worker: PeerWorker | None = None,
                schemas: Schemas | None = None) -> Iterator[Case]:
    """The cases; all but the several-worker ones share the first worker
    process; the peers share a process of their own; PostgreSQL's cases
    (with ``schemas``) put each queue in a fresh schema."""
    n, one = plan.single, pool[:1]
    yield BareProtocol(workdir, n)
    if plan.full or plan.peers:
        yield EndToEnd("single", "single message, 1 worker process", workdir, n,
                       op="drain", workers=one)
    if plan.full:
        yield EndToEnd("two_workers", "single message, 2 worker processes", workdir, n,
                       op="drain", workers=pool[:2])
        yield EndToEnd("four_workers", "single message, 4 worker processes", workdir, n,
                       op="drain", workers=pool[:4])
    for k, count in ((1, n), (10, plan.k10), (100, plan.k100)):
        yield EndToEnd(f"batch_{k}", f"batched claim + complete, K={k}", workdir, count,
                       op="batch", k=k, workers=one)
    for size in plan.sizes:
        yield QueueSize(workdir, size, n, pool[0])
    if plan.full:
        yield EndToEnd("single_normal", "single message, synchronous=NORMAL (option)",
                       workdir, n, op="drain", sync="NORMAL", workers=one)
    if peer_worker is not None:
        yield from build_peer_cases(workdir, n, peer_worker)
    if schemas is not None:
        for k, count in ((1, plan.postgres), (100, plan.k100)):
            for workers in WORKER_COUNTS:
                name = f"pg_{'single' if k == 1 else f'batch_{k}'}_{workers}"
                yield EndToEnd(name, f"PostgreSQL {'single message' if k == 1 else f'K={k}'}, "
                               f"{workers} worker process{'es' if workers > 1 else ''}",
                               workdir, count, op="drain", k=k, workers=pool[:workers],
                               schemas=schemas)


def run(quick: bool = False, log: Callable[[str], None] | None = None,
        plan: Plan | None = None) -> dict[str, Any]:
    """Run every case in interleaved slices; return medians, ratios and memory.

    Each round runs every case once (the first one rotates), with a slice of
    raw commits between any two slices. Raises ``CheckFailed`` as soon as a
    slice leaves the database without exactly one effect per done event, or
    when the safety probe finds our queue delivering an item twice, never, or
    not again after a crash. The full run adds the installed peers and the
    safety probe (``results["peers"]``, ``results["safety"]``).
    """
    plan = plan or (QUICK if quick else FULL)
    say = log or (lambda text: None)
    with tempfile.TemporaryDirectory(prefix="queue-bench-", dir=same_file_system_dir()) as tmp, \
            _postgres(plan.postgres > 0, say) as server:
        raws: dict[str, Case] = {"raw": RawCommits(Path(tmp), plan.raw)}
        schemas = None if server is None else Schemas(server, "queue_bench")
        pool = [Worker() for _ in range(max(WORKER_COUNTS) if plan.full else 1)]
        peer_worker = PeerWorker() if plan.peers else None
        cases: list[Case] = []
        safety: dict[str, dict[str, Any]] = {}
        try:
            if schemas is not None:
                raws["pg_raw"] = PgRawCommits(schemas.fresh("raw"), plan.raw)
            cases.extend(build_cases(Path(tmp), plan, pool, peer_worker, schemas))
            say(f"{len(cases)} cases and the raw limit in {tmp}; {plan.rounds} rounds")
            interleave(cases, raws, plan.rounds, plan.budget_s, say)
            memory = None
            if plan.full:
                largest = max((c for c in cases if isinstance(c, QueueSize)), key=lambda c: c.size)
                memory = largest.peak_rss_after_draining()
            if plan.peers:
                items, rounds = plan.safety
                say(f"safety probe: {rounds} rounds of two consumer processes on "
                    f"{items} items, and a crash, per queue")
                (Path(tmp) / "safety").mkdir()
                safety = probe_all(Path(tmp) / "safety", items, rounds)
                check_our_safety(safety["queue_core"])
        finally:
            for case in (*raws.values(), *cases):
                case.close()
            for worker in pool:
                worker.close()
            if peer_worker is not None:
                peer_worker.close()
            if schemas is not None:
                schemas.close()
    results = summarise(raws["raw"], cases, memory, safety,
                        missing_peers() if plan.peers else [], extra_raws=list(raws.values())[1:])
    if plan.full:
        say("counting fsyncs per message")
        results["fsyncs"] = (fsyncs.count(fsync_claims=False), fsyncs.count(fsync_claims=True))
    return results


def interleave(cases: list[Case], raws: dict[str, Case], rounds: int, budget_s: float,
               say: Callable[[str], None]) -> None:
    """Run every case once per round (the first one rotates); after each slice,
    a slice of the raw commits it is divided by (its ``baseline``), so each
    case is judged against the limit measured just before and just after it."""
    before = {}
    for name, raw in raws.items():
        before[name] = raw.slice()
        raw.slices.append(before[name])
    started = time.perf_counter()
    for round_no in range(rounds):
        if round_no >= 2 and time.perf_counter() - started > budget_s:
            break
        turn = round_no % len(cases)
        for case in cases[turn:] + cases[:turn]:
            raw = raws[case.baseline]
            measured = case.slice()
            after = raw.slice()
            raw.slices.append(after)
            limit = (_rate(before[case.baseline]) + _rate(after)) / 2
            case.slices.append(measured)
            case.relative.append(_rate(measured) / limit)
            case.relative_total.append(measured.messages / measured.total_s / limit)
            before[case.baseline] = after
        say(f"round {round_no + 1}/{rounds} done")


@contextmanager
def _postgres(wanted: bool, say: Callable[[str], None]) -> Iterator[str | None]:
    """A PostgreSQL server for the run: ``QUEUE_CORE_PG_DSN``, else a private
    ``pgserver`` stopped at the end; ``None`` if not wanted or not available."""
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


def check_our_safety(result: dict[str, Any]) -> None:
    """Raise ``CheckFailed`` unless our queue delivered every item exactly once
    to the two consumers and delivered the crashed consumer's item again."""
    if any(result["duplicates"]) or any(result["missing"]) or result["errors"] \
            or result.get("crash_errors") or result["crash"] != "redelivered" \
            or result["others_missing"]:
        raise CheckFailed(f"safety probe of queue_core: {describe(result)}; {result}")


def _rate(measured: Slice) -> float:
    return measured.messages / measured.consume_s


def summarise(raw: Case, cases: list[Case], memory: tuple[int, float] | None,
              safety: dict[str, dict[str, Any]] | None = None,
              missing: list[str] | None = None,
              extra_raws: list[Case] | None = None) -> dict[str, Any]:
    """Medians per case and the target ratios, all from this run; each case
    against its own store's raw commits (``extra_raws``: PostgreSQL's)."""
    raws = [raw, *(extra_raws or [])]
    vs_raw = {case.name: case.vs_raw() for case in cases}
    e2e_vs_raw = {case.name: case.end_to_end_vs_raw() for case in cases}
    for each in raws:
        vs_raw[each.name] = e2e_vs_raw[each.name] = 1.0
    largest = max((case.size for case in cases if isinstance(case, QueueSize)), default=0)
    lookup = dict(vs_raw)
    if largest:
        lookup["size_max"] = vs_raw[f"size_{largest}"]
    lookup.update({f"e2e:{name}": value for name, value in e2e_vs_raw.items()})
    peers = [dict(case.info(), name=case.name, label=case.label, rate=case.end_to_end(),
                  vs_raw=e2e_vs_raw[case.name]) for case in cases if isinstance(case, PeerCase)]
    if peers:
        lookup["e2e:fastest_peer"] = max(peer["vs_raw"] for peer in peers)
    ratios = {name.replace("largest queue", f"{largest:,} queued"): (lookup[top] / lookup[bottom],
                                                                    minimum)
              for name, (top, bottom, minimum) in TARGETS.items()
              if top in lookup and bottom in lookup}
    every = [*raws, *cases]
    return {
        "rates": {case.name: case.rate() for case in every},
        "end_to_end": {case.name: case.end_to_end() for case in every},
        "vs_raw": vs_raw,
        "samples": {case.name: list(case.relative) for case in cases},
        "labels": {case.name: case.label for case in every},
        "sizes": {case.size: case.name for case in cases if isinstance(case, QueueSize)},
        "ratios": ratios,
        "slices": sum(len(case.slices) for case in cases),
        "memory": memory,
        "parent_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "raw_range": (min(map(_rate, raw.slices)), max(map(_rate, raw.slices))),
        "e2e_vs_raw": e2e_vs_raw,
        "peers": peers,
        "peers_missing": missing or [],
        "safety": safety or {},
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
    low, high = results["raw_range"]
    lines.append(f"the disk during this run: a raw commit took {1000 / rates['raw']:.2f} ms "
                 f"(median); its slices ran from {low:.0f} to {high:.0f} commits/s")
    if "pg_raw" in rates:
        lines.append(f"PostgreSQL rows: x raw = against PostgreSQL's own raw commits around them "
                     f"(synchronous_commit=on; median {rates['pg_raw']:.0f} commits/s)")
    lines += scaling_report(results)
    lines.append("ratios measured in this run, against their targets:")
    for name, (value, minimum) in results["ratios"].items():
        verdict = "ok" if value >= minimum else "BELOW TARGET"
        lines.append(f"  {name:<24}{value:>7.2f}   target >= {minimum:<5g} {verdict}")
    if "bare" in vs_raw and "single" in vs_raw:
        lines.append(f"for scale, no target: single-message mode reaches "
                     f"{vs_raw['single'] / vs_raw['bare']:.2f} of the bare two-commit protocol "
                     "(no journal, no CHECKs, no fence read), which reaches "
                     f"{vs_raw['bare']:.2f} of the raw limit")
    if results["memory"] is not None:
        messages, mb = results["memory"]
        verdict = "ok" if mb < MEMORY_LIMIT_MB else "ABOVE LIMIT"
        lines.append(f"peak RSS of the worker process that claimed and completed all "
                     f"{messages:,} messages of the largest queue: {mb:.0f} MB "
                     f"(limit {MEMORY_LIMIT_MB:.0f} MB) {verdict}")
        lines.append(f"peak RSS of this process (it filled the queues): "
                     f"{results['parent_rss_mb']:.0f} MB")
    lines.append(f"exactly-once: checked after each of {results['slices']} slices with the "
                 "shared audit (one effect per done event, each equal to its payload, no other "
                 "effect, a legal journal)")
    lines += fsync_report(results.get("fsyncs"))
    if "single_normal" in vs_raw:
        normal = vs_raw["single_normal"] / vs_raw["single"]
        lines.append(f"explicit option, not the default: synchronous=NORMAL runs {normal:.1f}x "
                     "the default here; in WAL mode it skips the fsync at each commit, so a "
                     "power loss (not a process crash) may lose the last commits, "
                     "acknowledged ones included")
    return lines + peer_report(results)


def scaling_report(results: dict[str, Any]) -> list[str]:
    """Rate against worker processes, per store, as multiples of one worker."""
    vs_raw, lines = results["vs_raw"], []
    rows = [("SQLite, single message", ["single", "two_workers", "four_workers"]),
            *((f"PostgreSQL, {label}", [f"pg_{name}_{n}" for n in WORKER_COUNTS])
              for label, name in (("single message", "single"), ("K=100", "batch_100")))]
    for label, names in rows:
        if all(name in vs_raw for name in names):
            lines.append(f"worker processes 1, 2, 4, {label}: " + ", ".join(
                f"{vs_raw[name] / vs_raw[names[0]]:.2f}x" for name in names) + " of one worker")
    return lines


def _ours(synchronous: str) -> str:
    """Our synchronous setting as the table shows it: FULL* marks that claims skip it."""
    return f"{synchronous}*" if synchronous == "FULL" else synchronous


def fsync_report(counted: tuple[float | None, float | None] | None) -> list[str]:
    """Fsyncs per single-message claim + ACK, counted with strace where it runs."""
    if counted is None:
        return []
    default, all_full = counted
    if default is None or all_full is None:
        return ["fsyncs per message: not counted here (strace is missing or not allowed)"]
    verdict = "ok" if default < 1.5 else "ABOVE TARGET"
    return [f"fsyncs per message (strace): {default:.2f} at the default, where a claim commits "
            f"without its own fsync (target: 1) {verdict}; {all_full:.2f} with fsync_claims=True"]


def peer_report(results: dict[str, Any]) -> list[str]:
    """The peers beside ours, end to end, with their pragmas and safety figures."""
    lines: list[str] = []
    if results["peers_missing"]:
        lines.append(f"peers not installed, so not compared: {', '.join(results['peers_missing'])}"
                     " (pip install -e '.[bench]'; make bench does)")
    if not results["peers"]:
        return lines
    e2e, safety = results["e2e_vs_raw"], results["safety"]
    lines += ["", "peers, each on its own defaults (pragmas read back from its connection); "
              "end to end: put + get + ack per message against our enqueue + claim + ACK;",
              "x raw = end-to-end rate against the raw commits around it; single/it, "
              "K=100/it = our end-to-end figure over the peer's",
              f"{'queue':<26}{'version':>8}{'journal':>8}{'sync':>8}{'msgs/s':>8}{'x raw':>7}"
              f"{'single/it':>10}{'K=100/it':>9}  safety"]
    ours = [("queue_core single", "single"), ("queue_core K=100", "batch_100")]
    for label, name in ours:
        probe = safety.get("queue_core", {})
        lines.append(f"{label:<26}{'':>8}{probe.get('journal_mode', ''):>8}"
                     f"{_ours(probe.get('synchronous', '')):>8}"
                     f"{results['end_to_end'][name]:>8.0f}{e2e[name]:>7.2f}{'':>10}{'':>9}  "
                     + (describe(probe) if probe and name == "single" else ""))
    for peer in results["peers"]:
        probe = safety.get(peer["peer"])
        lines.append(f"{peer['peer'] + ' ' + peer['variant']:<26}{peer['version']:>8}"
                     f"{peer['journal_mode']:>8}{peer['synchronous']:>8}{peer['rate']:>8.0f}"
                     f"{peer['vs_raw']:>7.2f}{e2e['single'] / peer['vs_raw']:>10.2f}"
                     f"{e2e['batch_100'] / peer['vs_raw']:>9.2f}  "
                     + (describe(probe) if probe else ""))
    lines.append("  * ours: every commit a caller is told is durable (enqueue, ACK, fail, redrive) "
                 "at FULL; a claim commits without an fsync of its own")
    durable = [peer for peer in results["peers"] if peer["synchronous"] in ("FULL", "EXTRA")]
    if durable:
        best = max(durable, key=lambda peer: peer["vs_raw"])
        lines.append(f"for scale, no target: against the fastest peer that syncs every commit "
                     f"as our ACKs do ({best['peer']} {best['variant']}, synchronous="
                     f"{best['synchronous']}): single {e2e['single'] / best['vs_raw']:.2f}, "
                     f"K=100 {e2e['batch_100'] / best['vs_raw']:.2f}")
    normal = [peer for peer in results["peers"] if peer["synchronous"] == "NORMAL"]
    if normal and "single_normal" in e2e:
        best = max(normal, key=lambda peer: peer["vs_raw"])
        lines.append(f"for scale, no target: our single message at synchronous=NORMAL (the "
                     f"option) against {best['peer']} {best['variant']}, also NORMAL: "
                     f"{e2e['single_normal'] / best['vs_raw']:.2f}")
    lines.append("what each ack means:")
    seen = set()
    for peer in results["peers"]:
        if peer["peer"] not in seen:
            seen.add(peer["peer"])
            lines.append(f"  {peer['peer']}: {peer['ack']}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a small run (a few seconds)")
    args = parser.parse_args(argv)
    try:
        results = run(quick=args.quick, log=lambda text: print(text, file=sys.stderr))
    except CheckFailed as exc:
        print(f"EXACTLY-ONCE CHECK FAILED: {exc}")
        return 1
    print("\n".join(report(results)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
