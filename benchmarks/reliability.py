"""Reliability figures: crash sweep, power-loss sweep, fuzzed input, stateful model, stress.

    python benchmarks/reliability.py           # make reliability: about a minute
    python benchmarks/reliability.py --quick   # a smaller run
    SOAK=1 python benchmarks/reliability.py    # a long soak: more of everything

Prints, in order: the crash sweep (every crash point and slow-worker
schedule against the protocol and the three deliberately broken ones) with
the outcome of each, then the crash points again with the crash on a later
message (the 2nd and 3rd arrival; up to the 5th in a soak); which broken protocols the sweep caught and where; the
power-loss sweep (every WAL image a power cut can leave, per scenario, at
the protocol's durability and with everything at synchronous=NORMAL:
images checked, violations, acknowledged ACKs lost); a migration killed at
every step, on a schema-1 file of each earlier engine; how
many fuzzed batches were tried, by outcome, with the unhandled exceptions;
how many stateful programs agreed with the model; and the stress run
(worker processes x events, crashes, duplicates, losses, money). Exits 1 if
any invariant fails: a protocol step that is not ok, a broken protocol the
sweep does not catch, a power-loss image that breaks an invariant or, at the
protocol's durability, loses an acknowledged commit (or, at NORMAL, one that
loses no ACK at all: the sweep could not see a loss), a killed migration that
leaves no whole version, a finding or other money, an unhandled fuzz input, a model disagreement, or a
stress duplicate, loss or money difference.

After the migration sweep, the queue's lifetime: a migration (of each
schema-1 file in tests/files, written by an earlier engine) and a prune
killed by a real process at each of their steps
(``crashpoints.LIFETIME_POINTS``; the prune at each of its batches), and
every frame prefix of their WAL a power cut can leave: each file left must
be version 1 intact or a later version complete, the prune's batches whole or
absent, and go on to the uninterrupted run's end. Any other outcome fails
the run.

Then the checkpoint sweep (``queue_core.lab.sweeps.checkpoint``): enqueue,
work, prune and migrate, each a real process killed with SIGKILL before each
write, flush or truncation of the main file that its checkpoint makes; after
each kill every command must run on the file, read the committed schema
version, audit clean, and end as the uninterrupted run ends.

Last, the same crash sweep (every protocol) and the stress run (4 processes
x 1000 events) on PostgreSQL: on ``QUEUE_CORE_PG_DSN`` if set, else on a
private server (``queue_core.lab.private_postgres``) stopped at the end
(skipped, and said so, when neither is available). Each case gets a fresh schema.
Then the network sweep on the same server: every step of a worker's conversation
with it times every fault of the fault proxy, per protocol, judged by the audit;
it fails if the protocol's column is not clean, or a broken protocol is not caught.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections import Counter
from contextlib import ExitStack, nullcontext
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
for path in (ROOT, ROOT / "tests"):  # the package and the fuzz/model strategies
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from queue_core.lab.story.contrasts import PROTOCOLS  # noqa: E402
from queue_core.lab.servers.pgcases import Schemas  # noqa: E402
from queue_core.lab.servers.postgres_server import NoPostgres, private_postgres  # noqa: E402
from queue_core.lab.lifetime import (ENGINES, NoHistory, migration_frame,  # noqa: E402
                                     sweep_every_engine)
from queue_core.lab.sweeps.checkpoint import COMMANDS, run_checkpoint_sweep  # noqa: E402
from queue_core.lab.sweeps.powerloss import run_lifetime_powerloss, run_powerloss  # noqa: E402
from queue_core.lab.sweeps.network import network_frame, run_network_sweep  # noqa: E402
from queue_core.lab.sweeps.stress import run_stress  # noqa: E402
from queue_core.lab.sweeps.sweep import (SCHEDULES, STEPS, SweepRow, run_lifetime_sweep,  # noqa: E402
                                         run_sweep, sweep_frame)

CRASH_STEPS = tuple(step for step in STEPS if step not in SCHEDULES)
# Schema-1 files the earlier engines wrote (tests/files/make_files.py writes them again).
SCHEMA1_FILES = sorted((ROOT / "tests" / "files").glob("schema1-*.sqlite3"))


def sweep_section(problems: list[str], later_arrivals: int, db: str | None = None) -> None:
    rows = run_sweep(jobs=2, db=db)
    table = sweep_frame(rows)
    print(table.to_string())
    print()
    for name, proto in PROTOCOLS.items():
        mine = [r for r in rows if r.protocol == name and r.outcome != "n/a"]
        counts = Counter(r.outcome for r in mine)
        crashes = sum(1 for r in mine if not r.step.startswith("stale."))
        print(f"{name:>20}: {crashes} crash points + {len(mine) - crashes} schedules tried; "
              + ", ".join(f"{n} {o}" for o, n in counts.most_common()))
        _judge(proto.broken, [r for r in mine if r.failed], name, problems)
    for arrival in range(2, later_arrivals + 1):
        later_section(arrival, problems)


def later_section(arrival: int, problems: list[str]) -> None:
    """The same crash points, hit on a later message (retries, permanent failures)."""
    rows = [r for r in run_sweep(jobs=2, crash_after=arrival, steps=CRASH_STEPS)
            if r.outcome != "n/a"]
    for name, proto in PROTOCOLS.items():
        mine = [r for r in rows if r.protocol == name]
        failed = [f"{r.outcome} at {r.step}" for r in mine if r.failed]
        print(f"crash at arrival {arrival}, {name}: {len(mine)} points reached; "
              + ("; ".join(failed) if failed else "all ok"))
        if not proto.broken:
            problems.extend(f"{name} (arrival {arrival}): {text}" for text in failed)


def _judge(broken: bool, failed: list[SweepRow], name: str, problems: list[str]) -> None:
    if broken and not failed:
        problems.append(f"the sweep did not catch the broken protocol {name!r}")
    elif broken:
        where = "; ".join(f"{r.outcome} at {r.step} (money {r.total})" for r in failed)
        print(f"{'':>20}  caught: {where}")
    elif failed:
        problems.extend(f"{name}: {r.outcome} at {r.step}: {r.detail}" for r in failed)


def powerloss_section(problems: list[str]) -> None:
    report = run_powerloss()
    for (scenario, level), commits in report.commits.items():
        rows = report.select(scenario, level)
        lost = [r for r in rows if r.outcome == "lost acknowledged ACK"]
        broken = [r for r in report.violations if (r.scenario, r.synchronous) == (scenario, level)]
        print(f"{scenario:>15}, {level:<6}: {len(commits)} commits "
              f"({sum(c.durable for c in commits)} fsynced); {len(rows)} (cut, image) pairs over "
              f"{len({r.kept for r in rows})} recovered images; violations {len(broken)}; "
              f"pairs that lose an acknowledged ACK {len(lost)}")
        problems.extend(f"power loss, {scenario} at {level}, cut {r.cut} kept {r.kept}: "
                        f"{r.outcome}: {r.detail}" for r in broken)
    if not report.lost_acks:
        problems.append("power loss: no lost acknowledged ACK at NORMAL; the sweep sees no loss")
    print(f"in all: {len(report.rows)} (cut, image) pairs checked, {len(report.violations)} "
          f"violations, {len(report.lost_acks)} that lose an acknowledged ACK, all at NORMAL")


def lifetime_section(problems: list[str]) -> None:
    """migrate and prune: killed at every step, and cut at every frame of their log."""
    if not SCHEMA1_FILES:
        problems.append("lifetime: no schema-1 file in tests/files (make_files.py writes them)")
        return
    rows = run_lifetime_sweep(SCHEMA1_FILES)
    for run in dict.fromkeys(row.run for row in rows):
        mine = [row for row in rows if row.run == run and row.outcome != "n/a"]
        counts = Counter(row.outcome for row in mine)
        print(f"crash, {run}: {len(mine)} cases ({len({row.step for row in mine})} points"
              + (f", arrivals 1-{max(row.arrival for row in mine)}" if run == "prune" else "")
              + "); " + ", ".join(f"{n} {o}" for o, n in counts.most_common()))
    problems.extend(f"lifetime crash, {row.run} at {row.step} (arrival {row.arrival}): "
                    f"{row.outcome}: {row.detail}" for row in rows if row.failed)
    report = run_lifetime_powerloss(SCHEMA1_FILES)
    for run, frames in report.frames.items():
        mine = [image for image in report.images if image.run == run]
        counts = Counter(image.outcome for image in mine)
        print(f"power loss, {run}: {frames} WAL frames in {report.commits[run]} commits; "
              f"{len(mine)} frame prefixes recovered; "
              + ", ".join(f"{n} {o}" for o, n in counts.most_common()))
    problems.extend(f"lifetime power loss, {image.run}, {image.frames} frames: "
                    f"{image.outcome}: {image.detail}" for image in report.violations)


def checkpoint_section(problems: list[str], every: int) -> None:
    """enqueue, work, prune and migrate killed (SIGKILL) before each write of their
    checkpoint to the main file, then every command on the file left behind."""
    with tempfile.TemporaryDirectory(prefix="checkpoint-sweep-") as folder:
        cases, found = run_checkpoint_sweep(Path(folder), every=every)
    for command in COMMANDS:
        mine = [case for case in cases if case.command == command]
        failed = {text.split(":")[0] for text in found if text.startswith(f"{command} killed")}
        print(f"{command}: killed at {len(mine)} writes of its checkpoint "
              f"(1-{max(case.point for case in mine)}); {len(mine) - len(failed)} left a file "
              "that every later command used, at the committed version, audit clean, "
              "ending as the uninterrupted run")
    problems.extend(f"checkpoint sweep: {text}" for text in found)


def fuzz_section(examples: int, problems: list[str]) -> None:
    from test_fuzz_ingest import run_campaign

    seen = run_campaign(examples, seed=int(time.time()) if os.environ.get("SOAK") else 0)
    tried = sum(seen.values())
    rejected = {code: n for code, n in seen.items() if code not in ("accepted", "unhandled", "broken")}
    print(f"fuzzed batches tried: {tried}; accepted {seen['accepted']}; "
          f"rejected {sum(rejected.values())} with {len(rejected)} distinct codes; "
          f"unhandled exceptions {seen['unhandled']}; broken checks {seen['broken']}")
    print("  by code: " + ", ".join(f"{code} {n}" for code, n in sorted(rejected.items())))
    if seen["unhandled"] or seen["broken"] or tried != examples:
        problems.append(f"fuzz: {seen['unhandled']} unhandled, {seen['broken']} broken")


def model_section(programs: int, problems: list[str]) -> None:
    from hypothesis import settings
    from hypothesis.stateful import run_state_machine_as_test
    from test_stateful_model import QueueModel

    try:
        run_state_machine_as_test(QueueModel, settings=settings(
            QueueModel.TestCase.settings, max_examples=programs))
    except Exception as exc:  # noqa: BLE001 - the report prints it and fails
        problems.append(f"stateful model disagreement: {exc!r}")
        print(f"stateful programs: FAILED ({type(exc).__name__})")
        return
    steps = QueueModel.TestCase.settings.stateful_step_count
    print(f"stateful programs: {programs} of up to {steps} steps each agreed with the model")


def stress_section(runs: list[tuple[int, int, int]], problems: list[str],
                   server: str | None = None) -> None:
    for workers, events, seed in runs:
        with tempfile.TemporaryDirectory(prefix="stress-") as folder, \
                (Schemas(server, "queue_stress") if server else nullcontext()) as schemas:
            db = schemas.fresh("stress") if schemas else None
            r = run_stress(folder, events=events, workers=workers, seed=seed, db=db)
        print(f"stress: {r.workers} processes x {r.events} events, seed {seed}: "
              f"{r.rounds} rounds, {r.processes} processes started, {r.crashes} crashed; "
              f"done {r.done}, dead {r.dead}, effects {r.effects}; "
              f"duplicates {r.duplicates}, losses {r.losses}; "
              f"money {r.total} (expected {r.expected_total}); integrity {r.integrity}")
        problems.extend(f"stress seed {seed}: {p}" for p in r.problems)


def postgres_section(problems: list[str], stress: list[tuple[int, int, int]]) -> None:
    """The crash sweep and the stress run again, on a PostgreSQL server."""
    with ExitStack() as stack:  # leaving it stops a private server
        try:
            dsn = stack.enter_context(private_postgres())
        except NoPostgres as exc:  # no server here: say so, fail nothing
            print(f"PostgreSQL: not run ({exc})")
            return
        print(f"on {dsn.split('@')[-1]}")
        sweep_section(problems, later_arrivals=1, db=dsn)
        stress_section(stress, problems, dsn)
        timed("PostgreSQL: network sweep (outcome per step, fault and protocol)",
              lambda: network_section(problems, dsn))


def network_section(problems: list[str], dsn: str) -> None:
    rows = run_network_sweep(dsn, jobs=2)
    print(network_frame(rows).to_string())
    problems.extend(f"network sweep: protocol, {r.step} / {r.fault}: {r.outcome} ({r.detail})"
                    for r in rows if r.protocol == "protocol" and r.failed)
    for name in dict.fromkeys(r.protocol for r in rows if r.protocol != "protocol"):
        caught = [f"{r.step} / {r.fault}" for r in rows if r.protocol == name and r.failed]
        print(f"{name}: caught at {', '.join(caught) or 'no step'}")
        if not caught:
            problems.append(f"the network sweep did not catch the broken protocol {name!r}")


def migration_section(problems: list[str]) -> None:
    """A migration killed at every ``migrate.*`` point, on a schema-1 file of each
    earlier engine (written by that engine, exported from git history)."""
    try:
        by_engine = sweep_every_engine()
    except NoHistory as exc:
        print(f"skipped: {exc}")
        if os.environ.get("CI"):
            problems.append(f"migration sweep: {exc}")
        return
    for commit, cases in by_engine.items():
        print(f"schema-1 file of {commit} ({ENGINES[commit]}):")
        print(migration_frame(cases).to_string())
        problems += [f"migration killed at {case.point} ({commit}): not ok"
                     for case in cases if not case.ok]


def timed(title: str, section: Callable[[], None]) -> None:
    print(f"== {title}")
    start = time.perf_counter()
    section()
    print(f"   ({time.perf_counter() - start:.1f} s)\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smaller run")
    args = parser.parse_args(argv)
    soak = os.environ.get("SOAK") == "1" or os.environ.get("QUEUE_SOAK") == "1"
    fuzz, programs = (10_000, 1000) if soak else (100, 10) if args.quick else (1000, 50)
    later_arrivals = 5 if soak else 1 if args.quick else 3
    stress = ([(8, 5000, seed) for seed in range(3)] if soak
              else [(4, 300, 0)] if args.quick else [(4, 1000, 0)])
    problems: list[str] = []
    timed("crash sweep (outcome per step and protocol)",
          lambda: sweep_section(problems, later_arrivals))
    timed("power-loss sweep (every WAL image a cut can leave)",
          lambda: powerloss_section(problems))
    timed("migration sweep (a migration killed at every step)",
          lambda: migration_section(problems))
    timed("lifetime: migrate and prune killed at every step, cut at every WAL frame",
          lambda: lifetime_section(problems))
    timed("checkpoint sweep: each command killed inside its checkpoint, then every command",
          lambda: checkpoint_section(problems, every=4 if args.quick else 1))
    timed("fuzzed input", lambda: fuzz_section(fuzz, problems))
    timed("stateful model", lambda: model_section(programs, problems))
    timed("stress", lambda: stress_section(stress, problems))
    timed("PostgreSQL: crash sweep and stress",
          lambda: postgres_section(problems, [(4, 300, 0)] if args.quick else [(4, 1000, 0)]))
    if problems:
        print("FAILED:\n  " + "\n  ".join(problems))
        return 1
    print("all invariants held")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
