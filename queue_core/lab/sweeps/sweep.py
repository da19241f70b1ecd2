"""The crash sweep: kill a real worker at every protocol step, then audit.

For each protocol of ``queue_core.lab.story.contrasts`` and each crash point it passes
through (the rows come from ``queue_core.crashpoints.POINTS``), ``run_sweep`` enqueues the same five events in a fresh database,
starts a worker process armed to die by ``os._exit`` at that point, lets a
fresh worker run the queue to completion on the model clock (stepping past
every lease deadline and backoff), and audits the file with the shared audit
(``queue_core.audit``): each effect exactly once, every message ``done`` or
``dead`` with a reason, no stale lease accepted, the money equal to the
expected total.

Two more steps are schedules rather than crashes, because a slow worker is
not a dead one: it pauses past its lease, another worker takes the message
over, and the slow one wakes up and ACKs (``stale.ack``) or, running the old
handler version that does not know ``toy``, reports a permanent failure
(``stale.fail``). They run in-process with two ``Queue`` objects on one
model clock, so their timing is exact.

Outcomes: ``ok``; ``lost money`` (a message that should be done is not, or
its effect is missing); ``doubled money`` (an effect written twice);
``stuck`` (still ready or leased after the run); ``stale ACK accepted`` (the
money is right, but a worker whose lease had expired finished the message);
``not reached`` (the armed worker never arrived at the point: a sweep bug).

With ``priorities`` (event id -> priority, e.g. ``MIXED_PRIORITIES``) the five
events are enqueued a batch per priority, so that the workers claim them in
another order; the promise is the same.

On PostgreSQL (``run_sweep(db="postgresql://...")``) every case runs in a
schema of its own on that server, created for it and dropped at the end;
all four protocols run there (the contrasts create their ledger in
PostgreSQL's SQL). A killed worker's open transaction is rolled back by the
server when its connection drops, as SQLite rolls back a transaction whose
process died.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import textwrap
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping, Sequence

from ... import audit as ledger_audit
from ...clock import ModelClock
from ...crashpoints import POINTS
from ...handler import Handler
from ...queue import Queue
from ...values import Lease
from ...worker import drain, finish
from ..story.child import collect, mode_for, reap, run_child
from ..story.contrasts import PROTOCOLS, Protocol, create_ledger
from ..servers.pgcases import Schemas
from ..story.faults import FlakyHandler
from ..story.scenario import LEASE_SECONDS, START

if TYPE_CHECKING:
    import pandas
    from matplotlib.figure import Figure

BATCH = "\n".join([
    '{"event_id": "E0001", "payload": {"category": "toy", "amount_cents": 3000}}',
    '{"event_id": "E0002", "payload": {"category": "book", "amount_cents": 10000}}',
    '{"event_id": "E0003", "payload": {"category": "pen", "amount_cents": 2000}}',
    '{"event_id": "E0004", "payload": {"category": "book", "amount_cents": 5000}}',
    '{"event_id": "E0005", "payload": {"category": ["book"], "amount_cents": 500}}',
]) + "\n"
EXPECTED_DONE = {"E0001": 3000, "E0002": 10000, "E0003": 2000, "E0004": 5000}
EXPECTED_DEAD = {"E0005": "invalid_payload"}
EXPECTED_TOTAL = sum(EXPECTED_DONE.values())
ACCEPT = ("toy",)  # the current handler version knows toy; the slow old one does not
FAULTS = {"first_attempt": ["E0003"]}  # E0003's first attempt fails transiently
SCHEDULES = ("stale.ack", "stale.fail")
STEPS = POINTS + SCHEDULES
MAX_ROUNDS = 30
# The sweeps' events with mixed priorities (the others 0): E0001 stays the first
# claimed (the stale schedules and the network sweep follow it), then E0003 (which
# fails once, and keeps its priority for the retry), E0004, and E0002 and E0005 last.
MIXED_PRIORITIES = {"E0001": 9, "E0003": 4, "E0004": 2}


@dataclass(frozen=True)
class SweepRow:
    """One cell of the sweep: a protocol, a step, and what the audit found."""

    protocol: str
    step: str
    outcome: str
    total: int
    detail: str

    @property
    def failed(self) -> bool:
        return self.outcome not in ("ok", "n/a")


def current_handler() -> Handler:
    """The handler version the sweep runs: knows ``toy``, fails E0003 once."""
    return FlakyHandler.from_spec(Handler().supporting(*ACCEPT).categories, FAULTS)


def run_sweep(protocols: Iterable[str] = tuple(PROTOCOLS), steps: Sequence[str] = STEPS, *,
              workdir: str | os.PathLike[str] | None = None, jobs: int = 2,
              crash_after: int = 1, db: str | None = None,
              priorities: Mapping[str, int] | None = None) -> list[SweepRow]:
    """Run every step against every protocol; one ``SweepRow`` each, in order.

    A step a protocol never passes through is ``n/a`` without running.
    ``jobs`` crash cases run their worker processes at the same time (each
    case has its own database file). ``crash_after`` picks which arrival at
    the point kills the worker: 1 is the first message; above 1 the crash
    lands on later messages (a retry, a permanent failure), and a point
    reached fewer times is ``n/a``. ``db``, a ``postgresql://`` connection
    string, runs every case on that server in a fresh schema (created here,
    dropped at the end) instead of a fresh file in ``workdir``. ``priorities``
    enqueues the events with those priorities (``enqueue_batch``).
    """
    with tempfile.TemporaryDirectory(prefix="sweep-", dir=workdir) as tmp, \
            _Places(Path(tmp), db, priorities or {}) as places:
        cases = [(PROTOCOLS[name], step) for name in protocols for step in steps]
        results: dict[tuple[str, str], SweepRow] = {}
        store = "sqlite" if db is None else "postgres"
        crashes = [(p, s) for p, s in cases if s in p.points_on(store)]
        for row in _crash_cases(crashes, places, max(1, jobs), crash_after):
            results[row.protocol, row.step] = row
        for proto, step in cases:
            if step in SCHEDULES:
                results[proto.name, step] = _stale_case(proto, step, _fresh(places, proto, step))
            elif step in proto.points and step not in proto.points_on(store):
                results[proto.name, step] = SweepRow(
                    proto.name, step, "n/a", 0, "inside PostgreSQL's step function: one "
                    "statement, no Python runs there")
            elif step not in proto.points_on(store):
                results[proto.name, step] = SweepRow(proto.name, step, "n/a", 0, "never passes here")
        return [results[p.name, s] for p, s in cases]


class _Places:
    """Where each case's queue lives: a new file in ``tmp``, or a new schema on ``server``."""

    def __init__(self, tmp: Path, server: str | None, priorities: Mapping[str, int]) -> None:
        self.tmp, self.priorities = tmp, priorities
        self.schemas = None if server is None else Schemas(server, "queue_sweep")

    def new(self, label: str) -> str:
        if self.schemas is None:
            return str(self.tmp / f"{label}.sqlite3")
        return self.schemas.fresh(label)

    def __enter__(self) -> "_Places":
        return self

    def __exit__(self, *exc: object) -> None:
        if self.schemas is not None:
            self.schemas.close()


