"""The SQLite peer queues of ``make bench``: declared in the bench extra,
installed by ``make setup``, driven through the same put / get / ack, and
our queue's safety probe passing; each peer on the same work as ours (its
effect committed in the application's own file, then acked) and what it
then guarantees; the report's targets and exit status. The PostgreSQL
peers are ``test_bench_pg_peers``'s."""

from __future__ import annotations

import re
import sqlite3
import sys
import tomllib
from pathlib import Path

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))

import app_effects  # noqa: E402
import bench  # noqa: E402
import bench_report  # noqa: E402
import peer_safety  # noqa: E402
from bench_cases import CheckFailed  # noqa: E402
from peers import (OURS, PEERS, PG_PEERS, PeerWorker, SameWorkCase, item_of,  # noqa: E402
                   same_work_variant)
from test_setup import makefile_targets, requirement  # noqa: E402

SQLITE_QUEUES = {name: adapter for name, adapter in {**PEERS, **OURS}.items()
                 if adapter.store == "sqlite"}


def test_the_bench_extra_pins_a_major_range_of_exactly_the_peers_measured() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extra = dict(requirement(spec) for spec in project["optional-dependencies"]["bench"])

    assert set(extra) == {adapter.dist for adapter in (*PEERS.values(), *PG_PEERS.values())}
    assert all(">=" in spec and ",<" in spec for spec in extra.values()), extra


def test_the_set_up_installs_the_test_and_bench_extras_before_bench_runs() -> None:
    targets = makefile_targets()

    assert targets["bench"][0] == ["$(STAMP)"]
    prerequisites, recipe = targets["$(STAMP)"]
    assert "pyproject.toml" in prerequisites
    installed = [re.fullmatch(r"\$\(PY\) -m pip install --quiet -e '\.\[([a-z,]+)\]'", line)
                 for line in recipe]
    assert {"test", "bench"} <= {extra for found in installed if found
                                 for extra in found.group(1).split(",")}


@pytest.mark.parametrize("name", list(SQLITE_QUEUES))
def test_each_queue_hands_out_what_was_put_once_then_nothing(name: str, tmp_path: Path) -> None:
    adapter = SQLITE_QUEUES[name]
    assert adapter.installed(), f"{adapter.dist} is missing: make test installs it (.[bench])"
    for variant in adapter.variants:
        queue = adapter(tmp_path / f"{variant}.sqlite3", variant)
        queue.put([item_of(i) for i in range(3)])
        handle, first = queue.get() or (None, "")
        queue.ack(handle)
        got = [first, *queue.consume(5)]  # the rest, then nothing
        pragmas = queue.pragmas()
        queue.close()

        assert sorted(got) == ["E0000", "E0001", "E0002"]
        assert pragmas["journal_mode"] in ("WAL", "DELETE", "TRUNCATE", "PERSIST", "MEMORY", "OFF")
        assert pragmas["synchronous"] in ("OFF", "NORMAL", "FULL", "EXTRA")


def test_our_queue_passes_the_two_consumer_and_crash_probes(tmp_path: Path) -> None:
    shared = peer_safety.two_consumers("queue_core", tmp_path, 20, "t")
    crashed = peer_safety.crash_all(["queue_core"], tmp_path)["queue_core"]

    assert (shared["duplicates"], shared["missing"], shared["errors"]) == (0, 0, [])
    assert (crashed["crash"], crashed["others_missing"], crashed["crash_errors"]) == \
        ("redelivered", 0, [])
    assert (shared["journal_mode"], shared["synchronous"]) == ("WAL", "FULL")


def test_a_duplicate_or_a_lost_crash_of_ours_fails_the_run() -> None:
    clean = {"duplicates": [0, 0], "missing": [0, 0], "errors": 0, "crash": "redelivered",
             "others_missing": 0, "n": 20}
    bench.check_our_safety(clean)
    for change in ({"duplicates": [0, 1]}, {"missing": [2, 0]}, {"crash": "lost"}):
        with pytest.raises(CheckFailed):
            bench.check_our_safety(dict(clean, **change))


def test_the_quick_run_keeps_its_keys_and_leaves_the_peers_out() -> None:
    results = bench.run(quick=True)

    assert {"rates", "end_to_end", "vs_raw", "e2e_vs_raw", "samples", "labels", "sizes",
            "durability", "producers", "targets", "slices", "memory", "parent_rss_mb",
            "raw_range"} <= set(results)
    assert results["peers"] == [] and results["safety"] == {}
    assert not any(name.startswith("peer_") for name in results["rates"])
    assert bench.report(results)


