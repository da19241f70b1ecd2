"""Every interleaving: run every schedule of a small scenario on the real engine.

The crash sweep kills one worker at each step of one schedule; the stress run
tries many random schedules. Neither says "no schedule breaks it". The
explorer does, for a small scenario: it runs every schedule on the real
``Queue`` (or a broken contrast's subclass) on a real SQLite file, audits the
file after every step with ``queue_core.audit``, and checks the scenario's
promise at every end.

The unit of interleaving is one transaction of the engine. SQLite runs one
writer at a time, so a transaction is atomic to every other worker: nothing
can happen "inside" a claim, an ACK, a fail, a redrive or an enqueue. Besides
transactions, a schedule has two more kinds of step:

- the model clock jumps to the next moment something is due (a lease
  deadline, the end of a backoff); a worker that is not scheduled while the
  clock jumps has *stalled* past its lease;
- a worker that holds a lease crashes and restarts with nothing: it forgets
  its lease. A crash inside a transaction leaves what a crash just before it
  leaves (SQLite rolls the transaction back; notebook 07 shows it with real
  processes), so crashes between steps cover every crash point.

The scenario, the steps and the workers, each stepped one transaction at a
time, are ``queue_core.lab.sweeps.schedule``. Besides the audit, every step
that claims is checked against the claim's order (``order.passed_over``: no
due message with a smaller key passed over), which the priorities of a
scenario such as ``PRIORITY`` put to the test.

Depth first, every schedule is run; between branches the database file is
restored from its image (the bytes of the file: every step closes its
connection, so SQLite has checkpointed the WAL into the file). Writing the
image back in place (``os.pwrite``) takes microseconds. Two schedules that
reach the same stored state (messages and effect rows), clock, worker states
and remaining budgets continue alike, so they are merged. The journal is left
out of that key: its ``seq`` and ``at`` differ between orders that end alike,
and the audit's journal checks of a clean history depend only on the stored
state it led to. Since the state graph is recorded, the shortest schedule to
a violation is found breadth first on it, and ``replay`` runs it again on a
fresh file.
"""

from __future__ import annotations

import os
import re
import tempfile
import time
from collections import Counter, deque
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from ... import audit
from ...values import Lease, State
from ..story.contrasts import PROTOCOLS, Protocol
from ..plots.timeline import FIG_WIDTH, Mark
from .order import last_seq, passed_over
from .schedule import (DEFAULT, FINISH, IDLE, PRIORITY, PRUNE, SMALL, SPLIT, Runner, Scenario,
                       Step, World, held)

__all__ = ["DEFAULT", "FINISH", "IDLE", "PRIORITY", "PRUNE", "SMALL", "SPLIT", "Exploration",
           "Runner", "Scenario", "Step", "Violation", "World", "broken_promise", "explore",
           "explore_all", "held", "plot_state_space", "replay", "state_key"]

if TYPE_CHECKING:
    from matplotlib.figure import Figure

@dataclass(frozen=True)
class Violation:
    """A schedule that broke a promise: its steps, what was found, the journal then."""

    schedule: tuple[Step, ...]
    findings: tuple[str, ...]
    journal: tuple[Any, ...]


@dataclass
class Exploration:
    """What one exhaustive run found. ``schedules`` counts every maximal schedule
    (as a tree without merging would run them); ``states`` the distinct ones."""

    protocol: str
    scenario: Scenario
    merged: bool
    states: int = 0
    steps_run: int = 0
    tree_steps: int = 0
    schedules: int = 0
    ends: int = 0
    finished_after_bound: int = 0
    seconds: float = 0.0
    violations: list[Violation] = field(default_factory=list)
    shortest: Violation | None = None
    states_by_depth: list[int] = field(default_factory=list)
    schedules_by_length: dict[int, int] = field(default_factory=dict)


def state_key(snap: audit.Snapshot, world: World) -> tuple[Any, ...]:
    """What decides the future: stored rows, clock, workers, budgets (not the journal)."""
    rows = tuple(sorted((r.table, r.event_id, r.category, r.amount_cents) for r in snap.effect_rows))
    return (tuple(snap.messages.values()), rows, world)


def findings_after(before: audit.Snapshot, after: audit.Snapshot) -> list[str]:
    """What is wrong after one step: the audit's findings, and any claim of the step
    that passed over a due message with a smaller key (``order.passed_over``)."""
    return [str(f) for f in audit.check(after)] + passed_over(after, last_seq(before))