def _queue(proto: Protocol, db: str, clock: ModelClock) -> Queue:
    # The sweep is about process death, not power loss: the armed worker keeps
    # synchronous=FULL, while the set-up and the recovery in this process skip
    # the fsync per commit (WAL with NORMAL survives any process crash; on
    # PostgreSQL, synchronous_commit=off survives any crash but the server's).
    return proto.open(db, clock=clock, lease_seconds=LEASE_SECONDS, synchronous="NORMAL")


def _fresh(places: _Places, proto: Protocol, step: str) -> str:
    db = places.new(f"{proto.name.replace(' ', '_')}-{step}")
    queue = _queue(proto, db, ModelClock(START))
    enqueue_batch(queue, places.priorities)
    create_ledger(queue)  # every file has one, so every file is read alike
    return db


def enqueue_batch(queue: Queue, priorities: Mapping[str, int] | None = None) -> None:
    """Enqueue ``BATCH``: in one transaction, or, with ``priorities`` (event id ->
    priority, the others 0), a batch per priority, the highest first."""
    if not priorities:
        queue.enqueue_jsonl(BATCH)
        return
    lines = BATCH.splitlines(keepends=True)
    for priority in sorted({0, *priorities.values()}, reverse=True):
        batch = "".join(line for line in lines
                        if priorities.get(json.loads(line)["event_id"], 0) == priority)
        if batch:
            queue.enqueue_jsonl(batch, priority=priority)


