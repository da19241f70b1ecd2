"""A fresh PostgreSQL schema per case, for the sweep, the stress run and the benchmark.

A queue on PostgreSQL lives in its connection's current schema. Every case
of a sweep needs an empty one, as every SQLite case needs a new file: a
``Schemas`` creates them on a server (named in a ``postgresql://``
connection string) with ``postgres_server.fresh_schema``, hands out a
connection string whose ``search_path`` names each, and drops them all when
it is closed.
"""

from __future__ import annotations

from types import TracebackType

from ...sqlite import is_connection_string
from .postgres_server import drop_schema, fresh_schema


class Schemas:
    """Empty schemas on one server, each dropped by ``close`` (or leaving a ``with``)."""

    def __init__(self, dsn: str, prefix: str = "queue_case") -> None:
        if not is_connection_string(dsn):
            raise ValueError("Schemas needs a postgresql:// connection string")
        self.dsn, self.prefix = dsn, prefix
        self.created: list[str] = []

    def fresh(self, label: str = "") -> str:
        """Create a new, empty schema; return a connection string that works in it."""
        tag = "".join(c if c.isalnum() else "_" for c in label.lower())[:20]
        created = fresh_schema(self.dsn, f"{self.prefix}_{tag}" if tag else self.prefix)
        self.created.append(created)
        return created

    def close(self) -> None:
        """Drop every schema this object created (waiting for a dying session's locks)."""
        while self.created:
            drop_schema(self.created.pop())

    def __enter__(self) -> "Schemas":
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()