def broken_promise(snap: audit.Snapshot, scenario: Scenario) -> list[str]:
    """At an end: every event done once with its effect, or dead with a reason;
    the money the done events' amounts; the audit finds nothing."""
    problems = [str(f) for f in audit.check(snap)]
    written = Counter(row.event_id for row in snap.effect_rows)
    expected = 0
    for event_id, _, amount in scenario.events:
        message = snap.messages.get(event_id)
        if message is None or message.state not in (State.DONE, State.DEAD):
            problems.append(f"{event_id} ends {message.state if message else 'missing'}")
        elif message.state == State.DONE:
            expected += amount
            if written[event_id] != 1:
                problems.append(f"{event_id} done with {written[event_id]} effects")
        elif message.last_error is None:
            problems.append(f"{event_id} dead without a reason")
    if snap.money != expected:
        problems.append(f"money {snap.money}, the done events are worth {expected}")
    return problems


class _Search:
    """Depth first over every schedule; the graph is kept for the breadth-first part."""

    def __init__(self, runner: Runner, result: Exploration) -> None:
        self.runner, self.result = runner, result
        self.ids: dict[tuple[Any, ...], int] = {}
        self.edges: list[list[tuple[Step, int | Violation]]] = []
        self.paths: list[Counter[int]] = []  # per state: schedules from it, by length
        self.below: list[int] = []  # per state: the steps a tree would run below it

    def node(self, key: tuple[Any, ...]) -> int:
        self.ids[key] = len(self.edges)
        self.edges.append([])
        self.paths.append(Counter())
        self.below.append(0)
        return self.ids[key]

    def visit(self, node: int, image: bytes, snap: audit.Snapshot, world: World) -> Counter[int]:
        runner, paths, here = self.runner, Counter[int](), state_key(snap, world)
        below = 0
        for step in runner.enabled(world, snap):
            runner.restore(image)
            child_world, _, _ = runner.apply(world, step)
            self.result.steps_run += 1
            self.result.states += not self.result.merged
            child_image = runner.image()
            child_snap = snap if child_image == image else audit.snapshot(runner.path)
            found = findings_after(snap, child_snap)
            if found:
                self._violate(node, step, found, child_snap)
                paths[1] += 1
                below += 1
                continue
            key = state_key(child_snap, child_world)
            if key == here:
                continue  # a step that changed nothing (e.g. a claim that found nothing)
            if not self.result.merged:  # a tree: run the branch, remember nothing of it
                after = self.visit(-1, child_image, child_snap, child_world)
                below += 1
            else:
                child = self.ids.get(key)
                if child is None:
                    child = self.node(key)
                    self.paths[child] = self.visit(child, child_image, child_snap, child_world)
                self.edges[node].append((step, child))
                after = self.paths[child]
                below += 1 + self.below[child]
            paths.update({n + 1: count for n, count in after.items()})
        if not paths:
            paths[0] = 1
            self._end(node, image, snap)
        if node >= 0:
            self.below[node] = below
        return paths

    def _end(self, node: int, image: bytes, snap: audit.Snapshot) -> None:
        self.result.ends += 1
        if any(m.state in (State.READY, State.LEASED) for m in snap.messages.values()):
            self.result.finished_after_bound += 1
            self.runner.restore(image)
            self.runner.finish()
            snap = audit.snapshot(self.runner.path)
        problems = broken_promise(snap, self.runner.scenario)
        if problems:
            self._violate(node, FINISH, problems, snap)

    def _violate(self, node: int, step: Step, found: list[str], snap: audit.Snapshot) -> None:
        violation = Violation((step,), tuple(found), snap.journal)
        self.result.violations.append(violation)
        if node >= 0:
            self.edges[node].append((step, violation))

    def shortest(self) -> Violation | None:
        """Breadth first on the recorded graph: the fewest steps to a violation."""
        parent: dict[int, tuple[int, Step] | None] = {0: None}
        queue = deque([0])
        while queue:
            node = queue.popleft()
            for step, target in self.edges[node]:
                if isinstance(target, Violation):
                    return replace(target, schedule=(*self._path(parent, node), step))
                if target not in parent:
                    parent[target] = (node, step)
                    queue.append(target)
        return None

    @staticmethod
    def _path(parent: dict[int, tuple[int, Step] | None], node: int) -> list[Step]:
        steps: list[Step] = []
        while (link := parent[node]) is not None:
            node, step = link
            steps.append(step)
        return steps[::-1]

    def depths(self) -> list[int]:
        """How many distinct states are first reached after 0, 1, 2... steps."""
        depth = {0: 0}
        queue = deque([0])
        while queue:
            node = queue.popleft()
            for _, target in self.edges[node]:
                if isinstance(target, int) and target not in depth:
                    depth[target] = depth[node] + 1
                    queue.append(target)
        counts = Counter(depth.values())
        return [counts[d] for d in range(max(counts) + 1)]


