"""Retention: ``prune`` drops what old ``done`` messages no longer need, and
keeps what deduplication needs forever.

The seed's warning: done rows are kept for deduplication, so deleting
history arbitrarily breaks it. A queue that forgets an event's key accepts
its late duplicate as new, and counts its money again (the brokers that keep
a dedupe window of minutes do exactly that; see notebook 13). So prune
never forgets a key. For each ``done`` message that finished at least
``older_than`` seconds ago it drops:

- the payload text: its SHA-256 stays, and a replay is judged by it (the
  same canonical payload is a duplicate, another one a ``batch_conflict``);
- the message's journal rows: they are replaced by ONE compacted record of
  what they proved (enqueued once, claimed ``claims`` times, generation by
  generation, redriven ``redrives`` times, completed once by the newest
  lease), which the audit holds the message and its effect against.

It keeps, forever: the key, the digest, the state ``done`` with its
generation and finish time, and the effect (the business record: money never
changes by pruning). It never touches ``ready``, ``leased`` or ``dead``
messages (a dead message's payload is what redrive needs), nor a message
whose journal the audit would not accept (it is kept whole, and counted).

Pruning runs in short transactions of at most ``batch_size`` messages each,
beside running workers: each batch holds the write lock for about a
millisecond on average. Beside a ``prune(0)`` of 5,000 done messages of 2 KB,
a process that only took and released the lock in a loop waited at most 2.6
to 6.5 ms for it while the batches ran (seven runs here; the batches follow each
other closely, so one wait can span two). Timed to the end of the commit call
(``Pruned.longest_batch_seconds``) the longest batch took 17 to 25 ms: once
the ``-wal`` holds ``CHECKPOINT_PAGES``, the commit that reaches that size
copies it into the file (SQLite's automatic checkpoint) inside the COMMIT
call, but after the write lock is released, so a worker beside it goes on
writing.
A prune killed at any moment leaves a consistent queue: each
batch commits whole or not at all, and the next prune goes on. A journal
sequence number is never reused: the message that owns the journal's last
row is left for a later prune (SQLite numbers a new row after the largest
one present). On a SQLite file made with incremental auto-vacuum (every
file this version creates) the pages freed are then given back to the file
system; on an older file they are reused by the file as it grows.

Durability: on SQLite each of prune's transactions commits without an fsync
of its own (``synchronous=NORMAL`` for that transaction, as a claim does;
``Queue(fsync_claims=True)`` fsyncs them too). Prune promises nothing that a
power loss could take back: what it keeps (the key, the digest, the effect)
was made durable by the enqueue's and the ACK's own fsynced commits, and what
a lost prune commit leaves is the message as it was before, payload and
journal whole, which the audit accepts and the next prune prunes. The WAL
keeps commits in order, so a power cut leaves a prefix of them: no later
fsynced commit survives without the prune commits before it. A prune
fsynced at every batch cost a worker beside it a flush per batch: the one
resource the worker's own commits wait for. On PostgreSQL every commit is
durable (``relaxed`` is ignored there).
"""

from __future__ import annotations

import os
import sqlite3
import time
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Protocol, TypeVar

from . import audit
from .crashpoints import crash_point
from .priority import CLAIM_ORDER
from .sqlite import (BUSY_TIMEOUT_SECONDS, CHECKPOINT_PAGES, SQLITE_BUSY, data_version,
                     polling)
from .audit import EffectRow
from .values import Message, State, Transition, require_positive

from .clock import Clock
from .stores import Store

T = TypeVar("T")


class Queue(Protocol):
    """What prune asks of the queue it prunes (``queue.Queue`` is the one there is)."""

    clock: Clock
    store: Store
    relaxed_commits: bool  # commit without an fsync of its own (SQLite at FULL)

    def _require_current_schema(self) -> None: ...
    @property
    def connection(self) -> Any: ...
    def session(self) -> ContextManager[Any]: ...
    def transaction(self, *, relaxed: bool = False) -> ContextManager[Any]: ...
    def _read(self, body: Callable[[Any], T]) -> T: ...

__all__ = ["Pruned", "prune"]

READ_AHEAD = 10             # batches whose candidates and journal rows one read gathers
VACUUM_PAGES = 64           # pages given back per incremental-vacuum transaction
_EARLIEST = -(2**63)        # the least 64-bit integer, the earliest cutoff both stores take
LOCK_POLL_SECONDS = 0.0002  # how often a prune asks again for SQLite's write lock (``polling``)
WAL_TRUNCATE_BYTES = 1024 * 1024  # a WAL this long is truncated after a quiet prune