def _crash_cases(cases: Sequence[tuple[Protocol, str]], places: _Places, jobs: int,
                 crash_after: int) -> Iterator[SweepRow]:
    """Keep ``jobs`` armed workers running; audit each as soon as it has died."""
    running: deque[tuple[Protocol, str, str, subprocess.Popen[str]]] = deque()
    try:
        for proto, step in cases:
            db = _fresh(places, proto, step)
            running.append((proto, step, db, run_child(
                db, now=START, lease_seconds=LEASE_SECONDS, crash_at=step, mode=mode_for(step),
                accept=ACCEPT, protocol=proto.name, faults=FAULTS, crash_after=crash_after,
                wait=False)))  # type: ignore[arg-type]
            if len(running) >= jobs:
                yield _recover(*running.popleft(), crash_after)
        while running:
            yield _recover(*running.popleft(), crash_after)
    finally:
        reap(proc for *_, proc in running)


def _recover(proto: Protocol, step: str, db: str, proc: subprocess.Popen[str],
             crash_after: int) -> SweepRow:
    if not collect(proc).crashed:
        if crash_after > 1:
            return SweepRow(proto.name, step, "n/a", 0, f"reached fewer than {crash_after} times")
        return SweepRow(proto.name, step, "not reached", 0, "the worker never got there")
    clock = ModelClock(START)
    finished = run_to_completion(_queue(proto, db, clock), clock, current_handler())
    return _row(proto, step, db, finished)


def run_to_completion(queue: Queue, clock: ModelClock, handler: Handler) -> bool:
    """Drain, then step the clock to the next lease deadline or backoff, until
    nothing is ready or leased; ``False`` if that takes over ``MAX_ROUNDS``.
    ``queue`` finishes leases its protocol's way (``Protocol.open``)."""
    for _ in range(MAX_ROUNDS):
        drain(queue, handler)
        due = [m.lease_until if m.lease_until is not None else m.available_at
               for m in queue.messages() if m.state in ("ready", "leased")]
        if not due:
            return True
        clock.set(max(clock.now() + 1, min(due)))
    return False


def _stale_case(proto: Protocol, step: str, db: str) -> SweepRow:
    """A slow worker pauses past its lease on E0001; another worker takes it
    over (generation 2); the slow one wakes and finishes first; then the
    current holder finishes; then the queue runs to completion."""
    clock = ModelClock(START)
    slow, other = _queue(proto, db, clock), _queue(proto, db, clock)
    handler = current_handler()
    old_version = Handler() if step == "stale.fail" else handler
    stale_lease = slow.claim()
    if stale_lease is None or stale_lease.event_id != "E0001":
        raise RuntimeError(f"the slow worker should hold E0001, got {stale_lease}")
    drain(other, handler)
    clock.set(stale_lease.lease_until)  # the slow worker's lease has just expired
    current = _claim_event(other, "E0001", handler)
    woke = finish(slow, stale_lease, old_version)
    then = finish(other, current, handler)
    finished = run_to_completion(other, clock, handler)
    row = _row(proto, step, db, finished)
    woke_text = " ".join(filter(None, (woke.kind, woke.code)))
    detail = f"slow worker: {woke_text}; current worker: {then.kind}; {row.detail}"
    return SweepRow(row.protocol, row.step, row.outcome, row.total, detail)


def _claim_event(queue: Queue, event_id: str, handler: Handler) -> Lease:
    while (lease := queue.claim()) is not None:
        if lease.event_id == event_id:
            return lease
        finish(queue, lease, handler)
    raise RuntimeError(f"{event_id} was never due")


def _row(proto: Protocol, step: str, db: str, finished: bool) -> SweepRow:
    outcome, total, detail = audit(db, finished)
    return SweepRow(proto.name, step, outcome, total, detail)


def audit(db: str | os.PathLike[str], finished: bool = True) -> tuple[str, int, str]:
    """Classify the final file or schema: ``(outcome, money, explanation)``."""
    snap = ledger_audit.snapshot(db)
    return classify(snap, ledger_audit.check(snap), finished)