def explore(protocol: str, scenario: Scenario = DEFAULT, *, merge: bool = True,
            folder: str | os.PathLike[str] | None = None) -> Exploration:
    """Run every schedule of ``scenario`` against ``protocol`` (a name in ``PROTOCOLS``).

    With ``merge`` (the default) schedules that reach the same state share
    what follows; without, every schedule is run to its end (slow: for
    measuring what merging saves). Returns the counts, every violation found
    (each stops its schedule) and, merged, the shortest of them.
    """
    result = Exploration(protocol, scenario, merge)
    with _runner(PROTOCOLS[protocol], scenario, folder) as runner:
        started = time.perf_counter()
        search = _Search(runner, result)
        root = search.node(("root",))
        paths = search.visit(root, runner.image(), audit.snapshot(runner.path), runner.start())
        result.seconds = time.perf_counter() - started
    result.schedules = sum(paths.values())
    result.schedules_by_length = dict(sorted(paths.items()))
    if merge:
        result.states = len(search.edges)
        result.states_by_depth = search.depths()
        result.shortest = search.shortest()
        result.tree_steps = search.below[root]
    else:
        result.tree_steps = result.steps_run
    return result


class _runner:
    """A fresh file in ``folder`` (or a temporary folder) with ``proto``'s queue on it."""

    def __init__(self, proto: Protocol, scenario: Scenario,
                 folder: str | os.PathLike[str] | None) -> None:
        self.proto, self.scenario, self.folder = proto, scenario, folder

    def __enter__(self) -> Runner:
        self.tmp = tempfile.TemporaryDirectory(dir=self.folder)
        self.runner = Runner(self.proto, self.scenario, Path(self.tmp.name) / "explore.sqlite3")
        return self.runner

    def __exit__(self, *exc: object) -> None:
        self.runner.close()
        self.tmp.cleanup()


@dataclass(frozen=True)
class Replay:
    """A schedule run again on a fresh file: what each step did, what the audit
    found after it, the journal, marks for what the journal cannot show (who
    did a step the audit caught, a rejected ACK, a crash, a write to the
    contrasts' ledger), the money."""

    schedule: tuple[Step, ...]
    said: tuple[str, ...]
    findings: tuple[tuple[str, ...], ...]
    journal: tuple[Any, ...]
    marks: tuple[Mark, ...]
    money: int

    def lines(self) -> list[str]:
        """The schedule as numbered steps, each with what the audit found after it."""
        return [f"{n:2}. {said}" + (f"\n      audit: {'; '.join(found)}" if found else "")
                for n, (said, found) in enumerate(zip(self.said, self.findings), start=1)]


def replay(protocol: str, scenario: Scenario, schedule: tuple[Step, ...] | list[Step], *,
           folder: str | os.PathLike[str] | None = None) -> Replay:
    """Run ``schedule`` step by step on a fresh file, auditing after each step.

    The last step may be the explorer's "a fresh worker finishes the queue".
    """
    said: list[str] = []
    findings: list[tuple[str, ...]] = []
    marks: list[Mark] = []
    with _runner(PROTOCOLS[protocol], scenario, folder) as runner:
        world = runner.start()
        snap = audit.snapshot(runner.path)
        caught_before: set[str] = set()
        for step in schedule:
            if step.what == FINISH.what:
                runner.clock.set(world.now)
                runner.finish()
                after = audit.snapshot(runner.path)
                said.append(str(step))
                findings.append(tuple(broken_promise(after, scenario)))
                for name, event_id in dict.fromkeys((f.name, f.event_id) for f in audit.check(after)
                                                    if f.name not in caught_before):
                    _mark_finish(marks, after, event_id, name)
                snap = after
                continue
            lease = _held_by(world, step)
            world, text, marked = runner.apply(world, step)
            after = audit.snapshot(runner.path)
            found = audit.check(after)
            said.append(text)
            findings.append(tuple(findings_after(snap, after)))
            new = [name for name in dict.fromkeys(f.name for f in found)
                   if name not in caught_before]
            caught_before = {f.name for f in found}
            if lease is not None and (marked or new):
                label = _short(text)
                if new:  # the journal shows what changed, not whose step it was
                    label = f"{label} (g{lease.generation}); audit: {', '.join(new)}"
                _add_mark(marks, snap, world.now, lease.event_id, label, caught=bool(new))
            snap = after
    return Replay(tuple(schedule), tuple(said), tuple(findings), snap.journal, tuple(marks),
                  snap.money)