# The done messages old enough to prune, oldest first, from the ``done`` range of
# ``messages_live`` (a pruned message leaves it), in the index's order (the claim's,
# ``priority.CLAIM_ORDER``, never later than ``available_at``, which bounds the
# read). Parameters: cutoff, cutoff, cutoff, limit.
_CANDIDATES = ("SELECT event_id FROM messages WHERE state = 'done' AND payload IS NOT NULL "
               f"AND {CLAIM_ORDER} <= ? AND available_at <= ? AND finished_at <= ? "
               f"ORDER BY {CLAIM_ORDER}, event_id LIMIT ?")
_CHUNK = 500  # keys per IN (...) list
_PAYLOAD = 1  # the payload's place in a row of ``audit.read_message_rows_among``
_WALK_SPAN = 20_000  # journal sequence numbers one read of the walk covers (SQLite)


@dataclass(frozen=True, slots=True)
class Pruned:
    """What ``prune`` did, and what it kept.

    Messages pruned, the journal rows their records replaced, the messages
    kept whole because the audit would not accept their journal, the
    transactions it took, and the bytes the file gave back (SQLite).
    """

    older_than: int
    at: int
    messages: int
    journal_rows: int
    kept: tuple[str, ...]
    batches: int
    bytes_freed: int
    longest_batch_seconds: float  # one batch, from asking for the write lock to the end
    # of its commit call (wall clock: the wait for the lock, the hold, and SQLite's automatic
    # checkpoint where a commit ran one, after the lock's release: an upper bound of the hold)
    waiting: str | None = None  # old enough, but it owns the journal's newest row
    skipped: tuple[str, ...] = ()  # old enough, but another transaction holds its row,
    # or its row or effect changed after it was judged (``_one_batch``)
    store: str = "sqlite"

    def lines(self) -> list[str]:
        """What ``queue-core prune`` prints (no wall-clock figures)."""
        one = self.messages == 1
        if self.messages:
            said = [f"pruned {self.messages} done message{'' if one else 's'} finished at "
                    f"least {self.older_than} s before t={self.at}: "
                    f"{'its payload' if one else 'their payloads'} and {self.journal_rows} "
                    f"journal rows dropped, in {self.batches} "
                    f"transaction{'s' if self.batches != 1 else ''}; "
                    f"{'its key, digest and effect and one compacted record' if one else 'keys, digests, effects and one compacted record each'} kept"]
        else:
            said = [f"pruned nothing: no {'other ' if self.waiting else ''}done message "
                    "finished at least "
                    f"{self.older_than} s before t={self.at}"]
        if self.waiting:
            why = ("which is kept so that no journal number is ever used twice"
                   if self.store == "sqlite" else "which a prune keeps on either store")
            said.append(f"{self.waiting} waits for a later prune: it owns the journal's newest "
                        f"row, {why}")
        if self.skipped:
            said.append(f"skipped {len(self.skipped)} that another transaction holds or has "
                        f"just changed ({', '.join(self.skipped[:5])}): a later prune takes "
                        f"{'it' if len(self.skipped) == 1 else 'them'}")
        if self.kept:
            said.append(f"kept whole {len(self.kept)} whose journal the audit does not "
                        f"accept ({', '.join(self.kept[:5])}): run the audit")
        if self.store != "sqlite":
            said.append("the space freed is reused for new rows once (auto)vacuum has run")
            return said
        said.append(f"{self.bytes_freed} bytes given back to the file system"
                    + ("" if self.bytes_freed or not self.messages else
                       f" (the space freed stays in the file for its next rows until "
                       f"{VACUUM_PAGES} pages are free)"))
        return said


