"""The reads of stored facts: each a query, and the snapshot that runs them all at once.

``snapshot(path)`` reads everything the queue stores (each message's row,
every effect, money and counts, the whole journal, SQLite's own checks) in
ONE read transaction, so nothing it returns mixes two moments; the
``read_*`` functions each read one kind of fact inside the caller's read
transaction (``Queue``'s views, ``retention`` and the audit's ``check``).
Nothing else in the package spells these queries. ``queue_core.audit``
re-exports every name here, as the chapters and the lab import them; this
module is loaded on first use, like the audit, never with a ``Queue``.
"""

from __future__ import annotations

import os
import sqlite3
from dataclasses import dataclass, field
from typing import Any, Mapping

from .marks import too_new
from .sqlite import has_table
from .stores import open_store
from .transitions import EXPIRED, rows_among
from .priority import DEFAULT_PRIORITY, PRIORITY_SINCE
from .values import (Compacted, Effect, Message, Metrics, PriorityFigures, State, Status,
                     Transition)

__all__ = ["CONTRAST_LEDGER", "EffectRow", "Snapshot", "has_priority", "read_compacted",
           "read_digests", "read_effects", "read_effects_among", "read_journal",
           "read_journal_after", "read_journal_among", "read_message_rows_among",
           "read_messages", "read_messages_among", "read_metrics", "read_status",
           "read_version", "rows_among", "snapshot"]

# A table of effects that the course's broken contrasts write instead of
# ``effects``; it has no unique key, so the audit can see a double there.
CONTRAST_LEDGER = "naive_ledger"

_MESSAGE_COLUMNS = ("event_id, payload, state, attempts, generation, available_at, "
                    "lease_until, last_error")
_JOURNAL_COLUMNS = "seq, at, event_id, from_state, to_state, generation, attempts, reason"


@dataclass(frozen=True, slots=True)
class EffectRow:
    """One stored effect row; ``table`` is ``effects`` or the contrasts' ledger."""

    event_id: str
    category: str
    amount_cents: int
    table: str = "effects"


@dataclass(frozen=True)
class Snapshot:
    """Everything a queue file holds, read at one committed moment."""

    status: Status
    messages: Mapping[str, Message]
    effect_rows: tuple[EffectRow, ...]
    journal: tuple[Transition, ...]
    integrity: tuple[str, ...]
    foreign_keys: tuple[tuple[Any, ...], ...]
    version: int = 1
    # schema 2: each message's payload digest, and each pruned message's record
    digests: Mapping[str, bytes] = field(default_factory=dict)
    compacted: Mapping[str, Compacted] = field(default_factory=dict)

    @property
    def effects(self) -> dict[str, Effect]:
        """The effect of each event (the last row where one was written twice)."""
        return {row.event_id: Effect(row.category, row.amount_cents) for row in self.effect_rows}

    @property
    def money(self) -> int:
        """The sum of every effect row, wherever it was written."""
        return sum(row.amount_cents for row in self.effect_rows)

    def states(self) -> dict[str, str]:
        """Each event's stored state."""
        return {event_id: message.state.value for event_id, message in self.messages.items()}


# -- reading (the caller holds one read transaction) ----------------------------------

def has_priority(conn: Any) -> bool:
    """Whether the queue the connection reads stores each message's priority
    (SQLite's schema 4, PostgreSQL's 6; a queue of an earlier version is read
    as it is, every message of the default priority)."""
    store = "sqlite" if isinstance(conn, sqlite3.Connection) else "postgresql"
    return read_version(conn) >= PRIORITY_SINCE[store]


def read_status(conn: sqlite3.Connection) -> Status:
    """Counts per state, effects and money per category, as stored; per
    priority too, once a message has one other than the default."""
    states = {state.value: 0 for state in State}
    by_priority: dict[int, dict[str, int]] = {}
    if has_priority(conn):
        for priority, state, count in conn.execute(
                "SELECT priority, state, count(*) FROM messages GROUP BY priority, state "
                "ORDER BY priority"):
            states[state] += count
            by_priority.setdefault(priority, {state.value: 0 for state in State})[state] = count
    else:
        states.update(conn.execute("SELECT state, count(*) FROM messages GROUP BY state"))
    if set(by_priority) <= {DEFAULT_PRIORITY}:
        by_priority = {}
    # CAST: PostgreSQL sums a bigint column as numeric, which Python reads as Decimal.
    totals = dict(conn.execute("SELECT category, CAST(sum(amount_cents) AS BIGINT) FROM effects "
                               "GROUP BY category ORDER BY category"))
    effects = conn.execute("SELECT count(*) FROM effects").fetchone()[0]
    pruned = conn.execute("SELECT count(*) FROM messages WHERE payload IS NULL").fetchone()[0]
    return Status(states, effects, totals, sum(totals.values()), pruned, priorities=by_priority)


