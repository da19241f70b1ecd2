"""The queue over its lifetime under crashes and power cuts: a migration and a prune.

The crash sweep and the power-loss sweep of notebook 07 follow a message's
way through the protocol. A migration and a prune are not on that way, so
their steps (``crashpoints.LIFETIME_POINTS``) have sweeps of their own
(``sweep.run_lifetime_sweep``, ``powerloss.run_lifetime_powerloss``), which
share what this module says: the two runs, and how a file they may leave
behind is judged.

- **migrate**: a schema-1 file (one of ``tests/files/schema1-<commit>.sqlite3``,
  written by the engine of that commit: E0001 and E0003 done, E0002 dead,
  E0004 leased until 1037, E0005 ready; 15000 of money) is upgraded by
  ``migrate``. A file it leaves must be version 1 intact (every message,
  journal row and effect as before) or a later version complete (the same
  facts, and each payload's digest: version 2 once the first step has
  committed, the last once every step has), audit clean; ``migrate`` then finishes it, and
  a worker at t=2000 ends it exactly as it ends the file migrated without a
  crash (every message once, 17700 of money).
- **prune**: a file of this engine with eight done messages, one dead and
  one ready is pruned in batches of ``PRUNE_BATCH_SIZE``. A file it leaves
  must audit clean with every key, digest, state and effect as before; each
  message is whole (payload and journal rows) or pruned (no payload, one
  compacted record, no journal row), never between; the pruned messages are
  whole batches, oldest first. A prune run again then prunes exactly what
  the uninterrupted run pruned, and a replay of a pruned event is still a
  duplicate (another payload: ``batch_conflict``), the money unchanged.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ... import audit
from ...clock import ModelClock
from ...errors import BatchRejected
from ...handler import Handler
from ...migrations import migrate
from ...queue import Queue
from ...sqlite.schema import SCHEMA_VERSION
from ...worker import drain

__all__ = ["PRUNE_BATCH_SIZE", "PRUNE_EVENTS", "PRUNE_NOW", "PRUNE_OLDER_THAN", "LifetimeEnd",
           "judge_migrate", "judge_prune", "migrate_end", "prune_end", "prune_source",
           "schema1_source"]

MIGRATE_NOW = 2000               # the worker that finishes a migrated file
PRUNE_START = 1000
PRUNE_NOW = 1100                 # when the prune runs
PRUNE_OLDER_THAN = 50            # every done message finished before 1050
PRUNE_BATCH_SIZE = 3             # eight done messages: batches of 3, 3 and 2
PRUNE_EVENTS = "".join(
    f'{{"event_id": "E{n:04d}", "payload": {{"category": "book", "amount_cents": {n * 100}}}}}\n'
    for n in range(1, 9)) + \
    '{"event_id": "E0009", "payload": {"category": "toy", "amount_cents": 900}}\n'
LATE_EVENT = '{"event_id": "E0010", "payload": {"category": "pen", "amount_cents": 1000}}\n'
PRUNED_REPLAY = '{"event_id": "E0001", "payload": {"category": "book", "amount_cents": 100}}\n'
CONFLICTING_REPLAY = ('{"event_id": "E0001", "payload": {"category": "book", '
                      '"amount_cents": 999}}\n')


def schema1_source(source: str | os.PathLike[str], target: Path) -> Path:
    """A copy of the schema-1 file ``source`` at ``target``."""
    shutil.copyfile(source, target)
    return target


def prune_source(target: Path) -> Path:
    """The prune run's file before it is pruned: E0001-E0008 done (at 1000),
    E0009 dead (toy, unknown to the handler), E0010 ready; every connection
    closed, so the file holds it all and no ``-wal`` is left."""
    clock = ModelClock(PRUNE_START)
    queue = Queue(target, clock=clock, lease_seconds=30)
    queue.enqueue_jsonl(PRUNE_EVENTS)
    drain(queue, Handler())
    queue.enqueue_jsonl(LATE_EVENT)
    return target


def prune_queue(db: Path) -> Queue:
    return Queue(db, clock=ModelClock(PRUNE_NOW), lease_seconds=30)


def run_prune(db: Path) -> None:
    """The prune that the sweeps interrupt."""
    prune_queue(db).prune(PRUNE_OLDER_THAN, batch_size=PRUNE_BATCH_SIZE)


@dataclass(frozen=True)
class LifetimeEnd:
    """A run's reference: the file before it, after it, and the end a worker
    (migrate) or a second prune and the replays (prune) reach from there."""

    before: audit.Snapshot
    after: audit.Snapshot
    end: audit.Snapshot


def migrate_end(source: str | os.PathLike[str], folder: Path) -> LifetimeEnd:
    """The migration run without a crash, and where a worker takes it."""
    db = schema1_source(source, folder / "migrate-reference.sqlite3")
    before = audit.snapshot(db)
    migrate(db)
    after = audit.snapshot(db)
    _finish_migrated(db)
    return LifetimeEnd(before, after, audit.snapshot(db))


def prune_end(folder: Path) -> LifetimeEnd:
    """The prune run without a crash, then the replays."""
    db = prune_source(folder / "prune-reference.sqlite3")
    before = audit.snapshot(db)
    run_prune(db)
    after = audit.snapshot(db)
    problem = _replays(db)
    if problem:
        raise RuntimeError(f"the uninterrupted prune: {problem}")
    return LifetimeEnd(before, after, audit.snapshot(db))


def _finish_migrated(db: Path) -> None:
    drain(Queue(db, clock=ModelClock(MIGRATE_NOW), lease_seconds=30), Handler())


def _facts(snap: audit.Snapshot) -> tuple[object, ...]:
    return (snap.messages, snap.journal, snap.effect_rows)


def judge_migrate(db: Path, ref: LifetimeEnd) -> tuple[str, str]:
    """``(outcome, detail)`` for a file a migration left: ``ok`` when it is version 1
    intact or a later version complete and ends as the reference does."""
    snap = audit.snapshot(db)
    found = audit.check(snap)
    if found:
        return "audit finding", "; ".join(map(str, found[:3]))
    if snap.version == 1:
        if _facts(snap) != _facts(ref.before):
            return "version 1 changed", "the facts differ from the file before the migration"
        kept = "version 1 intact"
    elif 2 <= snap.version <= SCHEMA_VERSION:  # the steps after the first rewrite no row
        if _facts(snap) != _facts(ref.after) or snap.digests != ref.after.digests:
            return f"version {snap.version} incomplete", "the facts differ from the migrated file"
        kept = f"version {snap.version} complete"
    else:
        return "unknown version", f"schema version {snap.version}"
    migrate(db)
    _finish_migrated(db)
    end = audit.snapshot(db)
    found = audit.check(end)
    if found or end.states() != ref.end.states() or end.money != ref.end.money \
            or end.version != SCHEMA_VERSION:
        return "wrong end", (f"states {end.states()}, money {end.money}, version {end.version}; "
                             + "; ".join(map(str, found[:3])))
    return "ok", f"{kept}; migrated and worked on: {end.money}"


def pruned(snap: audit.Snapshot) -> frozenset[str]:
    """The messages whose payload was dropped."""
    return frozenset(e for e, m in snap.messages.items() if m.payload is None)


def half_pruned(snap: audit.Snapshot) -> list[str]:
    """Messages neither whole nor pruned: a payload dropped without its record, or
    journal rows left beside a record."""
    journalled = {step.event_id for step in snap.journal}
    return sorted(e for e, m in snap.messages.items()
                  if not ((m.payload is not None and e not in snap.compacted and e in journalled)
                          or (m.payload is None and e in snap.compacted and e not in journalled)))


def whole_batches(done: Sequence[str], size: int) -> list[frozenset[str]]:
    """The sets of messages a prune can have pruned after each batch: oldest first."""
    return [frozenset(done[:n]) for n in [*range(0, len(done), size), len(done)]]


def judge_prune(db: Path, ref: LifetimeEnd) -> tuple[str, str]:
    """``(outcome, detail)`` for a file a prune left (see the module)."""
    snap = audit.snapshot(db)
    found = audit.check(snap)
    if found:
        return "audit finding", "; ".join(map(str, found[:3]))
    if snap.states() != ref.before.states() or snap.effect_rows != ref.before.effect_rows \
            or snap.digests != ref.before.digests:
        return "facts changed", f"states {snap.states()}, money {snap.money}"
    half = half_pruned(snap)
    if half:
        return "half-pruned message", ", ".join(half)
    order = sorted(pruned(ref.after))  # the candidates are read oldest first, then by id
    if pruned(snap) not in whole_batches(order, PRUNE_BATCH_SIZE):
        return "part of a batch", f"pruned {sorted(pruned(snap))}"
    batches = len(pruned(snap)) // PRUNE_BATCH_SIZE + (len(pruned(snap)) % PRUNE_BATCH_SIZE > 0)
    run_prune(db)
    again = audit.snapshot(db)
    if pruned(again) != pruned(ref.after) or audit.check(again):
        return "prune did not go on", f"pruned {sorted(pruned(again))}"
    problem = _replays(db)
    if problem:
        return "replay accepted", problem
    end = audit.snapshot(db)
    if end.money != ref.end.money or audit.check(end):
        return "wrong end", f"money {end.money}"
    return "ok", f"{batches} whole batches pruned; prune went on; replay a duplicate"


def _replays(db: Path) -> str:
    """A replay of pruned E0001: a duplicate; with another payload, refused whole."""
    queue = prune_queue(db)
    money = audit.snapshot(db).money
    same = queue.enqueue_jsonl(PRUNED_REPLAY)
    if (same.inserted, same.duplicates) != (0, 1):
        return f"the same payload: {same}"
    try:
        queue.enqueue_jsonl(CONFLICTING_REPLAY)
    except BatchRejected as exc:
        if exc.code != "batch_conflict":
            return f"another payload refused as {exc.code}"
    else:
        return "another payload accepted"
    if audit.snapshot(db).money != money:
        return "the money changed"
    return ""
