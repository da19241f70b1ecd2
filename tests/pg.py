"""A PostgreSQL server for the tests, and a fresh schema per test.

``queue_core.lab.private_postgres`` supplies the server once per session:
``QUEUE_CORE_PG_DSN`` if set (its user must be allowed to create schemas),
else a private server from ``pgserver`` in a temporary folder. Without a
server the PostgreSQL tests are skipped with the reason, unless
``QUEUE_CORE_PG_REQUIRED=1`` says this machine must have one: then they fail.
Each test gets its own schema, named in the connection string's
``search_path``, so every table the queue creates is new, and is dropped
afterwards.
"""

from __future__ import annotations

from typing import Callable, ContextManager, Iterator
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

from queue_core.lab.postgres_server import (NoPostgres, drop_schema, fresh_schema as new_schema,
                                            own_server, private_postgres)
from servers import server_or_skip

REQUIRED_VARIABLE = "QUEUE_CORE_PG_REQUIRED"


def server_dsn(start: Callable[[], ContextManager[str]] = private_postgres) -> Iterator[str]:
    """``QUEUE_CORE_PG_DSN`` if set, else a private server for the session (or
    whatever ``start`` gives); no server is a skip, or a failure where
    ``QUEUE_CORE_PG_REQUIRED=1``."""
    yield from server_or_skip(start, NoPostgres, REQUIRED_VARIABLE)


def fresh_schema(dsn: str) -> Iterator[str]:
    """Create an empty schema, yield a DSN that works in it, drop it afterwards."""
    schema_dsn = new_schema(dsn, prefix="queue_test")
    try:
        yield schema_dsn
    finally:
        drop_schema(schema_dsn)


def with_lock_timeout(dsn: str, *, milliseconds: int) -> str:
    """``dsn`` whose sessions give up on a lock after ``milliseconds``, so that
    a statement which should never wait fails a test instead of hanging it."""
    parts = urlsplit(dsn)
    query = dict(parse_qsl(parts.query))
    query["options"] = f"{query.get('options', '')} -clock_timeout={milliseconds}".strip()
    return urlunsplit(parts._replace(query=urlencode(query, quote_via=quote)))
