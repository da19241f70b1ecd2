"""The fault proxy (``queue_core.lab.servers.faultproxy``): loopback only, the
wire protocol's messages, a fault at a named statement or reply, a lifetime
after which it stops by itself; and the client's TCP settings on its socket.

Real server, real sockets; every wait is a poll against a deadline.
"""

from __future__ import annotations

import socket
import struct
import time

import psycopg
import pytest

from queue_core.errors import ConnectionLost
from queue_core.lab.servers.faultproxy import Fault, FaultProxy
from queue_core.postgres.session import (KEEPALIVE_COUNT, KEEPALIVE_IDLE_SECONDS,
                                  KEEPALIVE_INTERVAL_SECONDS, TCP_USER_TIMEOUT_MS)
from queue_core.postgres import PostgresStore


def wait_until(condition, seconds: float = 10.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def marked(dsn: str) -> list[int]:
    with psycopg.connect(dsn) as conn:
        return [row[0] for row in conn.execute("SELECT n FROM marker ORDER BY n")]


@pytest.fixture
def marker(pg_dsn: str) -> str:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE marker (n integer)")
    return pg_dsn


@pytest.mark.parametrize("fault, message", [
    (dict(action="drop"), "unknown action"),
    (dict(action="cut"), "exactly one moment"),
    (dict(action="cut", statement="COMMIT", reply="COMMIT"), "exactly one moment"),
    (dict(action="cut", statement="COMMIT", occurrence=0), "counts from 1"),
    (dict(action="delay", statement="COMMIT", seconds=61), "from 0 to 60"),
], ids=["action", "no-moment", "two-moments", "occurrence", "seconds"])
def test_a_fault_that_names_no_single_moment_or_action_is_refused(fault: dict, message: str
                                                                  ) -> None:
    with pytest.raises(ValueError, match=message):
        Fault(**fault)


def test_the_proxy_listens_on_loopback_only_and_forwards_to_no_other_host(pg_server: str) -> None:
    with pytest.raises(ValueError, match="only to this host"):
        FaultProxy("postgresql://user@db.example.com:5432/postgres")
    with FaultProxy(pg_server, lifetime=5) as proxy:
        assert proxy._listener.getsockname()[0] == "127.0.0.1"
        assert proxy.dsn(pg_server).startswith(f"postgresql://postgres:@127.0.0.1:{proxy.port}/")
        assert proxy.dsn(pg_server).endswith("sslmode=disable")


def test_an_ssl_request_is_answered_no_and_the_client_goes_on_in_clear_text(
        pg_server: str) -> None:
    with FaultProxy(pg_server, lifetime=10) as proxy:
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as raw:
            raw.sendall(struct.pack("!II", 8, 80877103))
            assert raw.recv(1) == b"N"
        prefer = proxy.dsn(pg_server).replace("sslmode=disable", "sslmode=prefer")
        with psycopg.connect(prefer) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
            assert conn.pgconn.ssl_in_use is False


def test_a_client_socket_carries_the_keepalive_and_user_timeout_settings(pg_dsn: str) -> None:
    """The server's half of these settings needs a TCP peer; the private server
    listens on a Unix socket only, so only the client's half is seen here."""
    with FaultProxy(pg_dsn, lifetime=10) as proxy:
        conn = PostgresStore(proxy.dsn(pg_dsn)).connect()
        try:
            sock = socket.socket(fileno=__import__("os").dup(conn.raw.fileno()))
            options = (sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
                       sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
                       sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL),
                       sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT),
                       sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT))
            sock.close()
        finally:
            conn.close()

    assert options == (1, KEEPALIVE_IDLE_SECONDS, KEEPALIVE_INTERVAL_SECONDS, KEEPALIVE_COUNT,
                       TCP_USER_TIMEOUT_MS)


def test_a_cut_before_a_statement_reaches_the_server_leaves_nothing_committed(
        marker: str) -> None:
    store_dsn = marker
    with FaultProxy(marker, Fault("cut", statement="INSERT INTO marker", occurrence=2),
                    lifetime=20) as proxy:
        store = PostgresStore(proxy.dsn(store_dsn))
        conn = store.connect()
        try:
            with store.transaction(conn):
                conn.execute("INSERT INTO marker VALUES (1)")
            with pytest.raises(ConnectionLost):
                with store.transaction(conn):
                    conn.execute("INSERT INTO marker VALUES (2)")
        finally:
            conn.close()

    assert proxy.fired.is_set() and marked(store_dsn) == [1]


def test_a_cut_after_the_server_answered_commit_commits_what_the_client_saw_fail(
        marker: str) -> None:
    """The commit whose outcome is unknown: the client is told the connection
    broke, and the row is there."""
    with FaultProxy(marker, Fault("cut", reply="COMMIT"), lifetime=20) as proxy:
        store = PostgresStore(proxy.dsn(marker))
        conn = store.connect()
        try:
            with pytest.raises(ConnectionLost) as lost:
                with store.transaction(conn):
                    conn.execute("INSERT INTO marker VALUES (7)")
        finally:
            conn.close()

    assert "unknown" in str(lost.value)
    assert marked(marker) == [7]


def test_a_prepared_statement_is_found_by_its_bind_as_by_its_parse(marker: str) -> None:
    with FaultProxy(marker, Fault("cut", statement="INSERT INTO marker", occurrence=4),
                    lifetime=20) as proxy:
        with psycopg.connect(proxy.dsn(marker), autocommit=True) as conn:
            with pytest.raises(psycopg.OperationalError):
                for n in range(1, 7):
                    conn.execute("INSERT INTO marker VALUES (%s)", (n,), prepare=True)

    assert marked(marker) == [1, 2, 3]


def test_a_delay_holds_the_message_until_released_and_then_goes_on(marker: str) -> None:
    with FaultProxy(marker, Fault("delay", statement="INSERT INTO marker", seconds=30),
                    lifetime=40) as proxy:
        import threading

        done = threading.Event()

        def insert() -> None:
            with psycopg.connect(proxy.dsn(marker), autocommit=True) as conn:
                conn.execute("INSERT INTO marker VALUES (5)")
            done.set()

        thread = threading.Thread(target=insert)
        thread.start()
        assert wait_until(proxy.fired.is_set)
        held = marked(marker)
        proxy.release()
        assert done.wait(10)
        thread.join(10)

    assert (held, marked(marker)) == ([], [5])


def test_the_proxy_ends_every_connection_and_stops_by_itself_after_its_lifetime(
        pg_server: str) -> None:
    proxy = FaultProxy(pg_server, lifetime=1.0)
    try:
        conn = psycopg.connect(proxy.dsn(pg_server), autocommit=True)
        assert conn.execute("SELECT 1").fetchone() == (1,)
        assert wait_until(lambda: not proxy._thread.is_alive(), seconds=10)
        with pytest.raises(psycopg.OperationalError):
            conn.execute("SELECT 1")
        conn.close()
    finally:
        proxy.close()