def classify(snap: ledger_audit.Snapshot, findings: Sequence[ledger_audit.Finding],
             finished: bool) -> tuple[str, int, str]:
    """Name the worst thing the audit found, and check this scenario's promise."""
    total, state = snap.money, snap.messages
    named = {f.name: f for f in findings}
    if "integrity_check" in named:
        return "corrupt", total, str(named["integrity_check"])
    twice = sorted({f.event_id or "" for f in findings if f.name == "effect_written_twice"})
    if twice or total > EXPECTED_TOTAL:
        return "doubled money", total, f"{', '.join(twice)} written twice: {total}"
    pending = sorted(e for e, m in state.items() if m.state in ("ready", "leased"))
    if pending or not finished:
        return "stuck", total, f"{', '.join(pending)} still pending"
    effects = snap.effects
    missing = sorted(e for e in EXPECTED_DONE if state[e].state != "done" or e not in effects)
    wrong_dead = sorted(e for e, reason in EXPECTED_DEAD.items()
                        if (state[e].state, state[e].last_error) != ("dead", reason))
    if missing or wrong_dead or total != EXPECTED_TOTAL:
        found = ", ".join(f"{e} {state[e].state}" + ("" if e in effects else " without effect")
                          for e in missing + wrong_dead)
        return "lost money", total, f"{found}: {total}"
    stale = sorted({f.event_id or "" for f in findings if f.name == "stale_lease_accepted"})
    if stale:
        return "stale ACK accepted", total, f"{', '.join(stale)} finished by an expired lease"
    if findings:
        return "audit finding", total, "; ".join(str(f) for f in findings[:3])
    return "ok", total, f"every effect once: {total}"


def sweep_frame(rows: Sequence[SweepRow]) -> "pandas.DataFrame":
    """The sweep as a table: steps down, protocols across, outcomes in the cells."""
    import pandas as pd

    frame = pd.DataFrame([{"step": r.step, "protocol": r.protocol, "outcome": r.outcome}
                          for r in rows])
    table = frame.pivot(index="step", columns="protocol", values="outcome")
    steps = [s for s in STEPS if s in set(table.index)]
    protocols = list(dict.fromkeys(r.protocol for r in rows))
    return table.loc[steps, protocols].rename_axis(columns=None)


COLOURS = {"ok": "#4daf4a", "lost money": "#e41a1c", "doubled money": "#984ea3",
           "stuck": "#ff7f00", "stale ACK accepted": "#377eb8", "not reached": "#000000",
           "n/a": "#e0e0e0", "corrupt": "#a65628", "audit finding": "#666666"}


def plot_sweep(rows: Sequence[SweepRow], title: str = "Crash sweep: outcome per step and protocol"
               ) -> "Figure":
    """Draw the sweep: steps on the y axis, protocols on the x axis, outcome as colour."""
    import matplotlib.pyplot as plt

    table = sweep_frame(rows)
    # a row a third of an inch high, so that a two-line outcome fits in its cell
    fig, ax = plt.subplots(figsize=(9.5, max(6.5, 1.6 + 0.33 * len(table.index))))
    draw_outcomes(ax, table, ("ok", "n/a"), lambda outcome: textwrap.fill(outcome, 14),
                  linespacing=1.0)
    ax.set_xticks(range(len(table.columns)), [textwrap.fill(c, 12) for c in table.columns])
    ax.set_yticks(range(len(table.index)), table.index)
    ax.set_xlabel("protocol (the last three are deliberately broken)")
    ax.set_ylabel("where the worker died (or paused: stale.*)")
    ax.set_title(title)
    outcome_legend(ax, table)
    fig.tight_layout()
    return fig


def draw_outcomes(ax: Any, table: "pandas.DataFrame", quiet: Sequence[str],
                  label: Callable[[str], str], **text: Any) -> None:
    """Colour each cell of ``table`` (cases down, protocols across) by its outcome,
    write ``label(outcome)`` in each whose outcome is not ``quiet``, and fit the axes
    to the grid: the picture the crash and the network sweep share."""
    from matplotlib.patches import Rectangle

    for y, key in enumerate(table.index):
        for x, column in enumerate(table.columns):
            outcome = table.loc[key, column]
            ax.add_patch(Rectangle((x - 0.48, y - 0.45), 0.96, 0.9,
                                   color=COLOURS.get(outcome, "#888888")))
            if outcome not in quiet:
                ax.text(x, y, label(outcome), ha="center", va="center", fontsize=8,
                        color="white", **text)
    ax.set_xlim(-0.5, len(table.columns) - 0.5)
    ax.set_ylim(len(table.index) - 0.5, -0.5)


