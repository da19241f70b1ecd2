"""Notebook 10's measurements: the reference scenario on PostgreSQL, throughput
runs whose every event must be done exactly once, the worker loop's commits
and round trips on PostgreSQL, the sentences that explain a run's trend, and
the runs set beside raw commits of as many clients (notebook 10's small curve)."""

from __future__ import annotations

import sqlite3
from contextlib import closing

import psycopg
import pytest

from queue_core import Handler, Queue, audit
from queue_core.lab.servers import postgres_server
from queue_core.lab.speed import (against_raw_commits, describe_curve, measure_scaling,
                                  plot_curve, plot_scaling, scaling_frame)
from queue_core.lab.speed.rawcommits import prepare, raw_rate
from queue_core.lab.story import play_scenario
from queue_core.lab.speed.scaling import (BUSY_SAMPLE_S, LEVEL_BAND, CommitCost, ScalingRow, busy_share,
                                          commit_cost, cpu_ticks, describe_scaling,
                                          pg_round_trips)


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
    assert row.cpu_busy is None if cpu_ticks() is None else 0 <= row.cpu_busy <= 1
    assert scaling_frame([row])["exactly once"].tolist() == [True]


def raw_rows(place: str) -> int:
    """The rows in the raw commits' table of a SQLite file or a PostgreSQL schema."""
    if "://" in place:
        with psycopg.connect(place) as conn:
            return int(conn.execute("SELECT count(*) FROM raw").fetchone()[0])
    with closing(sqlite3.connect(place)) as lite:
        return int(lite.execute("SELECT count(*) FROM raw").fetchone()[0])


def test_raw_rate_commits_exactly_what_its_clients_were_asked_for(store: str) -> None:
    prepare(store)
    prepare(store)  # a second time finds the table there

    per_second = raw_rate(store, clients=2, commits=15)

    assert per_second > 0 and raw_rows(store) == 30


def test_the_small_curve_sets_audited_general_queues_beside_raw_commits_on_both_stores(
        tmp_path, pg_server: str) -> None:  # type: ignore[no-untyped-def]
    import matplotlib.pyplot as plt

    made: list[str] = []

    def new(store: str) -> str:
        if store == "postgres":
            made.append(postgres_server.fresh_schema(pg_server))
        else:
            made.append(str(tmp_path / f"place{len(made)}.sqlite3"))
        return made[-1]

    try:
        runs = measure_scaling(new, stores=("postgres", "sqlite"), workers=(1, 2), events=30,
                               ids="general")
        assert [Queue(place).id_rule for place in made] == ["general"] * 4
        points = against_raw_commits(runs, new, commits=10)

        assert [p.run for p in points] == runs
        assert [(r.store, r.workers) for r in runs] == [
            ("postgres", 1), ("postgres", 2), ("sqlite", 1), ("sqlite", 2)]
        assert [(r.done, r.effects, r.reported_twice, r.findings) for r in runs] == [
            (30, 30, 0, ())] * 4
        assert [r.total for r in runs] == [r.expected_total for r in runs] == [
            sum(100 + n for n in range(1, 31))] * 4
        assert len(made) == 6  # one raw commits' place per store, made once
        assert all(p.raw_per_second > 0 and p.vs_raw == p.run.per_second / p.raw_per_second
                   for p in points)
        assert [raw_rows(place) for place in made[4:]] == [30, 30]  # 1 + 2 clients of 10

        said = " ".join(describe_curve(points).split())
        assert said.startswith(f"postgres: 1 worker {runs[0].per_second:,.0f} messages/s, "
                               f"{points[0].vs_raw:.2f} of {points[0].raw_per_second:,.0f} raw")
        assert "From 1 to 2 workers the raw commits" in said
        assert said.endswith("Audit of every run: each event done exactly once, money exact "
                             "(120 events in 4 queues).")

        figure = plot_curve(points)
        try:
            rates, share = figure.axes
            assert [line.get_label() for line in rates.get_lines()] == [
                "sqlite: the queue", "sqlite: raw commits", "postgres: the queue",
                "postgres: raw commits"]
            assert share.get_ylim() == (0, 1.05)
        finally:
            plt.close(figure)
    finally:
        for place in made:
            if "://" in place:
                postgres_server.drop_schema(place)


