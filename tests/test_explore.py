"""The schedule explorer: every interleaving of a small scenario on the real engine.

Each schedule runs on a real SQLite file with the real ``Queue`` or a broken
contrast's subclass; only the clock is modelled.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from conftest import ROOT
from queue_core import ModelClock, audit
from queue_core.lab.story.contrasts import PROTOCOLS
from queue_core.lab.sweeps.explore import (DEFAULT, FINISH, SMALL, SPLIT, Scenario, Step, _runner,
                                    explore, plot_state_space, replay)
from queue_core.lab.sweeps.schedule import HANDOFF

BROKEN = [name for name, proto in PROTOCOLS.items() if proto.broken]
NOTEBOOK_11 = ROOT / "notebooks" / "11_every_interleaving.ipynb"


def markdown(path: Path) -> str:
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")


@pytest.fixture(scope="module")
def default_runs() -> dict[str, object]:
    """The default scenario explored once per protocol (about 25 s for all four)."""
    return {name: explore(name, DEFAULT) for name in PROTOCOLS}


def test_the_protocol_survives_every_schedule_of_the_default_scenario(default_runs) -> None:
    run = default_runs["protocol"]

    assert run.violations == [] and run.shortest is None
    assert (run.states, run.schedules, run.ends) == (3913, 48673680, 103)


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


@pytest.fixture(scope="module")
def small_runs() -> dict[str, object]:
    return {name: explore(name, SMALL) for name in PROTOCOLS}


def test_notebook_11_quotes_the_figures_make_explore_finds_for_the_worker_loops_step(
        default_runs) -> None:
    fused = default_runs["protocol"]
    apart = explore("protocol", replace(DEFAULT, fused=False))

    assert apart.violations == [] and apart.states == fused.states
    quoted = (f"{fused.schedules:,} schedules with the fused step, {apart.schedules:,} without, "
              f"and {fused.states:,} distinct states either way")
    assert quoted in markdown(NOTEBOOK_11), f"notebook 11 should say: {quoted}"


def test_without_the_fused_step_the_small_scenario_has_fewer_schedules_and_the_same_states(
        small_runs) -> None:
    apart = explore("protocol", replace(SMALL, fused=False))

    assert (apart.schedules, apart.states, apart.violations) == (500, 110, [])
    assert small_runs["protocol"].states == apart.states
    assert str(replace(SMALL, fused=False)).endswith(", ACK and claim in two transactions")


def test_no_schedule_of_the_small_scenario_reaches_a_redrive(small_runs) -> None:
    # Two clock jumps end at most two attempts, and a message dies only after three:
    # the redrive the scenario allows is never enabled, as notebook 11 says.
    for name, run in small_runs.items():
        without = explore(name, replace(SMALL, redrives=0))
        assert (without.schedules, without.states, len(without.violations)) == (
            run.schedules, run.states, len(run.violations)), name


def test_in_the_default_scenario_a_message_can_die_and_be_redriven() -> None:
    # notebook 11 says make explore's scenario reaches the redrive its own does not
    schedule = [Step("producer", "enqueue"), Step("W1", "claims"), Step("W1", HANDOFF),
                Step("W1", "crashes"), Step("clock", "jump", 1002), Step("W1", "claims"),
                Step("clock", "jump", 1004), Step("W1", "ACKs"), Step("W1", "claims"),
                Step("clock", "jump", 1006), Step("W2", "claims"), Step("operator", "redrive", "E0002")]

    again = replay("protocol", DEFAULT, schedule)

    assert all(found == () for found in again.findings)
    assert [(t.event_id, t.to_state.value, t.reason) for t in again.journal[-2:]] == [
        ("E0002", "dead", "attempts_exhausted"), ("E0002", "ready", "redrive")]


def test_the_small_scenarios_schedules_have_the_lengths_notebook_11_explains(small_runs) -> None:
    lengths = small_runs["protocol"].schedules_by_length

    assert lengths == {6: 56, 7: 96, 9: 960, 10: 1472}
    assert "never 8" in markdown(NOTEBOOK_11)


def test_the_state_space_plot_labels_every_bar_and_a_length_no_schedule_has(small_runs) -> None:
    import matplotlib.pyplot as plt

    run = small_runs["protocol"]
    fig = plot_state_space(run)
    left, right = fig.axes
    try:
        labels = {round(t.get_position()[0]): t.get_text() for t in right.texts}
        assert labels == {6: "56", 7: "96", 8: "none", 9: "960", 10: "1,472"}
        low, _ = right.get_ylim()
        assert right.get_yscale() == "log" and low < 1  # a bar of one schedule still shows
        heights = [bar.get_height() for bar in right.patches]
        assert [h for h in heights if h == h] == [56, 96, 960, 1472]  # NaN: the empty length
        fig.canvas.draw()
        ticks = [t.get_text() for t in right.get_yticklabels() if t.get_text()]
        assert ticks and all(t.replace(",", "").isdigit() for t in ticks)  # 1, 10, 100, 1,000
        assert [bar.get_height() for bar in left.patches] == run.states_by_depth
        assert (left.get_title(), right.get_title()) == (
            "110 distinct states", "2,584 schedules, each run to its end")
    finally:
        plt.close(fig)


def test_a_replayed_stale_ack_is_marked_with_its_worker_generation_and_finding(small_runs) -> None:
    shortest = small_runs["no generation check"].shortest

    again = replay("no generation check", SMALL, shortest.schedule)

    assert [(m.at, m.event_id, m.label, m.caught) for m in again.marks] == [
        (1002, "E0001", "W1 ACKs (g1); audit: stale_lease_accepted", True)]
    # drawn before the done row the stale ACK wrote, after W2's claim
    done = next(t for t in again.journal if t.reason == "completed")
    assert again.marks[0].after_seq == done.seq - 1


def test_a_crash_after_a_caught_step_is_marked_apart_from_it(small_runs) -> None:
    schedule = [*small_runs["mark then write"].shortest.schedule, Step("W2", "crashes"), FINISH]

    again = replay("mark then write", SMALL, schedule)

    assert [(m.label, m.caught) for m in again.marks] == [
        ("W2 marks done (g2); audit: done_without_effect", True), ("W2 crashes", False)]


def test_the_fresh_workers_second_effect_is_marked_where_the_audit_catches_it(small_runs) -> None:
    schedule = [*small_runs["write then mark"].shortest.schedule, Step("W2", "crashes"), FINISH]

    again = replay("write then mark", SMALL, schedule)

    assert [(m.label, m.caught) for m in again.marks] == [
        ("W2 writes the effect (g2); audit: effect_without_done", True), ("W2 crashes", False),
        ("g3; audit: effect_written_twice", True)]
    # drawn after the fresh worker's claim of generation 3, before the done row it wrote
    rows = [t for t in again.journal if t.event_id == "E0001"]
    claim = [t for t in rows if t.to_state == "leased"][-1]
    assert (claim.generation, again.marks[-1].after_seq, rows[-1].to_state) == (3, claim.seq, "done")
    assert again.money == 20000


# -- retention: a prune interleaved with a late duplicate enqueue and a stale ACK -----------

from queue_core.lab.sweeps.schedule import PRUNE  # noqa: E402

# W1 stalls past its lease on E0001; W2 finishes it, then E0002 (whose steps are the
# journal's last, so a prune may take E0001); the cleaner prunes E0001; the
# producer enqueues both events again; W1 wakes and ACKs its stale lease.
PRUNE_THEN_STALE = [Step("producer", "enqueue"), Step("W1", "claims"),
                    Step("clock", "jump", 1002), Step("W2", "claims"), Step("W2", "ACKs"),
                    Step("W2", "claims"), Step("W2", "ACKs"), Step("cleaner", "prune"),
                    Step("producer", "enqueue again"), Step("W1", "ACKs")]


@pytest.fixture(scope="module")
def prune_runs() -> dict[str, object]:
    return {name: explore(name, PRUNE) for name in PROTOCOLS}


def test_the_protocol_survives_every_schedule_of_a_prune_a_late_duplicate_and_a_stale_ack(
        prune_runs) -> None:
    run = prune_runs["protocol"]
    assert run.violations == [] and run.shortest is None
    assert (run.states, run.schedules) == (863, 1_851_000)
    assert str(PRUNE) == ("2 workers x 2 events (none failing once), 0 crashes, 2 clock jumps, "
                          "0 redrives, lease 2 s, 1 prune, 1 late duplicate enqueue")
    # the broken protocols are still caught, the prune step changing none of that
    assert all(prune_runs[name].shortest is not None for name in BROKEN)


def test_the_scenario_reaches_a_stale_ack_of_a_pruned_message_after_its_late_duplicate(
        tmp_path: Path) -> None:
    with _runner(PROTOCOLS["protocol"], PRUNE, tmp_path) as runner:
        world, snap = runner.start(), audit.snapshot(runner.path)
        for step in PRUNE_THEN_STALE:  # each step is one the explorer offers there
            assert step in runner.enabled(world, snap), step
            world, _, _ = runner.apply(world, step)
            snap = audit.snapshot(runner.path)
            assert audit.check(snap) == []
    again = replay("protocol", PRUNE, PRUNE_THEN_STALE)
    assert again.said[-3:] == (
        "the cleaner prunes 1 done message",
        "the producer enqueues the events again (a late duplicate): 0 new, 2 duplicates",
        "W1 ACKs E0001 (g1): rejected, stale_generation")
    assert again.money == 12000 and again.findings[-1] == ()


def test_a_prune_step_is_offered_only_in_the_scenario_that_asks_for_one(tmp_path: Path) -> None:
    for scenario in (DEFAULT, SMALL):
        assert (scenario.prunes, scenario.duplicates) == (0, 0)
    with _runner(PROTOCOLS["protocol"], DEFAULT, tmp_path) as runner:
        world = runner.start()
        for step in PRUNE_THEN_STALE[:7]:
            world, _, _ = runner.apply(world, step)
        offered = runner.enabled(world, audit.snapshot(runner.path))
        assert offered and all(s.what not in ("prune", "enqueue again") for s in offered)


# -- priorities: two of them and a retry, the claim's order checked at every claim ----------

from queue_core import Queue  # noqa: E402
from queue_core.lab.story.contrasts import Protocol  # noqa: E402
from queue_core.lab.sweeps.order import PASSED_OVER  # noqa: E402
from queue_core.lab.sweeps.schedule import PRIORITY  # noqa: E402
from queue_core.priority import CLAIM_ORDER  # noqa: E402
from queue_core.transitions import CLAIM, DUE, picking  # noqa: E402


class ArrivalOrder(Queue):
    """A claim that ignores priorities (``available_at``, then the event id, as every
    release before them claimed): the order check must catch it."""

    def __init__(self, *args: object, **options: object) -> None:
        super().__init__(*args, **options)  # type: ignore[arg-type]
        due = DUE.replace(f"ORDER BY {CLAIM_ORDER},", "ORDER BY available_at,", 1)
        assert due != DUE
        self._claim_sql = picking(CLAIM, due, self.store.picked)


def test_every_schedule_of_two_priorities_and_a_retry_keeps_the_money_and_the_claims_order(
        ) -> None:
    run = explore("protocol", PRIORITY)

    # every end: each event done once with its effect or dead with a reason, the
    # money the done events' amounts, the audit clean; every claim: no due message
    # with a smaller key passed over
    assert run.violations == [] and run.shortest is None
    assert (run.states, run.schedules, run.ends) == (4552, 76296460, 111)
    assert str(PRIORITY) == ("2 workers x 2 events (E0002 failing once), 1 crash, "
                             "3 clock jumps, 1 redrive, lease 2 s, E0002 of priority 9")


def test_the_urgent_message_goes_first_and_its_retry_overtakes_the_one_that_waits() -> None:
    enqueue, claims = Step("producer", "enqueue"), Step("W1", "claims")
    waits = replay("protocol", PRIORITY, [enqueue, claims, Step("W1", "ACKs"), Step("W1", "fails"),
                                          Step("W2", "claims"), Step("W2", "crashes"),
                                          Step("clock", "jump", 1001), claims])
    overtakes = replay("protocol", PRIORITY, [enqueue, claims, Step("W1", "ACKs"),
                                              Step("W1", "fails"), Step("clock", "jump", 1001),
                                              claims])

    assert all(found == () for found in waits.findings + overtakes.findings)
    assert waits.said[1] == "W1 claims E0002 (g1), lease until 1002"  # E0001 is first by id
    # in its backoff the urgent message is not due: the one that waits goes
    assert waits.said[3:5] == ("W1 reports the failure of E0002 (g1): retry",
                               "W2 claims E0001 (g1), lease until 1002")
    assert waits.said[-1] == "W1 claims E0002 (g2), lease until 1003"
    # due again, it is keyed nine minutes early: before E0001, due since 1000
    assert overtakes.said[-1] == "W1 claims E0002 (g2), lease until 1003"


def test_the_order_check_catches_a_claim_that_ignores_priorities(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(PROTOCOLS, "arrival order",
                        Protocol("arrival order", ArrivalOrder, (), broken=True))
    scenario = replace(PRIORITY, crashes=0, jumps=1, redrives=0)

    run = explore("arrival order", scenario)
    again = replay("arrival order", scenario, run.shortest.schedule)

    assert [str(step) for step in run.shortest.schedule] == [
        "the producer enqueues the events", "W1 claims"]
    assert run.shortest.findings == (
        f"{PASSED_OVER}: E0001 (key 1000) claimed at 1000 while E0002 (key 460, priority 9) "
        "was due",)
    assert again.findings[-1] == run.shortest.findings and again.money == 0
    assert explore("protocol", scenario).violations == []
