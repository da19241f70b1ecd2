"""Reading a queue file (or database): counts, metrics, rows, effects and the journal.

Stored values only: nothing here recovers an expired lease or changes a
row, so looking at a queue never moves it. Each call reads in ONE read
transaction on a read-only connection (or the open session's), so its
figures never mix two moments, it never creates a file and it never waits
for the write lock. The queries live in ``audit``, the one reader of stored
facts. ``Queue`` inherits these.
"""

from __future__ import annotations

import sqlite3
from contextlib import contextmanager
from typing import Iterator

from . import audit
from .clock import Clock
from .errors import UnknownEvent
from .stores import Store
from .values import Effect, Message, Metrics, Status, Transition


class QueueViews:
    """The read-only half of ``Queue``: what is stored, as it is stored."""

    clock: Clock
    path: str
    store: Store
    _session: sqlite3.Connection | None

    @contextmanager
    def _reading(self) -> Iterator[sqlite3.Connection]:
        if self._session is not None:
            with self.store.read_transaction(self._session):
                yield self._session
            return
        conn = self.store.connect_readonly()
        try:
            with self.store.read_transaction(conn):
                yield conn
        finally:
            conn.close()

    def status(self) -> Status:
        """Counts per state, effects and money, as stored, at one moment; recovers nothing."""
        with self._reading() as conn:
            return audit.read_status(conn)

    def metrics(self) -> Metrics:
        """Depth by state, age of the oldest due message, expired leases not yet
        recovered, and the attempts each dead message spent; recovers nothing."""
        now = self.clock.now()
        with self._reading() as conn:
            return audit.read_metrics(conn, now)

    def message(self, event_id: str) -> Message:
        """The stored row of one message; raises ``UnknownEvent``."""
        with self._reading() as conn:
            found = audit.read_messages(conn, event_id)
        if not found:
            raise UnknownEvent(f"no message {event_id}")
        return found[0]

    def messages(self) -> list[Message]:
        """Every stored message, in event id order."""
        with self._reading() as conn:
            return audit.read_messages(conn)

    def effects(self) -> dict[str, Effect]:
        """Every stored effect by event id."""
        with self._reading() as conn:
            return {row.event_id: Effect(row.category, row.amount_cents)
                    for row in audit.read_effects(conn) if row.table == "effects"}

    def transitions(self, event_id: str | None = None) -> list[Transition]:
        """The journal of state changes in order, for one event or all."""
        with self._reading() as conn:
            return audit.read_journal(conn, event_id)

    def snapshot(self) -> audit.Snapshot:
        """Every stored fact at one moment (see ``queue_core.audit``)."""
        return audit.snapshot(self.path)

    def audit(self) -> list[audit.Finding]:
        """The invariants the file violates now, as named findings; none when all holds."""
        return audit.findings(self.path)