def test_a_failed_run_is_said_failed_by_the_curve() -> None:
    from queue_core.lab.speed.scaling import CurvePoint

    good = CurvePoint(row("postgres", 1, 0.3, 0.5), 2000.0)
    lost = CurvePoint(ScalingRow("postgres", 2, 300, 0.3, 299, 299, 0, 45000, 45150, (), 0.5),
                      3000.0)

    said = " ".join(describe_curve([good, lost]).split())

    assert ("postgres: 1 worker 1,000 messages/s, 0.50 of 2,000 raw commits/s (cores 50% busy "
            "during the queue's run)") in said
    assert said.endswith("Audit of every run: FAILED (600 events in 2 queues).")


def test_raw_commits_that_fall_with_more_clients_are_said_to_move_the_shares() -> None:
    # A run of notebook 10 measured 2,558, 1,264 and 1,744 raw commits a second from 1, 2
    # and 4 clients: the share went 0.30, 0.69, 0.33, while the text said it falls.
    from queue_core.lab.speed.scaling import CurvePoint

    points = [CurvePoint(row("postgres", n, 0.3, 0.9), raw)
              for n, raw in ((1, 2558.0), (2, 1264.0), (4, 1744.0))]
    steady = [CurvePoint(row("postgres", n, 0.3, 0.9), raw)
              for n, raw in ((1, 2000.0), (2, 2100.0), (4, 2600.0))]

    said = " ".join(describe_curve(points).split())

    assert ("But the raw commits fell from 1 to 2 clients (2,558 to 1,264 a second), although "
            "more clients let the server flush more commits together") in said
    assert "went from 0.39 to 0.57 (0.39, 0.79, 0.57 at 1, 2, 4 workers)." in said
    assert "But the raw commits fell" not in describe_curve(steady)
    # SQLite's clients take one write lock in turn: their raw commits may fall by themselves
    sqlite = [CurvePoint(row("sqlite", n, 0.3, 0.9), raw)
              for n, raw in ((1, 3011.0), (2, 1593.0), (4, 1378.0))]
    assert "But the raw commits fell" not in describe_curve(sqlite)


def test_a_share_above_raw_commits_stays_in_the_picture() -> None:
    import matplotlib.pyplot as plt
    from queue_core.lab.speed.scaling import CurvePoint

    # a server far away: the raw commit's three round trips against the step's one
    figure = plot_curve([CurvePoint(row("postgres", 1, 0.3, 0.5), 500.0)])
    try:
        assert figure.axes[1].get_ylim() == pytest.approx((0, 2.2))
    finally:
        plt.close(figure)


class WritesMore(Handler):
    """A handler that overrides ``apply`` (as one that writes more than its effect would)."""

    def apply(self, conn, event_id, payload):  # type: ignore[no-untyped-def]
        return super().apply(conn, event_id, payload)


@pytest.mark.parametrize("handler, trips", [(Handler(), 1), (WritesMore(), 3)])
def test_the_worker_loop_on_postgres_commits_once_per_message_in_one_round_trip(
        pg_dsn: str, handler: Handler, trips: int) -> None:
    traced = pg_round_trips(pg_dsn, messages=6, handler=handler)

    # the first claim alone travels with its COMMIT; each ACK that claims the next is
    # one call of the schema's step function, which travels with its BEGIN and COMMIT;
    # a handler that writes more runs in the client's transaction, which waits for the
    # fence read, for the ACK's row count, and for the COMMIT
    assert traced.round_trips == (1,) + (trips,) * 6
    assert traced.commits == (1,) * 7
    assert traced.synchronous_commit == "on"
    snap = audit.snapshot(pg_dsn)
    assert (dict(snap.status.states), snap.status.effects, snap.money, audit.check(snap)) == (
        {"ready": 0, "leased": 0, "done": 6, "dead": 0}, 6, sum(100 + n for n in range(1, 7)), [])


def test_commit_cost_times_both_settings_on_either_store_and_leaves_nothing_behind(
        store: str) -> None:
    cost = commit_cost(store, commits=4)

    assert cost.store == ("postgres" if "://" in store else "sqlite")
    assert cost.commit_s > 0 and cost.unsynced_s > 0 and cost.flush_s >= 0
    if cost.store == "postgres":
        with psycopg.connect(store) as conn:
            assert conn.execute("SELECT to_regclass('commit_probe')").fetchone() == (None,)


def test_busy_share_is_the_busy_part_of_the_ticks_between_two_readings() -> None:
    assert busy_share((10, 100), (60, 200)) == 0.5
    assert busy_share(None, (60, 200)) is None
    assert busy_share((10, 100), (10, 100)) is None  # no time passed: no share
    ticks = cpu_ticks()
    if ticks is not None:  # Linux
        assert 0 <= ticks[0] <= ticks[1]


