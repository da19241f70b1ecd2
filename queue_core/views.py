"""Reading a queue file: counts, metrics, rows, effects and the journal.

Stored values only: nothing here recovers an expired lease or changes a
row, so looking at a queue never moves it. ``Queue`` inherits these.
"""

from __future__ import annotations

import sqlite3
from contextlib import AbstractContextManager
from typing import Callable

from .clock import Clock
from .errors import UnknownEvent
from .storage import EXPIRED_SELECT
from .values import Effect, Message, Metrics, State, Status, Transition

_MESSAGE_COLUMNS = ("event_id, payload, state, attempts, generation, available_at, "
                    "lease_until, last_error")


class QueueViews:
    """The read-only half of ``Queue``: what is stored, as it is stored."""

    clock: Clock
    _connection: Callable[[], AbstractContextManager[sqlite3.Connection]]

    def status(self) -> Status:
        """Counts per state, effects and money, as stored; recovers nothing."""
        with self._connection() as conn:
            states = _state_counts(conn)
            totals = dict(conn.execute("SELECT category, sum(amount_cents) FROM effects "
                                       "GROUP BY category ORDER BY category"))
            effects = conn.execute("SELECT count(*) FROM effects").fetchone()[0]
        return Status(states, effects, totals, sum(totals.values()))

    def metrics(self) -> Metrics:
        """Depth by state, age of the oldest due message, expired leases not yet
        recovered, and the attempts each dead message spent; recovers nothing."""
        now = self.clock.now()
        with self._connection() as conn:
            depth = _state_counts(conn)
            oldest = conn.execute("SELECT min(available_at) FROM messages "
                                  "WHERE state = 'ready' AND available_at <= ?", (now,)).fetchone()[0]
            expired = conn.execute(f"SELECT count(*) FROM ({EXPIRED_SELECT})", (now,)).fetchone()[0]
            dead = dict(conn.execute("SELECT event_id, attempts FROM messages "
                                     "WHERE state = 'dead' ORDER BY event_id"))
        return Metrics(now, depth, None if oldest is None else now - oldest, expired, dead)

    def message(self, event_id: str) -> Message:
        """The stored row of one message; raises ``UnknownEvent``."""
        with self._connection() as conn:
            row = conn.execute(f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE event_id = ?",
                               (event_id,)).fetchone()
        if row is None:
            raise UnknownEvent(f"no message {event_id}")
        return Message.from_row(row)

    def messages(self) -> list[Message]:
        """Every stored message, in event id order."""
        with self._connection() as conn:
            rows = conn.execute(f"SELECT {_MESSAGE_COLUMNS} FROM messages ORDER BY event_id")
            return [Message.from_row(row) for row in rows]

    def effects(self) -> dict[str, Effect]:
        """Every stored effect by event id."""
        with self._connection() as conn:
            rows = conn.execute("SELECT event_id, category, amount_cents FROM effects "
                                "ORDER BY event_id")
            return {event_id: Effect(category, amount) for event_id, category, amount in rows}

    def transitions(self, event_id: str | None = None) -> list[Transition]:
        """The journal of state changes in order, for one event or all."""
        query = ("SELECT seq, at, event_id, from_state, to_state, generation, attempts, reason "
                 "FROM transitions WHERE ? IS NULL OR event_id = ? ORDER BY seq")
        with self._connection() as conn:
            rows = conn.execute(query, (event_id, event_id)).fetchall()
        return [Transition(seq, at, eid, State(src) if src else None, State(dst), gen, att, why)
                for seq, at, eid, src, dst, gen, att, why in rows]


def _state_counts(conn: sqlite3.Connection) -> dict[str, int]:
    counts = {state.value: 0 for state in State}
    counts.update(conn.execute("SELECT state, count(*) FROM messages GROUP BY state"))
    return counts