def prune(queue: Queue, older_than: int, *, batch_size: int) -> Pruned:
    """Prune ``queue``'s done messages that finished at least ``older_than`` seconds
    before its clock's now (see the module). Refuses a queue of an earlier
    schema version (``schema_too_old``), like every write.

    What takes time is read without the write lock: the candidates, a pass of
    up to ``READ_AHEAD`` batches at a time, in one read transaction, then their
    journal rows (``_journal_of``), a span of the journal per read transaction (a
    done message's rows never change, and only a prune removes them, so the
    pages need not share one moment), then their rows and effects, which the
    journal and the audit's rules judge (``_judge``). Each batch's write
    transaction then reads the batch's rows and effects again by key, prunes
    those that are still the ones judged, and writes: about a millisecond
    under the lock.
    """
    if isinstance(older_than, bool) or not isinstance(older_than, int) or older_than < 0:
        raise ValueError(f"older_than must be a whole number of seconds, 0 or more, "
                         f"got {older_than!r}")
    require_positive("batch_size", batch_size)
    queue._require_current_schema()  # before the first read of what schema 2 added
    now = queue.clock.now()
    # An age before the clock's first second prunes nothing; kept within the
    # 64-bit integers both stores compare with (older_than=10**19 is such an age).
    cutoff = max(now - older_than, _EARLIEST)
    pruned = rows = batches = 0
    kept: list[str] = []
    skipped: list[str] = []
    longest = 0.0
    waiting: str | None = None
    with queue.session():
        size_before = _file_bytes(queue)
        writes_before = _writes_of_others(queue)
        while True:
            ahead = batch_size * READ_AHEAD
            ids, waiting = queue._read(
                lambda conn: _read_ahead(conn, cutoff, ahead, kept + skipped))
            found = len(ids)
            steps = _journal_of(queue, set(ids)) if ids else {}
            judged, refused = queue._read(lambda conn: _judge(conn, ids, steps)) if ids \
                else ({}, [])
            kept += refused
            ids = [event_id for event_id in ids if event_id in judged]
            for start in range(0, len(ids), batch_size):
                started = time.perf_counter()
                with polling(LOCK_POLL_SECONDS), \
                        queue.transaction(relaxed=queue.relaxed_commits) as conn:
                    crash_point("prune.after_begin")
                    queue.store.serialize_enqueue(conn)  # PostgreSQL: one prune or enqueue at a time
                    done, dropped, held = _one_batch(
                        conn, queue.store, ids[start:start + batch_size], judged)
                    crash_point("prune.before_commit")
                crash_point("prune.after_commit")
                longest = max(longest, time.perf_counter() - started)
                batches += bool(done)
                pruned, rows = pruned + done, rows + dropped
                skipped += held
            if found < ahead:
                break
        _give_back(queue, quiet_since=writes_before if pruned else None)
        freed = max(0, size_before - _file_bytes(queue))
    return Pruned(older_than, now, pruned, rows, tuple(kept), batches, freed, longest, waiting,
                  tuple(skipped), queue.store.name)


def _read_ahead(conn: Any, cutoff: int, limit: int, skip: list[str]
                ) -> tuple[list[str], str | None]:
    """Up to ``limit`` done messages old enough to prune, oldest first, but not
    those in ``skip`` nor the owner of the journal's last row: one read, outside
    the write lock. Also that owner, if it was one."""
    last = conn.execute("SELECT event_id FROM transitions "
                        "ORDER BY seq DESC LIMIT 1").fetchone()
    found = [row[0] for row in conn.execute(_CANDIDATES, (cutoff, cutoff, cutoff,
                                                      limit + len(skip) + 1))]
    waiting = last[0] if last is not None and last[0] in found else None
    ids = [event_id for event_id in found if event_id not in skip and event_id != waiting][:limit]
    return ids, waiting


@dataclass(frozen=True)
class _Judged:
    """A done message the audit accepts, as read before the write lock: its row as
    stored (``audit.read_message_rows_among``), its effect, the compacted record
    that replaces its journal, and its journal rows."""

    row: tuple[Any, ...]
    effect: EffectRow
    record: tuple[Any, ...]
    seqs: list[int]


def _judge(conn: Any, ids: list[str], steps: dict[str, list[Transition]]
           ) -> tuple[dict[str, _Judged], list[str]]:
    """The messages ``ids`` judged by their journal rows ``steps`` and their effect,
    in one read outside the write lock: those the audit accepts, and those it does
    not (kept whole). A done message never changes but by a prune, nor does its
    effect or its journal, so the judgement holds under the lock if its row and
    its effect read there are the ones judged (``_one_batch``)."""
    rows = {row[0]: row for row in audit.read_message_rows_among(conn, ids)}
    effects = audit.read_effects_among(conn, ids)
    judged: dict[str, _Judged] = {}
    refused: list[str] = []
    for event_id in ids:
        row, history = rows.get(event_id), steps.get(event_id, [])
        message = None if row is None else Message.from_row(row)
        if message is None or message.state != State.DONE or message.payload is None:
            continue  # gone, no longer done, or pruned meanwhile
        effect = effects.get(event_id)
        if effect is None or any(audit.history_findings(message, history)) or any(
                audit.effect_findings(effect, message)):
            refused.append(event_id)
            continue
        judged[event_id] = _Judged(row, effect, (
            event_id, history[0].at, message.generation,
            sum(step.from_state == State.DEAD for step in history), len(history),
            effect.category, effect.amount_cents), [step.seq for step in history])
    return judged, refused