def read_metrics(conn: sqlite3.Connection, now: int) -> Metrics:
    """Depth by state, age of the oldest due message, expired leases not yet
    recovered, the attempts each dead message spent, and when the next
    message that is not due yet becomes due."""
    status = read_status(conn)
    depth = status.states
    oldest = conn.execute("SELECT min(available_at) FROM messages "
                          "WHERE state = 'ready' AND available_at <= ?", (now,)).fetchone()[0]
    next_due = conn.execute("SELECT min(available_at) FROM messages "
                            "WHERE state = 'ready' AND available_at > ?", (now,)).fetchone()[0]
    expired = conn.execute(f"SELECT count(*) FROM ({EXPIRED}) AS expired", (now,)).fetchone()[0]
    dead = dict(conn.execute("SELECT event_id, attempts FROM messages "
                             "WHERE state = 'dead' ORDER BY event_id"))
    priorities = {}
    if status.priorities:
        oldest_of = dict(conn.execute("SELECT priority, min(available_at) FROM messages "
                                      "WHERE state = 'ready' AND available_at <= ? "
                                      "GROUP BY priority", (now,)))
        priorities = {priority: PriorityFigures(
            counts, None if oldest_of.get(priority) is None else now - oldest_of[priority])
            for priority, counts in status.priorities.items()}
    return Metrics(now, depth, None if oldest is None else now - oldest, expired, dead, next_due,
                   status.pruned, priorities=priorities)


def _message_columns(conn: Any) -> str:
    """The columns ``Message.from_row`` reads, the priority 0 where none is stored."""
    return f"{_MESSAGE_COLUMNS}, {'priority' if has_priority(conn) else DEFAULT_PRIORITY}"


def read_messages(conn: sqlite3.Connection, event_id: str | None = None) -> list[Message]:
    """Stored messages in event id order, all or the one named."""
    rows = conn.execute(f"SELECT {_message_columns(conn)} FROM messages "
                        "WHERE CAST(? AS TEXT) IS NULL OR event_id = ? ORDER BY event_id", (event_id, event_id))
    return [Message.from_row(row) for row in rows]


def read_messages_among(conn: Any, event_ids: list[str]) -> list[Message]:
    """The stored messages among ``event_ids`` (in no particular order)."""
    return [Message.from_row(row) for row in read_message_rows_among(conn, event_ids)]


def read_message_rows_among(conn: Any, event_ids: list[str]) -> list[tuple[Any, ...]]:
    """The rows ``read_messages_among`` builds its messages from, as stored (a
    prune compares them under its lock with those it judged: equal rows are
    equal messages, and a tuple compares without building one)."""
    return rows_among(
        conn, f"SELECT {_message_columns(conn)} FROM messages WHERE event_id IN ({{}})",
        event_ids)


def read_effects_among(conn: Any, event_ids: list[str]) -> dict[str, EffectRow]:
    """The effect rows of ``event_ids`` that exist: event id -> row."""
    return {row[0]: EffectRow(*row) for row in rows_among(
        conn, "SELECT event_id, category, amount_cents FROM effects WHERE event_id IN ({})",
        event_ids)}


def read_journal_after(conn: Any, after: int, limit: int) -> list[Transition]:
    """Up to ``limit`` journal rows after sequence number ``after``, oldest first: a
    walk of the journal a page at a time, which never holds all of it."""
    return [_transition(row) for row in conn.execute(
        f"SELECT {_JOURNAL_COLUMNS} FROM transitions WHERE seq > ? ORDER BY seq LIMIT ?",
        (after, limit))]


