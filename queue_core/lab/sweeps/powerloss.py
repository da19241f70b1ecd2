"""The power-loss sweep: every WAL image a power cut can leave, recovered and audited.

A claim commits without an fsync of its own; everything a caller is told is
durable (enqueue, the ACK with its effect, fail, redrive) commits at
``synchronous=FULL``. ``run_powerloss`` checks what that costs when the
power goes: it plays a scenario on the model clock with automatic
checkpoints off (``PRAGMA wal_autocheckpoint = 0`` on every connection of the
run, and one connection held open so that closing the others never folds
the log into the database file), so every commit stays in the ``-wal`` file
as appended frames. After each commit it notes the log's length, whether
the transaction committed at FULL (read on its own connection), and the
journal rows it wrote: what its caller was told had happened.

What a power cut can leave: a FULL commit's fsync makes every frame
written before it durable; frames written since the last one may be lost.
So a cut after the first ``cut`` commits returned leaves the log cut at the
end of some commit ``kept``, ``last FULL commit <= kept <= cut`` (the rule
and the log's format are in ``wal``).

For every pair: the database file and the log truncated after commit
``kept`` are copied to a fresh folder, SQLite recovers the image when it
opens it, and the shared audit (``queue_core.audit``) reads it: no finding;
every commit whose call had returned before the cut (all but claims) still
there, effects included; then a worker continues from the image on the
model clock until nothing is ready or leased, and the operator redrives
what is dead as the scenario's last step does: every message must end
exactly once, with the expected money, and the audit must find nothing.

Run at ``synchronous=NORMAL`` for every transaction, nothing is fsynced, so
every commit boundary is a possible image: an ACK that returned can vanish.
The database stays consistent and the next worker does the work again, one
effect in the file, but the caller was told "done" and an external call
would be made twice: ``lost acknowledged ACK``.
"""

from __future__ import annotations

import os
import tempfile
import textwrap
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

from ... import audit
from ...clock import ModelClock
from ...handler import Handler
from ...migrations import migrate
from ...queue import Queue
from ...sqlite import connect
from ...values import State, Transition
from ...worker import drain, finish, process_one
from ..story.scenario import DEMO_JSONL, LEASE_SECONDS, START
from .sweep import BATCH, EXPECTED_DEAD, EXPECTED_DONE, current_handler, run_to_completion
from .wal import Frame, Prefix, prefixes, read_wal, wal_length

if TYPE_CHECKING:
    import sqlite3

    import pandas
    from matplotlib.figure import Figure

FULL = 2  # what ``PRAGMA synchronous`` answers at FULL
LEVELS = ("FULL", "NORMAL")


@dataclass(frozen=True)
class Commit:
    """One committed transaction of a run: its kind, whether it was fsynced
    (FULL), the WAL frames up to its commit frame, the model time, and the
    journal rows it wrote."""

    kind: str
    durable: bool
    frames: int
    at: int
    journal: tuple[Transition, ...]


# -- recording a run -----------------------------------------------------------------------

class _Log:
    """The commits of one run, noted as each returns."""

    def __init__(self, db: Path) -> None:
        self.wal = Path(f"{db}-wal")
        self.commits: list[Commit] = []

    def note(self, kind: str, durable: bool, at: int, journal: list[Transition]) -> None:
        if not self.wal.exists():
            return  # nothing written yet
        page_size, frames = read_wal(self.wal)
        known = self.commits[-1].frames if self.commits else 0
        if len(frames) == known:
            return  # an empty transaction (a claim that found nothing) writes no frame
        seen = sum(len(c.journal) for c in self.commits)
        self.commits.append(Commit(kind, durable, len(frames), at, tuple(journal[seen:])))