# The batch's UPDATE names its rows by key. Its guard is a CASE, which no index
# answers: written as ``state = 'done' AND payload IS NOT NULL``, it made SQLite
# read the whole ``done`` range of ``messages_live`` (every done message not yet
# pruned, thousands behind a long retention) instead of the batch's keys.
_DROP_PAYLOADS = ("UPDATE messages SET payload = NULL WHERE event_id IN ({}) "
                  "AND CASE WHEN state = 'done' THEN payload IS NOT NULL ELSE FALSE END")


def _one_batch(conn: Any, store: Store, ids: list[str],
               judged: dict[str, _Judged]) -> tuple[int, int, list[str]]:
    """Prune the messages ``ids``, judged before the lock (``_judge``), inside the
    caller's write transaction: (pruned, journal rows, skipped). Under the lock
    each row and effect is read again and must be the one judged (another prune,
    or a hand on the file, may have changed it meanwhile: it is left for a later
    prune, which judges it again), and a message whose row another transaction
    holds is skipped, as a claim skips it (``Store.picked``: on PostgreSQL a
    ``SELECT ... FOR UPDATE`` elsewhere would otherwise stop the whole prune at
    its lock timeout; SQLite's write lock is the only lock there is, so there is
    nothing to ask). Only these reads and the writes hold the lock: judging a
    message (its journal, its payload against its effect) took as long again."""
    last = conn.execute("SELECT event_id FROM transitions "
                        "ORDER BY seq DESC LIMIT 1").fetchone()
    rows = {row[0]: row for row in audit.read_message_rows_among(conn, ids)}
    effects = audit.read_effects_among(conn, ids)
    # not pruned meanwhile, and not the owner of the journal's last row
    left = [event_id for event_id in ids if event_id in rows
            and rows[event_id][_PAYLOAD] is not None
            and (last is None or event_id != last[0])]
    same = [event_id for event_id in left if rows[event_id] == judged[event_id].row
            and effects.get(event_id) == judged[event_id].effect]
    locked = set(same)
    if store.row_locks and same:
        locked = {row[0] for row in audit.rows_among(
            conn, "SELECT event_id FROM messages WHERE event_id "
            + store.picked("SELECT event_id FROM messages WHERE event_id IN ({})"), same)}
    compacted = [event_id for event_id in same if event_id in locked]
    held = [event_id for event_id in left if event_id not in locked]
    if not compacted:
        return 0, 0, held
    seqs = [seq for event_id in compacted for seq in judged[event_id].seqs]
    conn.executemany("INSERT INTO compacted (event_id, enqueued_at, claims, redrives, steps, "
                     "category, amount_cents) VALUES (?, ?, ?, ?, ?, ?, ?)",
                     [judged[event_id].record for event_id in compacted])
    # One UPDATE for the batch, not one per message: PostgreSQL prepares the CHECK
    # constraints of ``messages`` once for every statement it runs.
    for start in range(0, len(compacted), _CHUNK):
        chunk = compacted[start:start + _CHUNK]
        conn.execute(_DROP_PAYLOADS.format(", ".join("?" * len(chunk))), chunk)
    crash_point("prune.after_compact")
    for start in range(0, len(seqs), _CHUNK):
        chunk = seqs[start:start + _CHUNK]
        conn.execute(f"DELETE FROM transitions WHERE seq IN ({', '.join('?' * len(chunk))})",
                     chunk)
    return len(compacted), len(seqs), held


def _journal_of(queue: Queue, ids: set[str]) -> dict[str, list[Transition]]:
    """The journal rows of ``ids``: by the journal's index by event id where the
    store has one (``Store.journal_by_event``: PostgreSQL), else by ``_walk``."""
    if not queue.store.journal_by_event:
        return _walk(queue, ids)
    steps: dict[str, list[Transition]] = {}
    for step in queue._read(lambda conn: audit.read_journal_among(conn, sorted(ids))):
        steps.setdefault(step.event_id, []).append(step)
    return steps