def row(store: str, workers: int, seconds: float, busy: float | None) -> ScalingRow:
    return ScalingRow(store, workers, 300, seconds, 300, 300, 0, 45150, 45150, (), busy)


COSTS = {"sqlite": CommitCost("sqlite", 0.0002, 0.00001),
         "postgres": CommitCost("postgres", 0.0012, 0.0002)}


@pytest.mark.parametrize("pg_seconds, pg_busy, flush, expected", [
    ((1.0, 0.5, 0.45), 0.9, 0.001, "filled the first one's waits with work of its own"),
    ((1.0, 0.5, 0.45), 0.3, 0.0001, "The second worker ran on the idle cores."),
    ((1.0, 1.1, 1.2), 0.99, 0.0001, "Little was left to fill"),
    ((1.0, 1.1, 1.2), 0.3, 0.001, "It stayed level all the same."),
], ids=["rose-flush", "rose-idle-cores", "level-nothing-to-fill", "level-against-the-measures"])
def test_the_printed_reasons_follow_the_run_figures(
        pg_seconds: tuple[float, float, float], pg_busy: float, flush: float,
        expected: str) -> None:
    rows = [row("sqlite", 1, 0.3, 0.5), row("sqlite", 2, 0.3, 0.6), row("sqlite", 4, 0.3, 0.6),
            *(row("postgres", n, s, pg_busy) for n, s in zip((1, 2, 4), pg_seconds))]
    costs = {**COSTS, "postgres": CommitCost("postgres", flush + 0.0001, 0.0001)}

    said = " ".join(describe_scaling(rows, cores=2, background=0.1, costs=costs).split())

    assert said.startswith("This machine has 2 CPU cores; before the runs, other programs kept "
                           "them 10% busy: ")
    assert "sqlite: 1000 messages/s with 1 worker; 2 workers: 1.00 times that" in said
    assert "Here more workers only queued for the lock." in said
    assert expected in said
    verdicts = {"filled the first one's waits with work of its own",
                "The second worker ran on the idle cores.",
                "Little was left to fill", "all the same."}
    assert [words for words in verdicts if words in said] == [
        words for words in verdicts if words in expected]


@pytest.mark.parametrize("two_busy, four_seconds, expected", [
    (0.93, 0.7, "From 2 to 4 workers it fell: only about 0.1 of 2 cores were idle during the "
                "2-worker run, so the further workers and their server processes took turns on "
                "busy cores"),
    (0.3, 0.3, "From 2 to 4 workers it rose as well: about 1.4 of 2 cores were idle during the "
               "2-worker run, and the further workers ran on them."),
    (0.95, 0.3, "From 2 to 4 workers it rose although only about 0.1 of 2 cores were idle "
                "during the 2-worker run: the gain came from waits"),
    (0.3, 0.7, "From 2 to 4 workers it fell although about 1.4 of 2 cores were idle during the "
               "2-worker run: one short run per worker count is noisy."),
    (0.3, 0.55, "From 2 to 4 workers it stayed level although about 1.4 of 2 cores"),
], ids=["fell-on-busy-cores", "rose-on-idle-cores", "rose-on-busy-cores", "fell-on-idle-cores",
        "level-on-idle-cores"])
def test_the_step_from_two_workers_to_four_is_explained_from_the_two_worker_run(
        two_busy: float, four_seconds: float, expected: str) -> None:
    rows = [*(row("sqlite", n, 0.3, 0.5) for n in (1, 2, 4)), row("postgres", 1, 1.0, 0.5),
            row("postgres", 2, 0.5, two_busy), row("postgres", 4, four_seconds, 0.9)]

    said = " ".join(describe_scaling(rows, cores=2, background=0.1, costs=COSTS).split())

    assert expected in said
    assert said.count("From 2 to 4 workers it") == 1
    unknown = " ".join(describe_scaling(rows, cores=None, background=None, costs=COSTS).split())
    assert "how busy the cores were during the 2-worker run is not measured" in unknown


def test_the_background_load_is_said_with_how_it_was_measured_and_what_it_means() -> None:
    rows = [row(s, n, 0.3, 0.5) for s in ("sqlite", "postgres") for n in (1, 2, 4)]

    said = " ".join(describe_scaling(rows, cores=2, background=0.5, costs=COSTS).split())

    assert said.startswith(
        "This machine has 2 CPU cores; before the runs, other programs kept them 50% busy: for "
        f"{BUSY_SAMPLE_S:g} s, while the measuring process slept, the kernel counted that share of "
        "all the cores' time as busy (/proc/stat, time a virtual machine's host took back "
        "included), the work of about 1.0 of the 2 cores.")
    assert ("The workers below share the cores with whatever keeps running, so the busier they "
            "are, the more of each run's time is waiting for a core, which the rates cannot tell "
            "apart from the queue's own work; the table's column \"cores busy\" counts every "
            "program during each run, the workers included.") in said


