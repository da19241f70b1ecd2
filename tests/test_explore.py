"""The schedule explorer: every interleaving of a small scenario on the real engine.

Each schedule runs on a real SQLite file with the real ``Queue`` or a broken
contrast's subclass; only the clock is modelled.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from queue_core import ModelClock, audit
from queue_core.lab.contrasts import PROTOCOLS
from queue_core.lab.explore import (DEFAULT, FINISH, SMALL, SPLIT, Scenario, Step, _runner,
                                    explore, replay)
from queue_core.lab.schedule import HANDOFF

BROKEN = [name for name, proto in PROTOCOLS.items() if proto.broken]


@pytest.fixture(scope="module")
def default_runs() -> dict[str, object]:
    """The default scenario explored once per protocol (about 25 s for all four)."""
    return {name: explore(name, DEFAULT) for name in PROTOCOLS}


def test_the_protocol_survives_every_schedule_of_the_default_scenario(default_runs) -> None:
    run = default_runs["protocol"]

    assert run.violations == [] and run.shortest is None
    assert (run.states, run.schedules, run.ends) == (3913, 48673680, 103)
    assert run.seconds < 30


@pytest.mark.parametrize("name", BROKEN)
def test_the_explorer_catches_each_broken_protocol_within_eight_steps(default_runs,
                                                                       name: str) -> None:
    shortest = default_runs[name].shortest

    assert shortest is not None and len(shortest.schedule) <= 8
    expected = {"mark then write": "done_without_effect", "write then mark": "effect_without_done",
                "no generation check": "stale_lease_accepted"}[name]
    assert any(found.startswith(expected) for found in shortest.findings)


@pytest.mark.parametrize("name", BROKEN)
def test_a_replayed_counterexample_reproduces_the_same_journal_and_findings(default_runs,
                                                                            name: str) -> None:
    shortest = default_runs[name].shortest

    again = replay(name, DEFAULT, shortest.schedule)

    assert again.journal == shortest.journal
    assert again.findings[-1] == shortest.findings
    assert all(found == () for found in again.findings[:-1])  # the last step breaks it


def test_the_no_generation_check_counterexample_is_a_stale_ack_of_money(default_runs) -> None:
    shortest = default_runs["no generation check"].shortest

    again = replay("no generation check", DEFAULT, shortest.schedule)

    assert [str(step) for step in shortest.schedule] == [
        "the producer enqueues the events", "W1 claims", "W1 ACKs", "W1 claims",
        "the clock jumps to 1002", "W2 claims", "W1 ACKs"]
    assert again.said[-1] == "W1 ACKs E0002 (g1): done, +2000"
    assert again.money == 12000  # right money, but the stale worker's ACK was accepted


def test_the_count_of_distinct_states_of_the_small_scenario_is_pinned() -> None:
    counts = {name: (run.states, run.schedules, len(run.violations))
              for name in PROTOCOLS for run in [explore(name, SMALL)]}

    assert counts == {"protocol": (110, 2584, 0), "mark then write": (85, 472, 32),
                      "write then mark": (85, 472, 32), "no generation check": (110, 420, 30)}


def test_the_worker_loops_step_reaches_no_state_an_ack_then_a_claim_cannot_reach() -> None:
    # The protocol's workers may also ACK and claim the next in one transaction:
    # more schedules, the same distinct states (110, as "no generation check",
    # whose workers ACK and claim in two transactions, reach with the same steps).
    fused = explore("protocol", SMALL)
    run = replay("protocol", DEFAULT, [Step("producer", "enqueue"), Step("W1", "claims"),
                                       Step("W1", HANDOFF)])

    assert fused.states == explore("no generation check", SMALL).states == 110
    assert run.said[-1] == ("W1 ACKs E0001 (g1): done, +10000, and claims E0002 (g1), "
                            "lease until 1002")
    assert [(t.event_id, t.reason) for t in run.journal[-2:]] == [("E0001", "completed"),
                                                                  ("E0002", "claimed")]


def test_merging_states_covers_exactly_the_schedules_of_the_unmerged_tree() -> None:
    merged = explore("no generation check", SMALL)
    tree = explore("no generation check", SMALL, merge=False)

    assert merged.schedules == tree.schedules == 420
    assert merged.schedules_by_length == tree.schedules_by_length
    assert merged.tree_steps == tree.steps_run == 957
    assert merged.steps_run == 235


@pytest.mark.parametrize("name", SPLIT)
def test_the_two_halves_of_a_split_ack_store_what_its_complete_stores(tmp_path: Path,
                                                                      name: str) -> None:
    scenario = Scenario(events=(("E0001", "book", 10000),), workers=1)
    stepped = replay(name, scenario, [Step("producer", "enqueue"), Step("W1", "claims"),
                                      Step("W1", "ACKs (part 1)"), Step("W1", "ACKs (part 2)")])
    queue = PROTOCOLS[name].open(tmp_path / "whole.sqlite3", clock=ModelClock(scenario.start),
                                 lease_seconds=scenario.lease_seconds)
    queue.enqueue_jsonl(scenario.jsonl())
    queue.complete(queue.claim(), scenario.handler())

    whole = audit.snapshot(tmp_path / "whole.sqlite3")
    assert stepped.journal == whole.journal
    assert (stepped.money, stepped.findings[-1], audit.check(whole)) == (10000, (), [])
    assert whole.effect_rows[0].table == "naive_ledger"


def test_a_schedule_cut_by_the_bound_is_finished_by_a_fresh_worker() -> None:
    crash = [Step("producer", "enqueue"), Step("W1", "claims"), Step("W1", "crashes"), FINISH]

    again = replay("protocol", SMALL, crash)

    assert again.findings[-1] == ()  # the promise holds once the queue is finished
    assert again.money == 10000
    assert [(t.to_state.value, t.generation, t.reason) for t in again.journal] == [
        ("ready", 0, "enqueued"), ("leased", 1, "claimed"), ("ready", 1, "lease_expired"),
        ("leased", 2, "claimed"), ("done", 2, "completed")]
    assert [m.label for m in again.marks] == ["W1 crashes"]


def test_the_restored_file_is_the_whole_state(tmp_path: Path) -> None:
    with _runner(PROTOCOLS["protocol"], SMALL, tmp_path) as runner:
        empty = runner.image()
        world, _, _ = runner.apply(runner.start(), Step("producer", "enqueue"))
        assert audit.snapshot(runner.path).status.states["ready"] == 1

        runner.restore(empty)

        assert audit.snapshot(runner.path).messages == {}
