"""Notebook 10's measurements: the reference scenario on PostgreSQL, and
throughput runs whose every event must be done exactly once."""

from __future__ import annotations

import pytest

from queue_core.lab import measure_scaling, play_scenario, scaling_frame


def test_the_reference_scenario_gives_the_same_figures_on_postgres_with_a_crashing_process(
        pg_dsn: str) -> None:
    report = play_scenario(pg_dsn, say=lambda line: None)
    assert report.crash_exit_code == 86
    assert (report.snapshot.total, report.snapshot.effects, dict(report.snapshot.states)) == (
        10000, 1, {"ready": 1, "leased": 1, "done": 1, "dead": 1})
    assert (report.final.total, report.final.effects, dict(report.final.states)) == (
        17000, 3, {"ready": 0, "leased": 0, "done": 3, "dead": 1})
    assert (report.again.inserted, report.again.duplicates) == (0, 5)
    assert (report.after_fix.total, report.after_fix.effects, dict(report.after_fix.states)) == (
        20000, 4, {"ready": 0, "leased": 0, "done": 4, "dead": 0})


@pytest.mark.parametrize("workers", [1, 3])
def test_a_timed_run_of_worker_processes_does_every_event_exactly_once(
        store: str, workers: int) -> None:
    [row] = measure_scaling(lambda _: store, workers=[workers], events=30)
    assert (row.done, row.effects, row.reported_twice, row.findings) == (30, 30, 0, ())
    assert row.total == row.expected_total == sum(100 + n for n in range(1, 31))
    assert row.exactly_once and row.seconds > 0
    assert scaling_frame([row])["exactly once"].tolist() == [True]