def outcome_legend(ax: Any, table: "pandas.DataFrame") -> None:
    """The legend of the outcomes ``table`` holds, in ``COLOURS``' order, beside the grid."""
    from matplotlib.patches import Patch

    seen = [o for o in COLOURS if o in set(table.values.ravel())]
    ax.legend(handles=[Patch(color=COLOURS[o], label=o) for o in seen], loc="upper left",
              bbox_to_anchor=(1.01, 1.0), title="outcome", frameon=False)


# -- the queue's lifetime: a migration and a prune killed at each of their steps -------------

@dataclass(frozen=True)
class LifetimeRow:
    """One lifetime case: the run (``migrate <file>`` or ``prune``), the crash
    point of ``crashpoints.LIFETIME_POINTS``, which arrival at it killed the
    process, and what ``lifetime.judge_migrate`` or ``judge_prune`` found."""

    run: str
    step: str
    arrival: int
    outcome: str
    detail: str

    @property
    def failed(self) -> bool:
        return self.outcome not in ("ok", "n/a")


_LIFETIME_CHILD = textwrap.dedent("""
    import sys
    from pathlib import Path
    from queue_core import crashpoints, migrate
    from queue_core.lab.sweeps import lifetime
    crashpoints.arm(sys.argv[2], after=int(sys.argv[3]))
    if sys.argv[2].startswith("migrate."):
        migrate(sys.argv[1])
    else:
        lifetime.run_prune(Path(sys.argv[1]))
""")


def run_lifetime_sweep(schema1_files: Sequence[str | os.PathLike[str]], *,
                       prune_arrivals: int = 3,
                       workdir: str | os.PathLike[str] | None = None) -> list[LifetimeRow]:
    """Kill a real process (``os._exit``) at every migrate and prune step, then judge
    the file it left (``queue_core.lab.sweeps.lifetime``): a migration of a copy
    of each schema-1 file, and the prune run killed at the 1st to
    ``prune_arrivals``-th arrival at each of its points (one per batch: the
    crash lands in a later batch; a point reached fewer times is ``n/a``)."""
    import subprocess
    import sys

    from ...crashpoints import CRASH_EXIT_CODE, LIFETIME_POINTS
    from . import lifetime

    rows: list[LifetimeRow] = []
    with tempfile.TemporaryDirectory(prefix="sweep-lifetime-", dir=workdir) as tmp:
        folder = Path(tmp)
        refs = {f"migrate {Path(source).stem}": (lifetime.migrate_end(source, folder), source)
                for source in schema1_files}
        prune_ref = lifetime.prune_end(folder)
        cases = [(run, point, 1) for run in refs
                 for point in LIFETIME_POINTS if point.startswith("migrate.")]
        cases += [("prune", point, arrival) for arrival in range(1, prune_arrivals + 1)
                  for point in LIFETIME_POINTS if point.startswith("prune.")]
        for n, (run, point, arrival) in enumerate(cases):
            db = folder / f"case-{n}.sqlite3"
            if run == "prune":
                lifetime.prune_source(db)
            else:
                lifetime.schema1_source(refs[run][1], db)
            child = subprocess.run([sys.executable, "-c", _LIFETIME_CHILD, str(db), point,
                                    str(arrival)], capture_output=True, text=True, timeout=120)
            if child.returncode != CRASH_EXIT_CODE:
                if child.returncode == 0 and arrival > 1:
                    rows.append(LifetimeRow(run, point, arrival, "n/a",
                                            f"reached fewer than {arrival} times"))
                else:
                    rows.append(LifetimeRow(run, point, arrival, "not reached",
                                            f"exit {child.returncode}: {child.stderr[-300:]}"))
                continue
            if run == "prune":
                outcome, detail = lifetime.judge_prune(db, prune_ref)
            else:
                outcome, detail = lifetime.judge_migrate(db, refs[run][0])
            rows.append(LifetimeRow(run, point, arrival, outcome, detail))
    return rows
