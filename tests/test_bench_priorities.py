"""The priority figures of ``make bench`` (``benchmarks/bench_priority.py``): what
priorities cost the worker loop's step on each store, and a low priority's longest
wait under a steady urgent load against the bound the engine states, with strict
priority's beside it; their targets, and the exit status (a missed target exits 0,
a failed check exits 1). The step's timing is never asserted, only its presence;
the waits are the model clock's, the same on every run, and asserted exactly."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))

import bench  # noqa: E402
import bench_priority  # noqa: E402
import bench_report  # noqa: E402
from bench_cases import CheckFailed, Keeper  # noqa: E402

from queue_core import Handler, Queue, drain  # noqa: E402
from queue_core.lab.servers.pgcases import Schemas  # noqa: E402
from queue_core.priority import wait_bound  # noqa: E402

STEP_TARGETS = {"sqlite": "SQLite worker-loop step, priorities 0-9 vs all 0",
                "postgres": "PostgreSQL worker-loop step, priorities 0-9 vs all 0"}
WAIT_TARGET = "longest low-priority wait vs its stated bound"
# Only the priority figures and the single-message case beside them, as small as they go.
PRIORITIES_ONLY = bench.replace(bench.QUICK, rounds=2, single=10, batches=(), sizes=(),
                                bare=False, retention=(0, 0), prune_case=False,
                                migrate=(0, 0), priorities=(10, 3), starvation=2)


@pytest.fixture(scope="module")
def quick() -> dict:
    return bench.run(plan=PRIORITIES_ONLY)


def test_the_quick_run_prints_each_priority_figure_with_its_target(quick: dict) -> None:
    rows = {row["name"]: row for row in quick["targets"]}

    step = rows[STEP_TARGETS["sqlite"]]
    assert (step["bound"], step["at_least"]) == (0.95, True) and step["value"] is not None
    assert "steps/s over all 3 rounds of 10 steps each" in step["against"]
    postgres = rows[STEP_TARGETS["postgres"]]  # this plan starts no server
    assert (postgres["bound"], postgres["at_least"], postgres["value"]) == (0.95, True, None)
    wait = rows[WAIT_TARGET]
    assert (wait["bound"], wait["at_least"], wait["met"]) == (1.0, False, True)
    assert "strict priority on the same load: 5 of 5 still waiting" in wait["against"]
    cost = quick["priority_costs"]["sqlite"]
    assert (cost["steps"], cost["rounds"], len(cost["ratios"])) == (10, 3, 3)
    assert set(cost["rates"]) == {"mixed", "plain"}
    text = "\n".join(bench.report(quick))
    assert "what they cost the worker loop's step" in text and "SQLite: with priorities" in text
    assert "strict priority on the same arrivals" in text
    assert "low-00: due at 30 s with 2 keyed before it, waited 540 s" in text


def test_a_low_priority_waits_within_its_bound_where_strict_priority_never_serves_it(
        quick: dict) -> None:
    found = quick["starvation"]
    lows = found["lows"]

    # 2 urgent a second (the workers' whole rate): only those due within 540 s after a
    # low message go before it, so each waits 540 s and what was ahead of it besides
    assert [(low["due"], low["ahead"], low["wait"]) for low in lows] == [
        (30, 2, 540), (90, 3, 540), (150, 4, 541), (210, 5, 541), (270, 6, 542)]
    assert [low["bound"] for low in lows] == [wait_bound(0, low["ahead"], 2, 2) for low in lows]
    assert all(low["wait"] <= low["bound"] for low in lows)
    assert (found["seconds"], found["window"]) == (813, 540)
    # strict priority: none of them served, and the oldest's wait grows with the run
    assert [(s["seconds"], s["waiting"], s["longest"]) for s in found["strict"]] == [
        (813, 5, 783), (1626, 5, 1596)]
    assert bench_priority.figure(found)[0] == pytest.approx(542 / 544)


def test_each_priority_target_reads_its_figure_and_its_direction() -> None:
    lows = [{"event_id": "low-00", "due": 30, "ahead": 10, "wait": 600, "bound": 541.0,
             "waiting": None},
            {"event_id": "low-01", "due": 90, "ahead": 11, "wait": None, "bound": 541.1,
             "waiting": 700}]
    results = {"vs_raw": {}, "peers": [],
               "priority_costs": {"postgres": {"ratio": 0.9, "ratios": [0.9], "steps": 5,
                                               "rounds": 1, "rates": {"mixed": 90,
                                                                      "plain": 100}}},
               "starvation": {"urgent_per_second": 10, "rate": 10, "lows": lows,
                              "strict": [{"seconds": 800, "lows": 2, "waiting": 2,
                                          "longest": 770}]}}
    rows = {row["name"]: row for row in bench_report.evaluate(results)}

    assert (rows[STEP_TARGETS["postgres"]]["value"], rows[STEP_TARGETS["postgres"]]["met"]) == \
        (0.9, False)
    assert rows[STEP_TARGETS["sqlite"]]["value"] is None
    wait = rows[WAIT_TARGET]  # the one still waiting counts with what it has waited so far
    assert (wait["value"], wait["met"]) == (pytest.approx(700 / 541.1), False)
    assert "low-01 waited still waiting after 700 s" in wait["against"]


def test_a_missed_priority_target_still_exits_0(
        quick: dict, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    results = copy.deepcopy(quick)
    results["starvation"]["lows"][0]["wait"] = 1000  # far beyond its 541 s
    results["priority_costs"]["sqlite"]["ratio"] = 0.5
    results["targets"] = bench_report.evaluate(results)
    monkeypatch.setattr(bench, "run", lambda **_: results)

    assert bench.main([]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "ABOVE TARGET" in next(line for line in out if WAIT_TARGET in line)
    assert "BELOW TARGET" in next(line for line in out if STEP_TARGETS["sqlite"] in line)


def test_an_engine_that_did_not_claim_in_the_models_order_fails_the_run(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # the model the strict figure comes from, told the head-start order is strict
    monkeypatch.setattr(bench_priority, "head_start_order", bench_priority.strict_order)
    monkeypatch.setattr(bench, "QUICK", bench.replace(PRIORITIES_ONLY, priorities=(5, 2)))

    assert bench.main(["--quick"]) == 1
    assert "the model in the head-start order does not claim" in capsys.readouterr().out


def test_the_done_messages_of_each_priority_are_checked(tmp_path: Path) -> None:
    db = tmp_path / "queue.sqlite3"
    queue = Queue(db)
    queue.enqueue_jsonl("\n".join(json.dumps({"event_id": f"E{i:04d}", "payload": {
        "category": "pen", "amount_cents": 100}}) for i in range(3)), priority=2)
    drain(queue, Handler())
    keeper = Keeper(db)
    try:
        keeper.check_exactly_once(3, 300, priorities={2: 3})
        for wrong in ({0: 3}, {}):
            with pytest.raises(CheckFailed, match="done per priority"):
                keeper.check_exactly_once(3, 300, priorities=wrong)
    finally:
        keeper.close()


def test_the_postgres_step_is_measured_on_two_schemas_and_checked(pg_server: str) -> None:
    with Schemas(pg_server, "queue_test_prio") as schemas:
        found = bench_priority.step_costs({name: schemas.fresh(f"step_{name}")
                                           for name in (bench_priority.MIXED,
                                                        bench_priority.PLAIN)}, 5, 2)
    rows = {row["name"]: row for row in bench_report.evaluate(
        {"vs_raw": {}, "peers": [], "priority_costs": {"postgres": found}})}

    assert (found["steps"], found["rounds"], len(found["ratios"])) == (5, 2, 2)
    assert rows[STEP_TARGETS["postgres"]]["value"] == found["ratio"]
    assert rows[STEP_TARGETS["postgres"]]["bound"] == 0.95
