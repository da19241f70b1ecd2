"""No worker holds a message hostage beyond the bound stated for its server.

A real ``queue-core work`` process stalls inside its ACK, after the guarded
``done`` UPDATE has locked the message's row: a proxy that stops forwarding,
or the process stopped by SIGSTOP. Another worker, whose model clock is past
the lease, polls its claims against a real-time deadline
(``queue_core.lab.sweeps.hostage``). How long the message was held is read
from the server's clock (``held``: the stalled transaction's ``xact_start``
to the moment a session queued on the row got it), so the checks below
hold however busy the machine is: freed while the stall lasted, and never
before the limit. README and notebook 10 state the bound:

- PostgreSQL 17 and later: ``transaction_timeout`` (5 s) after the stalled
  transaction began, the server ends it and the other worker claims the
  message; the stalled worker, once it can go on, reads ``connection_lost``.
- PostgreSQL 16: no setting bounds it. The message is held for as long as
  the stall lasts, and is free at once when the stalled connection closes.
"""

from __future__ import annotations

import pytest

from queue_core.lab.sweeps.hostage import hold_hostage
from queue_core.postgres.session import TRANSACTION_TIMEOUT_MS

BOUND = TRANSACTION_TIMEOUT_MS / 1000
# Real seconds the watch goes on past the bound: only a run that fails waits them.
WATCH_MORE = 15.0
DONE_ONCE = (700, 1, (("ready", 0), ("leased", 0), ("done", 1), ("dead", 0)))


@pytest.mark.parametrize("how", ["blackhole", "stopped"])
def test_a_worker_stalled_mid_transaction_keeps_its_message_no_longer_than_the_stated_bound(
        pg_server: str, how: str) -> None:
    run = hold_hostage(pg_server, how, watch_seconds=BOUND + WATCH_MORE)

    # mid-pipeline: the server waits for the client, so no idle-in-transaction limit fires
    assert run.holder == ("active", "ClientRead")
    assert (run.money, run.effects, run.states) == DONE_ONCE
    if run.server_major >= 17:
        assert run.bound == BOUND
        assert run.freed_after is not None, f"held for all of {run.watched} s"
        assert run.held is not None and run.held >= BOUND, run  # by the server's clock
        assert run.holder_line.startswith("error: connection_lost: postgresql://"), run
        assert "whether the transaction in flight committed is unknown" in run.holder_line
    else:  # PostgreSQL 16: the window stays open as long as the stall lasts
        assert (run.bound, run.freed_after) == (None, None), run
        if how == "blackhole":  # the proxy closes: the server rolls back, the message is free
            assert run.freed_after_end is not None, run
        else:  # the stopped worker resumed and finished its message itself
            assert run.holder_line.startswith("nothing left to claim"), run


def test_a_shorter_transaction_timeout_frees_the_message_sooner(pg_server: str) -> None:
    import psycopg

    with psycopg.connect(pg_server) as conn:
        if conn.info.server_version < 170000:
            pytest.skip("PostgreSQL 16 has no transaction_timeout")
    run = hold_hostage(pg_server, "blackhole", transaction_timeout_ms=1000,
                       watch_seconds=1.0 + WATCH_MORE)

    # freed during the stall; below the module's limit, which could not have ended it sooner
    assert run.bound == 1.0 and run.freed_after is not None and run.held is not None
    assert 1.0 <= run.held < BOUND, run
    assert (run.money, run.effects, run.states) == DONE_ONCE


def test_an_unknown_way_to_stall_is_refused_before_anything_starts(pg_server: str) -> None:
    with pytest.raises(ValueError, match="how must be"):
        hold_hostage(pg_server, "unplugged")
