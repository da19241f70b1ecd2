"""A PostgreSQL server for the tests, and a fresh schema per test.

``QUEUE_CORE_PG_DSN`` names a server to use (its user must be allowed to
create schemas); without it a private server is started once per session
with ``pgserver`` in a temporary folder, and stopped at the end. Each test
gets its own schema, named in the connection string's ``search_path``, so
every table the queue creates is new, and is dropped afterwards.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import pytest

DSN_VARIABLE = "QUEUE_CORE_PG_DSN"
ROOT = Path(__file__).resolve().parent.parent
_counter = itertools.count(1)


def private_server() -> Iterator[str]:
    """Start PostgreSQL with ``pgserver`` in a temporary folder; yield its DSN; stop it."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # XDG_RUNTIME_DIR unset in containers
            import pgserver
    except ImportError as exc:
        pytest.skip(f"no PostgreSQL: set {DSN_VARIABLE} to a server's postgresql:// "
                    f"connection string (pgserver is not available here: {exc})")
    folder = tempfile.mkdtemp(prefix="queue_core_pg_")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            server = pgserver.get_server(folder, cleanup_mode="stop")
    except Exception as exc:  # noqa: BLE001 - any failure to start means: no server here
        shutil.rmtree(folder, ignore_errors=True)
        pytest.skip(f"no PostgreSQL: pgserver could not start one ({exc}); "
                    f"set {DSN_VARIABLE} to a server's postgresql:// connection string")
    try:
        yield server.get_uri()
    finally:
        server.cleanup()
        shutil.rmtree(folder, ignore_errors=True)


def server_dsn() -> Iterator[str]:
    """``QUEUE_CORE_PG_DSN`` if set, else a private server for the session."""
    given = os.environ.get(DSN_VARIABLE)
    if given:
        yield given
        return
    yield from private_server()


def with_schema(dsn: str, schema: str) -> str:
    """``dsn`` whose connections use ``schema`` as their current schema."""
    parts = urlsplit(dsn)
    query = dict(parse_qsl(parts.query))
    query["options"] = f"{query.get('options', '')} -csearch_path={schema}".strip()
    return urlunsplit(parts._replace(query=urlencode(query)))


def fresh_schema(dsn: str) -> Iterator[str]:
    """Create an empty schema, yield a DSN that works in it, drop it afterwards."""
    import psycopg

    schema = f"queue_test_{os.getpid()}_{next(_counter)}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        yield with_schema(dsn, schema)
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            # A crashed worker's session may still be ending: wait for its locks.
            conn.execute("SET lock_timeout = '10s'")
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


def run_worker(db: str, *, now: int | None = 1000, lease_seconds: int = 2,
               crash_at: str | None = None, mode: str = "one", wait: bool = True,
               gate: str | None = None) -> Any:
    """``queue_core.lab.child``'s worker in a new OS process, with this checkout
    first on its path (so that psycopg's ``import queue`` finds the standard
    library's module, whatever the course's runner puts on the path)."""
    from queue_core.lab.child import collect

    spec = {"db": db, "now": now, "lease_seconds": lease_seconds, "crash_at": crash_at,
            "mode": mode, "accept": [], "batch_size": 1, "protocol": "protocol",
            "faults": {}, "crash_after": 1, "gate": gate}
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "queue_core.lab.child", json.dumps(spec)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    return collect(proc) if wait else proc