def test_litequeue_runs_at_its_default_normal_and_at_full_set_on_its_connection(
        tmp_path: Path) -> None:
    litequeue = PEERS["litequeue"]
    found = {}
    for variant in ("defaults", "FULL"):
        queue = litequeue(tmp_path / f"{variant}.sqlite3", variant)
        found[variant] = queue.pragmas()["synchronous"]
        queue.close()

    assert found == {"defaults": "NORMAL", "FULL": "FULL"}


def results_with(vs_raw: dict[str, float], peers: list[dict], **more: object) -> dict:
    return {"vs_raw": vs_raw, "e2e_vs_raw": dict(vs_raw), "peers": peers, **more}


def peer(name: str, synchronous: str, vs_raw: float, store: str = "sqlite") -> dict:
    return {"peer": name, "synchronous": synchronous, "vs_raw": vs_raw, "e2e_vs_raw": vs_raw,
            "store": store}


def test_each_target_compares_like_with_like_and_says_which_peer() -> None:
    peers = [peer("slowfull", "FULL", 0.4), peer("fastfull", "FULL", 0.5),
             peer("normal", "NORMAL", 4.0), peer("pgq", "on", 0.5, "postgres")]
    results = results_with({"single": 0.45, "single_normal": 5.0, "batch_100": 3.0,
                            "pg_single_1": 0.6, "pg_raw": 1.0}, peers,
                           fsyncs=(1.07, 2.0))
    rows = {row["name"]: row for row in bench_report.evaluate(results)}

    fast = rows["SQLite single vs fastest fsyncing peer"]
    assert (round(fast["value"], 2), fast["met"], fast["against"]) == (0.9, True, "fastfull FULL")
    normal = rows["SQLite single NORMAL vs fastest NORMAL peer"]
    assert (normal["value"], normal["met"], normal["against"]) == (1.25, True, "normal NORMAL")
    assert rows["SQLite K=100 vs fastest fsyncing peer"]["met"] is False  # 6 < 8
    fsyncs = rows["fsyncs per consumed message (strace)"]
    assert (fsyncs["value"], fsyncs["at_least"], fsyncs["met"]) == (1.07, False, False)
    assert rows["PostgreSQL single vs pgqueuer"]["value"] is None  # no peer of that name
    assert rows["SQLite single vs fastest fsyncing peer, 2 ms flush"]["value"] is None