def _walk(queue: Queue, ids: set[str]) -> dict[str, list[Transition]]:
    """The journal rows of ``ids``, from one walk of the journal from its oldest row,
    which stops once each has its ``done`` row (its last: done is final). The
    oldest done messages are pruned first, so their rows are near the head; but
    the rows of every message still queued lie among them, so behind a backlog
    of hundreds of thousands of events the walk is long. The database filters
    each span of ``_WALK_SPAN`` sequence numbers by event id (SQLite's C, not a
    Python object per row: the walk behind make scale's backlog of 114,000
    events took the pruner a core), and each span is read in a read transaction
    of its own, none longer than one span's read: a long read keeps a checkpoint
    from resetting the -wal (and held a PostgreSQL session past its
    ``transaction_timeout`` before that store read by its index). What the spans
    read is the same as one read would give: every row of a candidate
    committed before the candidate was seen done, and a row is removed only
    by a prune, which then removes the candidate too (its write transaction
    finds the payload gone and leaves it)."""
    steps: dict[str, list[Transition]] = {}
    waiting = set(ids)
    newest = queue._read(lambda conn: conn.execute(
        "SELECT coalesce(max(seq), 0) FROM transitions").fetchone()[0])
    after = queue._read(lambda conn: conn.execute(
        "SELECT coalesce(min(seq), 1) - 1 FROM transitions").fetchone()[0])
    while waiting and after < newest:
        span = (after, after + _WALK_SPAN)
        for step in queue._read(lambda conn: audit.read_journal_among(conn, sorted(waiting),
                                                                        span)):
            steps.setdefault(step.event_id, []).append(step)
            if step.to_state == State.DONE:
                waiting.discard(step.event_id)
        after = span[1]
    return steps


def _file_bytes(queue: Queue) -> int:
    """The SQLite file's size in pages (what a checkpoint leaves on disk); 0 on PostgreSQL."""
    if queue.store.name != "sqlite":
        return 0
    return int(queue._read(lambda conn: conn.execute("PRAGMA page_count").fetchone()[0]
                           * conn.execute("PRAGMA page_size").fetchone()[0]))


def _writes_of_others(queue: Queue) -> int | None:
    """SQLite's count of the commits other connections made to the file (``PRAGMA
    data_version``, read without a lock); ``None`` on PostgreSQL, or where even
    that read met a lock (the prune is then not taken for a quiet one)."""
    return data_version(queue.connection) if queue.store.name == "sqlite" else None


def _give_back(queue: Queue, *, quiet_since: int | None) -> None:
    """Give the freed pages back to the file system, a few at a time (SQLite with
    incremental auto-vacuum: each ``incremental_vacuum`` is its own short write
    transaction), once at least ``VACUUM_PAGES``
    are free (fewer are simply reused by the next writes). Then copy the WAL
    into the file and truncate it to nothing (``wal_checkpoint(TRUNCATE)``,
    which then does not wait for a lock) if it has grown past
    ``WAL_TRUNCATE_BYTES`` after a prune that pruned, and no other
    connection committed since ``quiet_since`` (the ``_writes_of_others``
    the prune began with), or if it has grown past twice the size SQLite's
    checkpoints reuse it at (``CHECKPOINT_PAGES``; a long read or a large
    transaction grew it). SQLite reuses a WAL from its start after each
    checkpoint, but never shortens the file by itself while a connection is
    open. Beside running workers a truncation holds their write lock for a
    whole checkpoint, its fsyncs included, and their next commits grow the
    WAL back to its usual size: a prune looping beside one worker that
    truncated after every prune cost the worker more than half its rate.
    """
    if queue.store.name != "sqlite":
        return  # PostgreSQL reuses the space once (auto)vacuum has run
    conn = queue.connection
    if conn.execute("PRAGMA auto_vacuum").fetchone()[0] == 2:  # 2: INCREMENTAL
        while conn.execute("PRAGMA freelist_count").fetchone()[0] >= VACUUM_PAGES:
            with polling(LOCK_POLL_SECONDS), queue.transaction(relaxed=queue.relaxed_commits):
                # One page per statement: ``incremental_vacuum(N)`` gives back a page
                # per step, and Python 3.11's sqlite3 steps it once where 3.12 steps
                # it to the end, so N in one statement would depend on the Python.
                for _ in range(VACUUM_PAGES):
                    conn.execute("PRAGMA incremental_vacuum(1)").fetchall()
    wal = f"{queue.store.target}-wal"
    size = os.path.getsize(wal) if os.path.exists(wal) else 0
    grown = 2 * CHECKPOINT_PAGES * conn.execute("PRAGMA page_size").fetchone()[0]
    quiet = quiet_since is not None and _writes_of_others(queue) == quiet_since
    if size < WAL_TRUNCATE_BYTES or (not quiet and size < grown):
        return
    conn.execute("PRAGMA busy_timeout = 0")
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    except sqlite3.OperationalError as exc:
        if exc.sqlite_errorcode & 0xFF != SQLITE_BUSY:
            raise
    finally:
        conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_SECONDS * 1000)}")
