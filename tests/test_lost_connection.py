"""A PostgreSQL connection lost at a chosen moment of a worker's conversation
with the server: one line, with the ``connection_lost`` code and what it means,
and no message of a library beside it.
"""

from __future__ import annotations

import gc

import psycopg
import pytest

from queue_core.postgres import PostgresStore


def test_a_transaction_whose_backend_ends_before_its_commit_leaves_no_pipeline_behind(
        pg_dsn: str, caplog: pytest.LogCaptureFixture) -> None:
    """psycopg's ``Pipeline`` left open on a broken connection is closed by the
    garbage collector, whenever it runs, and then logs ``error ignored terminating
    <psycopg.Pipeline [BAD] ...>``: a second line beside the command's one."""
    store = PostgresStore(pg_dsn)
    conn = store.connect()
    try:
        with pytest.raises(psycopg.OperationalError):
            with store.transaction(conn):  # BEGIN sent; the COMMIT will meet a dead backend
                with psycopg.connect(pg_dsn, autocommit=True) as other:
                    assert other.execute("SELECT pg_terminate_backend(%s, 30000)",
                                         (conn.raw.info.backend_pid,)).fetchone() == (True,)
        gc.collect()
    finally:
        conn.close()
    gc.collect()

    assert [record.getMessage() for record in caplog.records if record.name == "psycopg"] == []