def read_journal_among(conn: Any, event_ids: list[str],
                       seqs: tuple[int, int] | None = None) -> list[Transition]:
    """The journal rows of ``event_ids``, oldest first: every one (by an index of the
    journal by event id: PostgreSQL's ``transitions_event``), or those with a
    sequence number in ``seqs`` (after, up to), a range of the journal's own order,
    which the database reads whole and filters (SQLite, which has no such index)."""
    where = "" if seqs is None else f"seq > {int(seqs[0])} AND seq <= {int(seqs[1])} AND "
    return sorted((_transition(row) for row in rows_among(
        conn, f"SELECT {_JOURNAL_COLUMNS} FROM transitions WHERE {where}event_id IN ({{}})",
        event_ids)), key=lambda step: step.seq)


def read_effects(conn: sqlite3.Connection) -> list[EffectRow]:
    """Every stored effect row, the contrasts' ledger included where it exists."""
    rows = [EffectRow(*row) for row in conn.execute(
        "SELECT event_id, category, amount_cents FROM effects ORDER BY event_id")]
    if has_table(conn, CONTRAST_LEDGER):
        rows += [EffectRow(*row, table=CONTRAST_LEDGER) for row in conn.execute(
            f"SELECT event_id, category, amount_cents FROM {CONTRAST_LEDGER} ORDER BY seq")]
    return rows


def read_journal(conn: sqlite3.Connection, event_id: str | None = None) -> list[Transition]:
    """The journal of state changes in order, for one event or all."""
    rows = conn.execute(f"SELECT {_JOURNAL_COLUMNS} FROM transitions "
                        "WHERE CAST(? AS TEXT) IS NULL OR event_id = ? ORDER BY seq", (event_id, event_id))
    return [_transition(row) for row in rows]


def _transition(row: tuple[Any, ...]) -> Transition:
    seq, at, event_id, src, dst, generation, attempts, reason = row
    return Transition(seq, at, event_id, State(src) if src else None, State(dst), generation,
                      attempts, reason)


def read_version(conn: Any) -> int:
    """The schema version of the queue the connection reads."""
    if isinstance(conn, sqlite3.Connection):
        return int(conn.execute("PRAGMA user_version").fetchone()[0])
    return int(conn.execute("SELECT schema_version FROM queue_core_meta").fetchone()[0])


def read_digests(conn: Any) -> dict[str, bytes]:
    """Each message's payload digest (schema 2)."""
    return {event_id: bytes(digest) for event_id, digest in conn.execute(
        "SELECT event_id, payload_sha256 FROM messages ORDER BY event_id")}


def read_compacted(conn: Any) -> dict[str, Compacted]:
    """Each pruned message's compacted record (schema 2)."""
    return {row[0]: Compacted(*row) for row in conn.execute(
        "SELECT event_id, enqueued_at, claims, redrives, steps, category, amount_cents "
        "FROM compacted ORDER BY event_id")}


def snapshot(path: str | os.PathLike[str]) -> Snapshot:
    """Read every stored fact of the queue file ``path`` in ONE read transaction.

    Reads through ``Store.read``: a snapshot writes nothing, leaves the
    file's folder as it found it (no ``-wal`` or ``-shm`` made, none left),
    never recovers a lease and never takes the write lock, except for
    SQLite's own rollback of a hot journal (``sqlite.roll_back_hot_journal``).
    ``path`` may be a ``postgresql://`` connection string: then the read is
    one ``REPEATABLE READ READ ONLY`` transaction, one snapshot of the whole
    database.

    Refuses what every command refuses, with the same codes and nothing
    written (``store.prepare(create=False)``): ``no_queue_file``,
    ``not_a_queue``, ``not_a_database``, and ``schema_too_new`` for a queue
    a later version of this package made (this one cannot judge it), also
    when its version changed between that check and the read.
    """
    store = open_store(path)
    store.prepare(create=False)

    def read(conn: Any) -> Snapshot:
        version = read_version(conn)
        if version > store.schema_version:
            raise too_new(store.describe(), version, store.schema_version)
        integrity, foreign_keys = store.self_checks(conn)
        return Snapshot(
            status=read_status(conn),
            messages={m.event_id: m for m in read_messages(conn)},
            effect_rows=tuple(read_effects(conn)),
            journal=tuple(read_journal(conn)),
            integrity=integrity, foreign_keys=foreign_keys, version=version,
            digests=read_digests(conn) if version >= 2 else {},
            compacted=read_compacted(conn) if version >= 2 else {})
    return store.read(read)
