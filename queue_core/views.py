"""Reading a queue file (or database): counts, metrics, rows, effects and the journal.

Stored values only: nothing here recovers an expired lease or changes a
row, so looking at a queue never moves it. Each call reads in ONE read
transaction on a connection of its own that writes nothing and leaves the
file's folder as it found it (``Store.read``), or on the open session's,
so its figures never mix two moments, it never creates a file and it never
waits for the write lock. The queries live in ``audit``, the one reader of stored
facts. ``Queue`` inherits these.
"""

from __future__ import annotations

import sqlite3
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Callable, TypeVar

from .clock import Clock
from .errors import UnknownEvent
from .stores import Store
from .values import Effect, Message, Metrics, Status, Transition

if TYPE_CHECKING:
    from . import audit

T = TypeVar("T")


class QueueViews:
    """The read-only half of ``Queue``: what is stored, as it is stored."""

    clock: Clock
    path: str
    store: Store
    _session: sqlite3.Connection | None
    id_rule: str  # ``Queue.id_rule``

    def _read(self, body: Callable[[Any], T]) -> T:
        """``body(conn)`` in one read transaction: on the open session's
        connection, else on one of its own that leaves the folder as it was
        (``Store.read``)."""
        if self._session is not None:
            with self.store.read_transaction(self._session):
                return body(self._session)
        return self.store.read(body)

    def status(self) -> Status:
        """Counts per state, effects and money, as stored, at one moment; recovers nothing."""
        from . import audit  # loaded on first use, as in every call below
        return replace(self._read(audit.read_status), ids=self.id_rule)

    def metrics(self) -> Metrics:
        """Depth by state, age of the oldest due message, expired leases not yet
        recovered, and the attempts each dead message spent; recovers nothing."""
        from . import audit
        now = self.clock.now()
        return replace(self._read(lambda conn: audit.read_metrics(conn, now)), ids=self.id_rule)

    def message(self, event_id: str) -> Message:
        """The stored row of one message; raises ``UnknownEvent``."""
        from . import audit
        found = self._read(lambda conn: audit.read_messages(conn, event_id))
        if not found:
            raise UnknownEvent(f"no message {event_id}")
        return found[0]

    def messages(self) -> list[Message]:
        """Every stored message, in event id order."""
        from . import audit
        return self._read(audit.read_messages)

    def effects(self) -> dict[str, Effect]:
        """Every stored effect by event id."""
        from . import audit
        return {row.event_id: Effect(row.category, row.amount_cents)
                for row in self._read(audit.read_effects) if row.table == "effects"}

    def transitions(self, event_id: str | None = None) -> list[Transition]:
        """The journal of state changes in order, for one event or all."""
        from . import audit
        return self._read(lambda conn: audit.read_journal(conn, event_id))

    def snapshot(self) -> audit.Snapshot:
        """Every stored fact at one moment (see ``queue_core.audit``)."""
        from . import audit
        return audit.snapshot(self.path)

    def audit(self) -> list[audit.Finding]:
        """The invariants the file violates now, as named findings; none when all holds."""
        from . import audit
        return audit.findings(self.path)
