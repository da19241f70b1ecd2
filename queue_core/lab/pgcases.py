"""A fresh PostgreSQL schema per case, for the sweep, the stress run and the benchmark.

A queue on PostgreSQL lives in its connection's current schema. Every case
of a sweep needs an empty one, as every SQLite case needs a new file: a
``Schemas`` creates them on a server (named in a ``postgresql://``
connection string), hands out a connection string whose ``search_path``
names each, and drops them all when it is closed.
"""

from __future__ import annotations

import itertools
import os
from types import TracebackType
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from ..storage import is_connection_string

_counter = itertools.count(1)
DROP_LOCK_TIMEOUT = "10s"  # a killed worker's session may still be ending


def with_schema(dsn: str, schema: str) -> str:
    """``dsn`` whose connections use ``schema`` as their current schema."""
    parts = urlsplit(dsn)
    query = dict(parse_qsl(parts.query))
    query["options"] = f"{query.get('options', '')} -csearch_path={schema}".strip()
    return urlunsplit(parts._replace(query=urlencode(query)))


class Schemas:
    """Empty schemas on one server, each dropped by ``close`` (or leaving a ``with``)."""

    def __init__(self, dsn: str, prefix: str = "queue_case") -> None:
        if not is_connection_string(dsn):
            raise ValueError("Schemas needs a postgresql:// connection string")
        self.dsn, self.prefix = dsn, prefix
        self.created: list[str] = []

    def fresh(self, label: str = "") -> str:
        """Create a new, empty schema; return a connection string that works in it."""
        import psycopg

        tag = "".join(c if c.isalnum() else "_" for c in label.lower())[:30]
        schema = f"{self.prefix}_{os.getpid()}_{next(_counter)}{'_' + tag if tag else ''}"
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {schema}")
        self.created.append(schema)
        return with_schema(self.dsn, schema)

    def close(self) -> None:
        """Drop every schema this object created (waiting for a dying session's locks)."""
        import psycopg

        if not self.created:
            return
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(f"SET lock_timeout = '{DROP_LOCK_TIMEOUT}'")
            while self.created:
                conn.execute(f"DROP SCHEMA IF EXISTS {self.created.pop()} CASCADE")

    def __enter__(self) -> "Schemas":
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()
