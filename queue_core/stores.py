"""Which store holds a queue, and what the protocol asks of one.

The protocol (``queue``) is written once; a store supplies only what
differs per database: connecting, the transaction mechanics, how a guarded
statement's row reaches the journal, and the checks only the database can
make about itself. ``sqlite.SqliteStore`` keeps a queue in one file,
``postgres.PostgresStore`` in a PostgreSQL schema. This module stands above
both, so neither imports the other; psycopg is imported only when a
connection string is opened, so SQLite users never need it.
"""

from __future__ import annotations

import os
from contextlib import AbstractContextManager
from typing import Any, Callable, Protocol, TypeVar

from .sqlite import SqliteStore, is_connection_string

__all__ = ["Store", "is_connection_string", "open_store"]

T = TypeVar("T")


class Store(Protocol):
    """What the protocol asks of a database; ``SqliteStore`` and
    ``postgres.PostgresStore`` are the two there are."""

    name: str
    target: str                                      # the path or the connection string
    schema_version: int                              # the version this engine writes here
    fused_step: bool                                 # whether ``step`` exists (PostgreSQL)
    journal_by_event: bool                           # whether the journal has an event_id index
    row_locks: bool                                  # whether ``picked`` can leave a row out
    expired: str                                     # its read of expired leases (``EXPIRED``)
    integrity_errors: tuple[type[BaseException], ...]
    errors: tuple[type[BaseException], ...]

    def picked(self, read: str) -> str:
        """What follows ``event_id`` in a write's WHERE to change exactly the
        rows that ``read`` (a ``SELECT event_id ...``) picks, read once."""
        ...

    def describe(self) -> str: ...
    def prepare(self, *, create: bool = True) -> int:
        """Create the queue if allowed and missing, or check its mark; return its
        schema version (``schema_version``, or an earlier one that ``migrate``
        upgrades). Writes nothing unless it creates."""
        ...
    def migrate_step(self, version: int) -> int | None:
        """Upgrade the queue from schema ``version`` to the next in ONE transaction
        that reads the version again inside it; return the messages rewritten,
        or ``None`` if another migrator had already done it (see ``migrations``)."""
        ...
    def connect(self, *, synchronous: str = "FULL") -> Any: ...
    def connect_readonly(self) -> Any: ...
    def turns(self, conn: Any) -> AbstractContextManager[None]:
        """In the block, ``conn``'s write transactions take turns with the other
        workers of this queue, where its database admits one writer (SQLite)."""
        ...

    def read(self, body: Callable[[Any], T]) -> T:
        """``body(conn)`` in one read transaction on a connection of its own,
        which writes nothing (on SQLite: and leaves the file's folder as it was)."""
        ...
    def transaction(self, conn: Any, *, relaxed: bool = False) -> Any: ...
    def read_transaction(self, conn: Any) -> Any: ...
    def serialize_enqueue(self, conn: Any) -> None: ...

    def transition(self, conn: Any, sql: str, params: tuple[Any, ...], at: int,
                   journal: list[tuple[Any, ...]], order: tuple[str, ...] = ()
                   ) -> list[tuple[Any, ...]]:
        """Run one guarded ``UPDATE ... RETURNING <journal row>, ...`` (see
        ``transitions``) and journal each changed row at ``at``: at once, or
        by adding it to ``journal`` for ``write_journal``. Returns the rows,
        sorted by the returned columns named in ``order``."""
        ...

    def write_journal(self, conn: Any, journal: list[tuple[Any, ...]]) -> None:
        """Write the journal rows ``transition`` left in ``journal``, if any."""
        ...

    def self_checks(self, conn: Any) -> tuple[tuple[str, ...], tuple[tuple[Any, ...], ...]]: ...


def open_store(target: str | os.PathLike[str]) -> Store:
    """The store for ``target``: a ``postgresql://`` connection string, else a file path.

    Writes nothing; ``prepare`` on the result does.
    """
    if is_connection_string(target):
        from .postgres import PostgresStore
        return PostgresStore(str(target))
    return SqliteStore(target)