def test_a_missed_target_still_exits_0_and_a_failed_check_exits_1(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    results = bench.run(quick=True)
    results["fsyncs"] = (2.0, 3.0)  # far above its target of 1.05
    monkeypatch.setattr(bench, "run", lambda **_: results)

    assert bench.main([]) == 0
    assert "fsyncs per consumed message (strace)" in capsys.readouterr().out

    def broken(**_: object) -> dict:
        raise CheckFailed("a slice found two effects for one event")
    monkeypatch.setattr(bench, "run", broken)

    assert bench.main([]) == 1
    assert "EXACTLY-ONCE CHECK FAILED" in capsys.readouterr().out


def test_a_figure_near_its_target_shows_the_digits_that_decide_its_verdict(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import bench_text

    def row(name: str, value: float, bound: float, at_least: bool = True) -> dict:
        met = value >= bound if at_least else value <= bound
        return {"name": name, "value": value, "bound": bound, "at_least": at_least,
                "met": met, "compares": "x", "against": None}
    rows = [row("just-under", 0.94996, 0.95), row("just-over", 0.9512, 0.95),
            row("far-under", 0.83, 0.9), row("on-it", 0.95, 0.95),
            row("ceiling-just-over", 1.0504, 1.05, at_least=False)]
    monkeypatch.setattr(bench_text, "evaluate", lambda results: rows)

    printed = {words[0]: words[1:] for words in map(str.split, bench_text.target_lines({}))
               if words and words[0] in {r["name"] for r in rows}}
    assert printed == {"just-under": ["0.94996", ">=", "0.95", "BELOW", "TARGET"],
                       "just-over": ["0.95", ">=", "0.95", "ok"],
                       "far-under": ["0.83", ">=", "0.9", "BELOW", "TARGET"],
                       "on-it": ["0.95", ">=", "0.95", "ok"],
                       "ceiling-just-over": ["1.0504", "<=", "1.05", "ABOVE", "TARGET"]}


# -- the peers on the same work -------------------------------------------------

def on_the_same_work(name: str, where: Path, app: Path) -> tuple[object, dict[str, str]]:
    """The peer at our durability, with the application's own file opened beside it."""
    adapter = PEERS[name]
    queue = adapter(where, same_work_variant(adapter))
    return queue, queue.open_effects(str(app))


@pytest.mark.parametrize("name", list(PEERS))
def test_a_peer_on_the_same_work_commits_one_effect_per_event_even_when_it_comes_twice(
        name: str, tmp_path: Path) -> None:
    queue, effects = on_the_same_work(name, tmp_path / "queue.sqlite3", tmp_path / "app.sqlite3")
    try:
        queue.put([item_of(i) for i in range(4)] + [item_of(1)])  # the source repeats E0001
        got = queue.work(10)
        pragmas = queue.pragmas()
    finally:
        queue.close()

    assert sorted(got) == ["E0000", "E0001", "E0001", "E0002", "E0003"]
    found = app_effects.rows(str(tmp_path / "app.sqlite3"))
    assert found == [("E0000", "book", 100), ("E0001", "pen", 101), ("E0002", "bag", 102),
                     ("E0003", "book", 103)]
    assert sum(row[2] for row in found) == 406
    assert effects == {"journal_mode": "WAL", "synchronous": "FULL"}
    assert pragmas["synchronous"] == "FULL"  # litequeue at FULL; the others' defaults


# What a consumer that dies after committing the effect, before its ack, leaves:
# the message handed out again by the library, or held until someone retries it.
AFTER_A_DEATH = {"persist-queue": "redelivered", "litequeue": "held", "huey": "gone"}
GUARANTEE = {"redelivered": "at least once, deduped", "held": "at least once after a retry, deduped",
             "gone": "at most once"}


@pytest.mark.parametrize("name", list(PEERS))
def test_a_consumer_dead_after_the_effect_leaves_what_its_guarantee_says_and_no_second_effect(
        name: str, tmp_path: Path) -> None:
    where, app = tmp_path / "queue.sqlite3", tmp_path / "app.sqlite3"
    first, _ = on_the_same_work(name, where, app)
    first.put([item_of(i) for i in range(3)])
    handle, item = first.take() or (None, "")
    event_id, effect = app_effects.effect_of_item(item)
    assert first.effects.commit(event_id, effect)
    first.close()  # the consumer dies here: the effect committed, no ack
    second, _ = on_the_same_work(name, where, app)
    try:
        again = second.work(10)
        outcome = "redelivered" if event_id in again else "gone"
        if outcome == "gone" and name == "litequeue":  # the remedy nothing calls by itself
            second.queue.retry(handle)
            again += second.work(10)
            outcome = "held" if event_id in again else "gone"
    finally:
        second.close()

    assert outcome == AFTER_A_DEATH[name]
    assert GUARANTEE[outcome] == PEERS[name].guarantee
    assert app_effects.rows(str(app)) == app_effects.expected(3)  # each once, the money exact


def test_huey_dequeues_before_the_work_so_a_death_before_the_effect_loses_the_message(
        tmp_path: Path) -> None:
    where, app = tmp_path / "queue.sqlite3", tmp_path / "app.sqlite3"
    first, _ = on_the_same_work("huey", where, app)
    first.put([item_of(i) for i in range(3)])
    _, item = first.take() or (None, "")
    first.close()  # the consumer dies after the get, before the effect's commit
    second, _ = on_the_same_work("huey", where, app)
    try:
        again = second.work(10)
    finally:
        second.close()

    lost = app_effects.effect_of_item(item)[0]
    assert lost not in again and sorted(again) == sorted({"E0000", "E0001", "E0002"} - {lost})
    assert [row[0] for row in app_effects.rows(str(app))] == sorted(again)
    assert "at most once" in PEERS["huey"].guarantee and "deletes" in PEERS["huey"].guarantee_why


def test_a_same_work_case_checks_the_effects_table_after_every_slice(tmp_path: Path) -> None:
    worker = PeerWorker()
    try:
        case = SameWorkCase(PEERS["litequeue"], "FULL", tmp_path, 4, worker)
        first, second = case.slice(), case.slice()
        conn = sqlite3.connect(case.effects_at)
        conn.execute("UPDATE effects SET amount_cents = amount_cents + 1 WHERE event_id = 'E0002'")
        conn.commit()
        conn.close()
        with pytest.raises(CheckFailed, match="effects table holds 12 effects"):
            case.slice()
    finally:
        worker.close()

    assert (first.messages, second.messages, case.name) == (4, 4, "same_litequeue_FULL")
    assert case.durability() == "WAL, FULL (set by bench); effects WAL, FULL"
    assert case.info()["guarantee"] == "at least once after a retry, deduped"


def test_a_peer_that_does_not_fsync_every_commit_is_not_put_on_the_same_work(
        tmp_path: Path) -> None:
    worker = PeerWorker()
    try:
        with pytest.raises(ValueError, match="not every commit fsyncs"):
            SameWorkCase(PEERS["litequeue"], "defaults", tmp_path, 4, worker)
    finally:
        worker.close()

    assert {name: same_work_variant(adapter) for name, adapter in PEERS.items()} == \
        {"persist-queue": "defaults", "litequeue": "FULL", "huey": "defaults"}


def test_make_bench_runs_the_same_work_in_both_regimes_and_the_notebook_run_leaves_it_out() -> None:
    assert bench.FULL.same_work and bench.SLOW.same_work
    assert not bench.PEERS_QUICK.same_work and not bench.QUICK.same_work


def test_only_make_bench_times_the_command_lines_start() -> None:
    # two seconds of starts that notebook 08 prints nothing of, nor the runs of one question
    assert bench.FULL.startup and bench.QUICK.startup
    assert not any(plan.startup for plan in (bench.PEERS_QUICK, bench.SLOW, bench.WRITERS,
                                             bench.PRIORITIES))


def test_a_run_on_the_same_work_prints_its_own_table_with_each_guarantee(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    plan = bench.replace(bench.PEERS_QUICK, rounds=2, single=5, k10=10, k100=20,
                         batches=(1,), safety=(0, 0), normal=False, same_work=True)
    results = bench.run(plan=plan)
    monkeypatch.setattr(bench, "run", lambda **_: results)

    assert bench.main([]) == 0
    out = capsys.readouterr().out
    table = out.split("peers on the same work, regime: this machine's flush")[1].split("\n\n")[0]
    rows = {line.split("  ")[0]: line for line in table.splitlines()[2:]}
    assert set(rows) == {"ours, the worker loop", *(f"{name} {same_work_variant(adapter)} + effect"
                                                    for name, adapter in PEERS.items())}
    assert rows["ours, the worker loop"].endswith("exactly once")
    assert rows["huey defaults + effect"].endswith("at most once")
    assert rows["persist-queue defaults + effect"].endswith("at least once, deduped")
    assert "WAL, FULL" in rows["litequeue FULL + effect"]
    assert {peer["peer"] for peer in results["same_work"]} == set(PEERS)
    assert all(not name.startswith("same_") for peer in results["peers"] for name in [peer["name"]])
    assert "the application's effects table holds one effect per event put" in out
    assert "SQLite single vs fastest peer, same work" in out
    assert "startup" not in results
    assert re.search(r"queue-core --help vs a bare Python start +- +<= 3 +not measured", out)


def test_the_same_work_targets_set_our_worker_loop_against_the_fastest_such_peer() -> None:
    same = [dict(peer("slow", "FULL", 0.2), effects_synchronous="FULL"),
            dict(peer("fast", "FULL", 0.4), effects_synchronous="FULL"),
            dict(peer("pgq", "on", 0.2, "postgres"), effects_synchronous="on")]
    slow = results_with({"single": 0.9}, [], same_work=[dict(same[1], vs_raw=0.5)])
    results = results_with({"single": 0.5, "pg_single_1": 0.34}, [peer("bare", "FULL", 0.9)],
                           same_work=same, slow=slow)
    rows = {row["name"]: row for row in bench_report.evaluate(results)}

    fast = rows["SQLite single vs fastest peer, same work"]
    assert (round(fast["value"], 6), fast["bound"], fast["met"], fast["against"]) == \
        (1.25, 1.4, False, "fast FULL + effect FULL")
    slowly = rows["SQLite single vs fastest peer, same work, 2 ms flush"]
    assert (round(slowly["value"], 6), slowly["bound"], slowly["met"]) == (1.8, 1.9, False)
    pg = rows["PostgreSQL single vs fastest peer, same work"]
    assert (round(pg["value"], 6), pg["bound"], pg["met"], pg["against"]) == \
        (1.7, 1.6, True, "pgq on + effect on")
    # the bare peer is not on the same work: it does not count there
    assert rows["SQLite single vs fastest fsyncing peer"]["against"] == "bare FULL"