def test_without_cpu_counters_the_sentences_say_so_and_give_no_verdict_on_cores() -> None:
    rows = [row(s, n, 0.3, None) for s in ("sqlite", "postgres") for n in (1, 2, 4)]

    said = " ".join(describe_scaling(rows, cores=None, background=None, costs=COSTS).split())

    assert "how busy other programs kept them is not measured on this system" in said
    assert "cores were idle" not in said


def test_the_scaling_figure_draws_what_one_worker_waits_for_beside_the_rates() -> None:
    import matplotlib.pyplot as plt

    rows = [row(s, n, 0.3 * n, 0.5) for s in ("sqlite", "postgres") for n in (1, 2, 4)]
    figure = plot_scaling(rows, costs=COSTS)
    try:
        rates, waits = figure.axes
        assert [line.get_label() for line in rates.get_lines()] == ["sqlite", "postgres"]
        assert [tick.get_text() for tick in waits.get_yticklabels()] == ["sqlite", "postgres"]
        assert len(waits.patches) == 4  # per store: a message, and a commit's flush
    finally:
        plt.close(figure)
    alone = plot_scaling(rows)
    assert len(alone.axes) == 1
    plt.close(alone)


def test_a_sqlite_run_that_rose_is_told_what_could_overlap_and_what_could_not() -> None:
    rows = [row("sqlite", 1, 0.6, 0.9), row("sqlite", 2, 0.4, 0.9), row("sqlite", 4, 0.4, 0.9)]

    said = " ".join(describe_scaling(rows, cores=2, background=0.9).split())

    assert "From 1 to 2 workers it rose" in said
    assert "the commits go one at a time, whatever the number of workers. It rose here all the " \
           "same with 2 and 4 workers: what one worker does outside the lock" in said
    assert "PostgreSQL" not in said


def test_sqlite_rising_with_four_workers_only_is_said_so_not_denied() -> None:
    # 2 workers fell, 4 rose: the reason must not say that more workers only queued
    rows = [row("sqlite", 1, 0.3, 0.5), row("sqlite", 2, 0.6, 0.6), row("sqlite", 4, 0.14, 0.6),
            *(row("postgres", n, 1.0, 0.5) for n in (1, 2, 4))]

    said = " ".join(describe_scaling(rows, cores=2, background=0.1, costs=COSTS).split())

    assert "4 workers: 2.14 times" in said
    assert "only queued for the lock" not in said
    assert "It rose here all the same with 4 workers" in said


@pytest.mark.parametrize("seconds, words", [
    ((1.0, 1 / 0.85, 1 / 0.85), "it stayed level (x0.85), from 2 to 4 it stayed level (x1.00)"),
    ((1.0, 1 / 1.31, 1 / 1.10), "it rose (x1.31), from 2 to 4 it fell (x0.84)"),
    ((1.0, 1 / 0.84, 1 / 0.84), "it fell (x0.84), from 2 to 4 it stayed level (x1.00)"),
    ((1.0, 1 / 1.15, 1 / 1.16), "it stayed level (x1.15), from 2 to 4 it stayed level (x1.01)"),
], ids=["0.85-level", "rose-then-fell-by-the-step", "0.84-fell", "1.15-level"])
def test_each_verdict_word_follows_the_printed_step_and_the_stated_band(
        seconds: tuple[float, float, float], words: str) -> None:
    rows = [*(row("sqlite", n, 0.3, 0.5) for n in (1, 2, 4)),
            *(row("postgres", n, s, 0.5) for n, s in zip((1, 2, 4), seconds))]

    said = " ".join(describe_scaling(rows, cores=2, background=0.1, costs=COSTS).split())

    assert LEVEL_BAND == 0.15
    assert ("A step from one number of workers to the next counts as level when its ratio is "
            "within 15% of 1 (x0.85 to x1.15): runs on one machine vary that much; above it "
            "rose, below it fell.") in said
    assert f"postgres: 300 messages/s with 1 worker; 2 workers: {1 / seconds[1]:.2f}" in said
    assert f"From 1 to 2 workers {words}." in said