def _short(text: str) -> str:
    """A mark's label: who and what, without the event (the lane says it)."""
    who, rest = text.split(" ", 1)
    if ": rejected, " in rest:
        tried = "failure report" if rest.startswith("reports") else "ACK"
        return f"{who}'s {tried} rejected: {rest.rsplit(', ', 1)[1]}"
    what = re.sub(r"\s*(?:of |holding )?E\d{4} \(g\d+\)", "", rest, count=1)
    return f"{who} {re.split(r'[:,]', what, maxsplit=1)[0].strip()}"


def _add_mark(marks: list[Mark], snap: audit.Snapshot, now: int, event_id: str,
              label: str, *, caught: bool = False) -> None:
    """Mark ``label`` after the journal so far (several marks in one place are
    drawn side by side, in the order taken)."""
    last = snap.journal[-1].seq if snap.journal else 0
    marks.append(Mark(now, last, event_id, label, caught=caught))


def _mark_finish(marks: list[Mark], snap: audit.Snapshot, event_id: str, name: str) -> None:
    """Mark what the fresh worker that finished the queue did to ``event_id`` that
    the audit then caught (a second effect, say): its work happened after its claim,
    the event's last claim, before the state it left the message in."""
    rows = [t for t in snap.journal if t.event_id == event_id]
    claims = [t for t in rows if t.to_state == State.LEASED]
    if not claims:
        return
    claim = claims[-1]
    marks.append(Mark(rows[-1].at, claim.seq, event_id,
                      f"g{claim.generation}; audit: {name}", caught=True))


def _held_by(world: World, step: Step) -> Lease | None:
    """The lease the worker of ``step`` holds, if any."""
    if not step.who.startswith("W"):
        return None
    state = world.workers[int(step.who[1:]) - 1]
    return state[1] if state != IDLE else None


def plot_state_space(run: Exploration, title: str | None = None) -> "Figure":
    """Left: distinct states by the fewest steps that reach them. Right: schedules
    by length, as a run without merging would meet them one by one.

    The right axis is logarithmic from 1 down to 0.5, so that every bar, even
    one of a single schedule, rises from the axis; each bar is labelled with
    its count, and a length between the shortest and the longest that no
    schedule has is labelled "none" rather than left as an unexplained gap.
    """
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    fig, (left, right) = plt.subplots(1, 2, figsize=(FIG_WIDTH, 3.6))
    left.bar(range(len(run.states_by_depth)), run.states_by_depth, color="#4C72B0")
    left.set_title(f"{run.states:,} distinct states", fontsize=10)
    left.set_xlabel("fewest steps to reach the state")
    left.set_ylabel("states")
    by_length = run.schedules_by_length
    lengths = list(range(min(by_length), max(by_length) + 1)) if by_length else []
    counts = [by_length.get(n, 0) for n in lengths]
    right.bar(lengths, [c or float("nan") for c in counts], color="#DD8452")
    right.set_yscale("log")
    bottom = 0.5
    right.set_ylim(bottom, max(counts, default=1) * 4)
    for n, count in zip(lengths, counts):
        right.text(n, count if count else bottom * 1.15, f"{count:,}" if count else "none",
                   ha="center", va="bottom", fontsize=8, color="black" if count else "0.4")
    right.set_xticks(lengths)
    right.yaxis.set_major_locator(LogLocator(base=10))
    right.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:,.0f}"))
    right.yaxis.set_minor_formatter(NullFormatter())
    right.set_title(f"{run.schedules:,} schedules, each run to its end", fontsize=10)
    right.set_xlabel("steps in the schedule")
    right.set_ylabel("schedules (log scale)")
    for ax in (left, right):
        ax.grid(axis="y", color="0.85")
        ax.set_axisbelow(True)
    fig.suptitle(title or f"{run.protocol}: {run.scenario}", fontsize=11)
    fig.tight_layout()
    return fig


def explore_all(scenario: Scenario = DEFAULT, *, merge: bool = True) -> Iterator[Exploration]:
    """``explore`` every protocol of ``PROTOCOLS`` in turn."""
    for name in PROTOCOLS:
        yield explore(name, scenario, merge=merge)