class _Recorded(Queue):
    """The queue, unchanged, noting each commit's kind, durability and journal rows."""

    def __init__(self, path: Path, log: _Log, **options: Any) -> None:
        super().__init__(path, **options)
        self._log, self._kind = log, "?"

    def enqueue(self, *args: Any, **options: Any) -> Any:
        return self._as("enqueue", super().enqueue, *args, **options)

    def claim_batch(self, *args: Any) -> Any:
        return self._as("claim", super().claim_batch, *args)

    def complete(self, *args: Any) -> Any:
        return self._as("ACK", super().complete, *args)

    def complete_batch(self, *args: Any) -> Any:
        return self._as("ACK", super().complete_batch, *args)

    def complete_and_claim(self, *args: Any) -> Any:
        return self._as("ACK+claim", super().complete_and_claim, *args)

    def release(self, *args: Any) -> Any:
        return self._as("release", super().release, *args)

    def fail(self, *args: Any, **kwargs: Any) -> Any:
        return self._as("fail", super().fail, *args, **kwargs)

    def redrive(self, *args: Any) -> Any:
        return self._as("redrive", super().redrive, *args)

    def _as(self, kind: str, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        self._kind = kind
        try:
            return call(*args, **kwargs)
        finally:
            self._kind = "?"

    def transaction(self, *, relaxed: bool = False) -> AbstractContextManager[sqlite3.Connection]:
        return self._noted(super().transaction(relaxed=relaxed))

    @contextmanager
    def _noted(self, inner: AbstractContextManager[sqlite3.Connection]
               ) -> Iterator[sqlite3.Connection]:
        with inner as conn:
            conn.execute("PRAGMA wal_autocheckpoint = 0")
            durable = conn.execute("PRAGMA synchronous").fetchone()[0] == FULL
            yield conn
            journal = audit.read_journal(conn)
        self._log.note(self._kind, durable, self.clock.now(), journal)


# -- the scenarios -------------------------------------------------------------------------

OpenQueue = Callable[[], Queue]


def reference(open_queue: OpenQueue, clock: ModelClock) -> None:
    """The reference demo's steps in one process; E0003's worker never returns."""
    queue, handler = open_queue(), Handler()
    queue.enqueue_jsonl(DEMO_JSONL)
    process_one(queue, handler)                        # E0001 done
    lease = queue.claim()
    assert lease is not None
    queue.fail(lease, "transient_error")               # E0002 due again at 1001
    queue.claim()                                      # E0003: its worker dies holding it
    process_one(queue, handler)                        # E0004 (toy): dead
    for t in (START + 1, START + 2):                   # E0002 retried; E0003 recovered
        clock.set(t)
        process_one(queue, handler)
    queue.enqueue_jsonl(DEMO_JSONL)                    # five duplicates: writes nothing
    queue.redrive("E0004")
    process_one(queue, handler)                        # without the fix: dead again
    queue.redrive("E0004")
    process_one(queue, handler.supporting("toy"))      # with it: done


def two_workers(open_queue: OpenQueue, clock: ModelClock) -> None:
    """A slow worker holds E0001 past its lease while another drains: a
    transient failure (E0003), an invalid payload (E0005), a recovery."""
    slow, busy, handler = open_queue(), open_queue(), current_handler()
    slow.enqueue_jsonl(BATCH)
    stale = slow.claim()
    assert stale is not None
    drain(busy, handler)                               # E0003 fails once, E0005 dead
    clock.set(START + 1)
    drain(busy, handler)                               # E0003 done
    clock.set(stale.lease_until)
    drain(busy, handler)                               # E0001 recovered, generation 2, done
    finish(slow, stale, handler)                       # stale: refused, writes nothing


@dataclass(frozen=True)
class Scenario:
    """A run to record, the handler that continues it, and its fixed end."""

    name: str
    play: Callable[[OpenQueue, ModelClock], None]
    handler: Callable[[], Handler]
    done: dict[str, int]
    dead: dict[str, str]


SCENARIOS = {
    "reference demo": Scenario("reference demo", reference, lambda: Handler().supporting("toy"),
                               {"E0001": 10000, "E0002": 2000, "E0003": 5000, "E0004": 3000}, {}),
    "two workers": Scenario("two workers", two_workers, current_handler,
                            EXPECTED_DONE, EXPECTED_DEAD),
}


@dataclass(frozen=True)
class Recording:
    """A recorded run: the database file, the whole log, and its commits."""

    database: bytes
    wal: bytes
    page_size: int
    frames: tuple[Frame, ...]
    commits: tuple[Commit, ...]


def record(scenario: Scenario, folder: Path, synchronous: str) -> Recording:
    """Play ``scenario`` at ``synchronous`` with checkpoints off; keep both files."""
    db = folder / f"{scenario.name.replace(' ', '_')}-{synchronous}.sqlite3"
    clock, log = ModelClock(START), _Log(db)

    def open_queue() -> Queue:
        return _Recorded(db, log, clock=clock, lease_seconds=LEASE_SECONDS,
                         synchronous=synchronous)

    open_queue()  # creates the file
    keeper = connect(db)  # open throughout: the last connection to close would checkpoint
    try:
        keeper.execute("PRAGMA wal_autocheckpoint = 0")
        keeper.execute("PRAGMA schema_version").fetchone()  # really opens the file
        scenario.play(open_queue, clock)
        page_size, frames = read_wal(log.wal)
        if [c.frames for c in log.commits] != [n + 1 for n, f in enumerate(frames) if f.is_commit]:
            raise RuntimeError("the noted commits do not match the commit frames of the log")
        return Recording(db.read_bytes(), log.wal.read_bytes(), page_size, tuple(frames),
                         tuple(log.commits))
    finally:
        keeper.close()


# -- checking every image -------------------------------------------------------------------

@dataclass(frozen=True)
class PowerLossRow:
    """One image a power cut can leave, and what the audit found.

    ``cut``: commits whose call had returned; ``kept``: commits the image
    holds; ``kind`` and ``durable``: the last kept commit's (``none`` for
    an image of nothing); ``outcome``: ``ok``, ``lost acknowledged ACK``
    (or ``enqueue``, ``fail``, ``redrive``), ``doubled money``, ``lost
    money``, ``stuck`` or ``audit finding``; ``total``: the money once a
    worker has finished the image.
    """

    scenario: str
    synchronous: str
    cut: int
    kept: int
    kind: str
    durable: bool
    outcome: str
    total: int
    detail: str


@dataclass(frozen=True)
class PowerLossReport:
    """Every image checked, and the commits each run made."""

    rows: tuple[PowerLossRow, ...]
    commits: dict[tuple[str, str], tuple[Commit, ...]]

    def select(self, scenario: str | None = None,
               synchronous: str | None = None) -> list[PowerLossRow]:
        return [r for r in self.rows if scenario in (None, r.scenario)
                and synchronous in (None, r.synchronous)]

    @property
    def violations(self) -> list[PowerLossRow]:
        """Images that break an invariant; at NORMAL a lost acknowledged
        commit is the documented trade, not a violation."""
        return [r for r in self.rows if r.outcome != "ok" and not (
            r.synchronous == "NORMAL" and r.outcome.startswith("lost acknowledged"))]

    @property
    def lost_acks(self) -> list[PowerLossRow]:
        return [r for r in self.rows if r.outcome == "lost acknowledged ACK"]


def run_powerloss(scenarios: Sequence[str] = tuple(SCENARIOS), levels: Sequence[str] = LEVELS,
                  *, workdir: str | os.PathLike[str] | None = None) -> PowerLossReport:
    """Record each scenario at each level, then check every image a cut can leave."""
    rows: list[PowerLossRow] = []
    commits: dict[tuple[str, str], tuple[Commit, ...]] = {}
    with tempfile.TemporaryDirectory(prefix="powerloss-", dir=workdir) as tmp:
        for name in scenarios:
            for level in levels:
                scenario, folder = SCENARIOS[name], Path(tmp) / f"{name}-{level}".replace(" ", "_")
                folder.mkdir()
                run = record(scenario, folder, level)
                commits[name, level] = run.commits
                rows.extend(_check_run(scenario, level, run, folder))
    return PowerLossReport(tuple(rows), commits)


def _check_run(scenario: Scenario, level: str, run: Recording,
               folder: Path) -> Iterator[PowerLossRow]:
    offered = prefixes(run.frames, [c.durable for c in run.commits])
    images: dict[int, tuple[audit.Snapshot, str, int, str]] = {}
    for prefix in offered:
        if prefix.kept not in images:
            images[prefix.kept] = _image(scenario, run, prefix, folder)
        snap, outcome, total, detail = images[prefix.kept]
        last = run.commits[prefix.kept - 1] if prefix.kept else None
        if outcome == "ok":
            outcome, detail = _promises(snap, run.commits[:prefix.cut], detail)
        yield PowerLossRow(scenario.name, level, prefix.cut, prefix.kept,
                           last.kind if last else "none", bool(last and last.durable),
                           outcome, total, detail)


def _image(scenario: Scenario, run: Recording, prefix: Prefix,
           folder: Path) -> tuple[audit.Snapshot, str, int, str]:
    """Recover the image that keeps ``prefix.kept`` commits; audit it, continue, audit."""
    db = folder / f"kept-{prefix.kept}.sqlite3"
    db.write_bytes(run.database)
    Path(f"{db}-wal").write_bytes(run.wal[:wal_length(run.page_size, prefix.frames)])
    snap = audit.snapshot(db)  # opening it is SQLite's recovery
    found = audit.check(snap)
    if found:
        return snap, "audit finding", snap.money, "; ".join(map(str, found[:3]))
    at = run.commits[prefix.kept - 1].at if prefix.kept else START
    outcome, total, detail = _continue(scenario, db, ModelClock(at), snap)
    return snap, outcome, total, detail


def _continue(scenario: Scenario, db: Path, clock: ModelClock,
              image: audit.Snapshot) -> tuple[str, int, str]:
    """Workers finish the image; the operator redrives what is dead, once."""
    queue, handler = Queue(db, clock=clock, lease_seconds=LEASE_SECONDS), scenario.handler()
    finished = run_to_completion(queue, clock, handler)
    for event_id, message in audit.snapshot(db).messages.items():
        if message.state == "dead":
            queue.redrive(event_id)
    finished = run_to_completion(queue, clock, handler) and finished
    snap = audit.snapshot(db)
    found = audit.check(snap)
    if any(f.name in ("effect_written_twice", "double_ack") for f in found):
        return "doubled money", snap.money, "; ".join(str(f) for f in found[:3])
    if found:
        return "audit finding", snap.money, "; ".join(str(f) for f in found[:3])
    stored = set(image.messages)
    expected = {e: ("done" if e in scenario.done else "dead") for e in stored}
    money = sum(amount for e, amount in scenario.done.items() if e in stored)
    states = snap.states()
    if not finished or any(s in ("ready", "leased") for s in states.values()):
        pending = sorted(e for e, s in states.items() if s in ("ready", "leased"))
        return "stuck", snap.money, f"still pending: {', '.join(pending)}"
    if states != expected or snap.money != money or set(snap.effects) != set(scenario.done) & stored:
        return "lost money", snap.money, f"states {states}, money {snap.money}, expected {money}"
    return "ok", snap.money, f"{len(stored)} messages, each once: {snap.money}"


def _promises(image: audit.Snapshot, returned: Sequence[Commit],
              detail: str) -> tuple[str, str]:
    """Did every commit whose call returned (claims aside) survive in the image?"""
    journal = set(image.journal)
    lost = [c for c in returned if c.kind != "claim" and not set(c.journal) <= journal]
    lost += [c for c in returned if c.kind in ACKS and c not in lost
             and not _completed(c) <= set(image.effects)]
    if not lost:
        return "ok", detail
    worst = next((c for c in lost if c.kind in ACKS), lost[0])
    gone = "; ".join(f"{c.kind} of {', '.join(sorted({t.event_id for t in c.journal}))}"
                     for c in lost)
    redone = sorted({e for c in lost if c.kind in ACKS for e in _completed(c)}
                    & set(image.messages))
    again = f"; the next worker did {', '.join(redone)} again" if redone else ""
    kind = "ACK" if worst.kind in ACKS else worst.kind
    return f"lost acknowledged {kind}", f"returned, then gone: {gone}{again}"


def _completed(commit: Commit) -> set[str]:
    """The messages a commit marked done (an ACK that claims the next also leases one)."""
    return {t.event_id for t in commit.journal if t.to_state == State.DONE}


# -- pictures -------------------------------------------------------------------------------

def powerloss_frame(report: PowerLossReport) -> "pandas.DataFrame":
    """Every checked image as a table row."""
    import pandas as pd

    return pd.DataFrame([vars(row) for row in report.rows])


# Outcomes from harmless to worst; the three lost writes other than the ACK share a colour.
SEVERITY = ("ok", "lost acknowledged redrive", "lost acknowledged fail",
            "lost acknowledged enqueue", "lost acknowledged ACK", "stuck", "lost money",
            "doubled money", "audit finding")
OUTCOME_COLOURS = {"ok": "#4daf4a", "lost acknowledged ACK": "#e41a1c",
                   "lost acknowledged write": "#ff7f00", "stuck": "#ffd92f",
                   "lost money": "#a50f15", "doubled money": "#984ea3", "audit finding": "#666666"}
KIND_LETTERS = {"none": "-", "enqueue": "E", "claim": "C", "ACK": "A", "ACK+claim": "AC",
                "fail": "F", "redrive": "R", "release": "L"}
ACKS = ("ACK", "ACK+claim")  # the commits that carry an effect
LEVEL_LABELS = {"FULL": "the protocol: claims NORMAL, the rest FULL",
                "NORMAL": "everything NORMAL"}


def _shown(outcome: str) -> str:
    lost_write = outcome.startswith("lost acknowledged") and outcome != "lost acknowledged ACK"
    return "lost acknowledged write" if lost_write else outcome


def plot_powerloss(report: PowerLossReport,
                   title: str = "Power-loss sweep: every image a power cut can leave") -> "Figure":
    """One row per scenario and durability, one cell per commit the image ends
    at; colour: the worst outcome of any cut that can leave that image;
    letter: the kind of that commit, boxed when it was fsynced (FULL)."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch, Rectangle

    runs, shown = list(report.commits), set()
    width = max(len(c) for c in report.commits.values()) + 1
    fig, ax = plt.subplots(figsize=(max(8.0, 0.45 * width + 3.5), 1.1 * len(runs) + 1.8))
    for y, (name, level) in enumerate(runs):
        worst: dict[int, str] = {}
        for row in report.select(name, level):
            worst[row.kept] = max(worst.get(row.kept, "ok"), row.outcome, key=SEVERITY.index)
        shown |= {_shown(outcome) for outcome in worst.values()}
        kinds = ["none", *(c.kind for c in report.commits[name, level])]
        durable = [False, *(c.durable for c in report.commits[name, level])]
        for x, kind in enumerate(kinds):
            ax.add_patch(Rectangle((x - 0.45, y - 0.4), 0.9, 0.8,
                                   color=OUTCOME_COLOURS[_shown(worst[x])]))
            box = {"boxstyle": "square,pad=0.15", "fc": "none", "ec": "black"} if durable[x] else None
            ax.text(x, y, KIND_LETTERS.get(kind, "?"), ha="center", va="center", fontsize=9,
                    bbox=box)
    ax.set_xlim(-0.6, width - 0.4)
    ax.set_ylim(len(runs) - 0.5, -0.5)
    ax.set_xticks(range(width))
    ax.set_yticks(range(len(runs)), [f"{name}\n{textwrap.fill(LEVEL_LABELS[level], 24)}"
                                     for name, level in runs])
    ax.set_xlabel("commits the recovered image keeps (E enqueue, C claim, A ACK, AC ACK that "
                  "claims the next, F fail, R redrive; boxed: fsynced at FULL)")
    ax.set_title(title)
    seen = [o for o in OUTCOME_COLOURS if o in shown]
    ax.legend(handles=[Patch(color=OUTCOME_COLOURS[o], label=o) for o in seen],
              loc="upper left", bbox_to_anchor=(1.01, 1.0), title="worst outcome of any cut\nthat leaves this image", frameon=False)
    fig.tight_layout()
    return fig


# -- the queue's lifetime: every frame prefix of a migration's and a prune's log ------------

@dataclass(frozen=True)
class LifetimeImage:
    """One image a power cut during a migration or a prune can leave: the run,
    the WAL frames the image keeps (``frames``) and the whole commits among
    them, and what ``lifetime.judge_migrate`` or ``judge_prune`` found."""

    run: str
    frames: int
    commits: int
    outcome: str
    detail: str


@dataclass(frozen=True)
class LifetimePowerLoss:
    """Every frame prefix of each run's log, judged; the frames and commits of each run."""

    images: tuple[LifetimeImage, ...]
    frames: dict[str, int]
    commits: dict[str, int]

    @property
    def violations(self) -> list[LifetimeImage]:
        return [image for image in self.images if image.outcome != "ok"]


def run_lifetime_powerloss(schema1_files: Sequence[str | os.PathLike[str]], *,
                           workdir: str | os.PathLike[str] | None = None) -> LifetimePowerLoss:
    """Migrate a copy of each schema-1 file, and prune the prune run's file, with
    the log kept whole; then recover the database file with every prefix of
    that log, frame by frame (a cut inside a transaction leaves any number of
    its frames; recovery keeps whole commits only), and judge each image
    (``queue_core.lab.sweeps.lifetime``): version 1 intact or a later version
    complete; prune's batches whole or absent."""
    from . import lifetime

    images: list[LifetimeImage] = []
    frames: dict[str, int] = {}
    commits: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="powerloss-lifetime-", dir=workdir) as tmp:
        folder = Path(tmp)
        runs = [(f"migrate {Path(source).stem}", lifetime.migrate_end(source, folder),
                 lambda db, source=source: lifetime.schema1_source(source, db),
                 lambda db: migrate(db), lifetime.judge_migrate)
                for source in schema1_files]
        runs.append(("prune", lifetime.prune_end(folder), lifetime.prune_source,
                     lifetime.run_prune, lifetime.judge_prune))
        for name, ref, make, act, judge in runs:
            db = make(folder / f"{name.replace(' ', '_')}.sqlite3")
            base, wal, page_size, log = _record_frames(db, lambda: act(db))
            whole = audit.snapshot(db)
            frames[name], commits[name] = len(log), sum(f.is_commit for f in log)
            for kept in range(len(log) + 1):
                image = folder / f"{name.replace(' ', '_')}-{kept}.sqlite3"
                image.write_bytes(base)
                Path(f"{image}-wal").write_bytes(wal[:wal_length(page_size, kept)])
                if kept == len(log) and audit.snapshot(image) != whole:
                    raise RuntimeError(f"{name}: the file and its whole log are not the run")
                outcome, detail = judge(image, ref)
                images.append(LifetimeImage(name, kept, sum(f.is_commit for f in log[:kept]),
                                            outcome, detail))
                for leftover in (image, Path(f"{image}-wal"), Path(f"{image}-shm")):
                    leftover.unlink(missing_ok=True)
    return LifetimePowerLoss(tuple(images), frames, commits)


def _record_frames(db: Path, act: Callable[[], None]) -> tuple[bytes, bytes, int, list[Frame]]:
    """Run ``act`` on ``db`` (whose connections are all closed: no ``-wal``) with
    its whole log kept: a reader holds a snapshot from before it throughout,
    so no checkpoint can copy a frame into the file or start the log again.
    Returns the file before, the log after, its page size and its frames."""
    wal = Path(f"{db}-wal")
    if wal.exists() and wal.stat().st_size:
        raise RuntimeError(f"{wal} holds frames: the file alone is not the state")
    base = db.read_bytes()
    keeper = connect(db)
    try:
        keeper.execute("BEGIN")
        keeper.execute("SELECT count(*) FROM sqlite_master").fetchone()  # the snapshot
        act()
        log = wal.read_bytes()
        page_size, frames = read_wal(wal)
        keeper.execute("COMMIT")
    finally:
        keeper.close()
    if len(log) != wal_length(page_size, len(frames)):
        raise RuntimeError("the log was started again: the recording is not one log")
    return base, log, page_size, frames
