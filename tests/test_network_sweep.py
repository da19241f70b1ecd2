"""The network sweep (``queue_core.lab.sweeps.network``): real worker processes
whose connection breaks at each step, each run judged by the audit.

The protocol ends every case with exact money, effects and states; the
commit whose outcome is unknown leaves the first ACKed message done with its
effect, or leased and then redelivered and done once; each broken contrast
is caught, and the one that runs a message again after a lost connection
doubles the money.
"""

from __future__ import annotations

import pytest

from queue_core.lab.sweeps.network import FAULTS, STEPS, NetRow, run_network_sweep
from queue_core.lab.sweeps.sweep import (EXPECTED_DEAD, EXPECTED_DONE, EXPECTED_TOTAL,
                                         MIXED_PRIORITIES)

FINAL_STATES = (("ready", 0), ("leased", 0), ("done", len(EXPECTED_DONE)),
                ("dead", len(EXPECTED_DEAD)))


@pytest.fixture(scope="module")
def protocol_rows(pg_server: str) -> list[NetRow]:
    return run_network_sweep(pg_server, ["protocol"])


@pytest.fixture(scope="module")
def mixed_rows(pg_server: str) -> list[NetRow]:
    """The same sweep, the events enqueued with mixed priorities (E0001 still first)."""
    return run_network_sweep(pg_server, ["protocol"], priorities=MIXED_PRIORITIES)


@pytest.mark.parametrize("step", list(STEPS))
@pytest.mark.parametrize("rows_of", ["protocol_rows", "mixed_rows"],
                         ids=["one priority", "mixed priorities"])
def test_the_protocol_finishes_every_message_once_whichever_step_loses_the_network(
        request: pytest.FixtureRequest, rows_of: str, step: str) -> None:
    rows = [row for row in request.getfixturevalue(rows_of) if row.step == step]

    assert [row.fault for row in rows] == list(FAULTS)
    for row in rows:
        assert (row.outcome, row.total, row.effects, row.states) == (
            "ok", EXPECTED_TOTAL, len(EXPECTED_DONE), FINAL_STATES), row
        # a broken connection ends the worker with its one line; a slow one does not
        assert row.worker == ("finished" if row.fault == "delay" else "connection_lost"), row


@pytest.mark.parametrize("rows_of", ["protocol_rows", "mixed_rows"],
                         ids=["one priority", "mixed priorities"])
def test_the_commit_whose_outcome_is_unknown_is_settled_either_way(
        request: pytest.FixtureRequest, rows_of: str) -> None:
    cases = {(row.step, row.fault): row.first_ack for row in request.getfixturevalue(rows_of)}

    for fault in ("cut", "reset", "blackhole"):
        # the server committed, the worker never heard: done with its effect, once
        assert cases["commit.answered", fault] == "done at generation 1, then done at generation 1"
        # the COMMIT never arrived: leased, then redelivered and done once
        assert cases["commit.sent", fault] == "leased at generation 1, then done at generation 2"


@pytest.mark.parametrize("name, step, fault, outcome, total", [
    ("mark then write", "commit.answered", "cut", "lost money", EXPECTED_TOTAL - 3000),
    ("mark then write", "effect.insert", "reset", "lost money", EXPECTED_TOTAL - 3000),
    ("write then mark", "ack.update", "cut", "doubled money", EXPECTED_TOTAL + 3000),
    ("write then mark", "commit.sent", "blackhole", "doubled money", EXPECTED_TOTAL + 3000),
    ("no generation check", "ack.update", "delay", "stuck", None),
    ("rerun after lost connection", "commit.answered", "cut", "doubled money",
     EXPECTED_TOTAL + 3000),
    ("rerun after lost connection", "ack.update", "reset", "doubled money",
     EXPECTED_TOTAL + 3000),
], ids=lambda value: str(value).replace(" ", "_"))
def test_each_broken_protocol_is_caught_by_the_network_sweep(
        pg_server: str, name: str, step: str, fault: str, outcome: str, total: int | None
        ) -> None:
    [row] = run_network_sweep(pg_server, [name], [step], [fault], jobs=1)

    assert row.outcome == outcome, row
    if total is not None:
        assert row.total == total, row
        # E0001 (toy, 3000) is the first message: its effect is what is lost or doubled
        assert row.effects == len(EXPECTED_DONE) + (1 if outcome == "doubled money" else -1), row


def test_the_rerun_contrast_believes_it_succeeded_while_the_protocol_says_the_outcome_is_unknown(
        pg_server: str) -> None:
    naive, real = run_network_sweep(pg_server, ["rerun after lost connection", "protocol"],
                                    ["commit.answered"], ["cut"])

    assert (naive.worker, naive.outcome) == ("finished", "doubled money")
    assert (real.worker, real.outcome, real.total) == ("connection_lost", "ok", EXPECTED_TOTAL)


def test_an_unknown_step_is_refused_before_anything_runs(pg_server: str) -> None:
    with pytest.raises(ValueError, match="unknown step 'commit.later'"):
        run_network_sweep(pg_server, ["protocol"], ["commit.later"])
