"""The lifetime figures of ``make bench`` (``benchmarks/bench_retention.py``): the
steady load pruned and not, the prune beside a worker, PostgreSQL's space after
prune and VACUUM, and migrate beside a running worker of the previous engine;
their keys, their targets, and the exit status (a missed target exits 0, a
failed check exits 1)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterator

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))

import bench  # noqa: E402
import bench_report  # noqa: E402
import bench_retention  # noqa: E402
import previous_engine  # noqa: E402
from bench_cases import CheckFailed  # noqa: E402

from queue_core.lab.servers.pgcases import Schemas  # noqa: E402
from queue_core.queue import PRUNE_BATCH  # noqa: E402

LIFETIME_TARGETS = {"file + -wal after a steady load, pruned vs not",
                    "bytes kept per pruned event (dbstat pages)",
                    "single consume, prune beside vs without",
                    "longest prune hold of the write lock, ms"}
# Only the lifetime figures, as small as they go: no raw-commit rounds beyond two.
LIFETIME_ONLY = bench.replace(bench.QUICK, rounds=2, single=10, batches=(), sizes=(), bare=False,
                              retention=(300, 100), migrate=(400, 300), priorities=(0, 0),
                              starvation=0)


@pytest.fixture(scope="module")
def quick() -> dict:
    return bench.run(plan=LIFETIME_ONLY)


def test_the_quick_run_measures_every_lifetime_figure_and_each_has_its_target(
        quick: dict) -> None:
    lifetime = quick["lifetime"]

    assert {"steady", "beside", "migrate", "ack_pages"} <= set(lifetime)
    assert lifetime["ack_pages"]["fused"] and all(lifetime["ack_pages"]["fsynced"])
    steady = lifetime["steady"]
    assert {"files", "samples", "flat", "slope", "kept", "replay", "prune", "wal_limit"} <= \
        set(steady)
    assert set(steady["files"]) == {"unpruned", "pruned", "limited"}
    assert {"file", "wal", "wal_peak", "wal_rest", "checkpointed", "payload", "journal",
            "kept"} <= set(steady["files"]["pruned"])
    assert steady["replay"] == {"same": "duplicate", "other": "batch_conflict"}
    assert lifetime["beside"]["pruned"] >= lifetime["beside"]["consumed"] - 1
    assert {"during", "kept_up", "backlog_max"} <= set(lifetime["beside"])
    rows = {row["name"]: row for row in quick["targets"]}
    assert LIFETIME_TARGETS <= set(rows)
    assert all(rows[name]["value"] is not None for name in LIFETIME_TARGETS)
    text = "\n".join(bench.report(quick))
    assert "the queue over its lifetime" in text and "journal_size_limit" in text
    assert "prune beside the worker" in text
    assert "migrate, SQLite" in text or "migrate: not measured" in text


def test_the_steady_load_keeps_the_live_window_flat_and_every_pruned_key(quick: dict) -> None:
    steady = quick["lifetime"]["steady"]
    files, live = steady["files"], steady["live_windows"] * steady["window"]

    assert steady["flat"]["payload"] == (live * bench_retention.PAYLOAD_BYTES,) * 2
    assert files["pruned"]["checkpointed"] < files["unpruned"]["checkpointed"]
    # cut at the limit (prune itself truncates a long WAL it finds idle: then they are equal)
    assert files["limited"]["wal_rest"] <= files["pruned"]["wal_rest"]
    assert 60 < steady["kept"]["cells_per_event"] < steady["kept"]["per_event"] < 400
    assert steady["kept"]["pruned"] == steady["events"] - 1  # the journal's last row's owner
    assert 0 < steady["prune"]["longest_s"] < 5


def test_the_prune_hold_is_timed_by_a_process_beside_the_prune(quick: dict) -> None:
    hold = quick["lifetime"]["hold"]

    pruned = LIFETIME_ONLY.retention[0] // 2 - 1  # all but the journal's last row's owner
    assert (hold["messages"], hold["batches"]) == (pruned, -(-pruned // PRUNE_BATCH))
    # the probe's longest wait during the batches ended before pages were given back
    assert 0 <= hold["held_s"] < hold["seconds"]
    assert hold["give_back_held_s"] >= 0 and hold["longest_call_s"] > 0


def test_migrate_is_timed_beside_a_worker_of_the_previous_engine(quick: dict) -> None:
    previous_engine.require_history()
    moved = quick["lifetime"]["migrate"]

    assert moved["engine"] == bench_retention.MIGRATE_ENGINE
    sqlite = moved["sqlite"]
    assert sqlite["messages"] == 400 and sqlite["seconds"] > 0
    assert 0 < sqlite["held_s"] <= sqlite["seconds"] and sqlite["waited_s"] >= 0
    assert sqlite["worker_steps"] >= 20
    assert sqlite["worker_end"] == "empty" or "finished_at_iff_done" in sqlite["worker_end"]


def with_lifetime(**steady: object) -> dict:
    files = {name: {"file": 1000, "wal": 0} for name in ("unpruned", "pruned", "limited")}
    return {"vs_raw": {"single": 0.5, "single_pruned": 0.4}, "peers": [],
            "paired": {"single_pruned": 0.8},  # its slices over the worker's alone around them
            "lifetime": {"steady": {"files": files, **steady}}}


def test_each_lifetime_target_reads_its_figure_and_its_direction() -> None:
    results = with_lifetime(kept={"per_event": 180.0, "pruned": 99},
                            prune={"longest_s": 0.012, "batches": 3})
    results["lifetime"]["hold"] = {"held_s": 0.014, "give_back_held_s": 0.002, "batches": 4,
                                   "messages": 199, "longest_call_s": 0.03, "seconds": 0.1}
    results["lifetime"]["steady"]["files"]["unpruned"] = {"file": 8000, "wal": 2000}
    results["lifetime"]["steady"]["files"]["pruned"] = {"file": 1500, "wal": 1000}
    results["lifetime"]["beside"] = {"kept_up": False, "during": 3, "consumed": 100,
                                       "backlog_max": 97}
    rows = {row["name"]: row for row in bench_report.evaluate(results)}

    size = rows["file + -wal after a steady load, pruned vs not"]
    assert (size["value"], size["at_least"], size["met"]) == (0.25, False, True)
    assert rows["bytes kept per pruned event (dbstat pages)"]["met"] is True
    assert rows["single consume, prune beside vs without"]["value"] == pytest.approx(0.8)
    assert rows["single consume, prune beside vs without"]["met"] is False
    assert rows["single consume, prune beside vs without"]["against"].startswith(
        "the prune kept up: NO, it pruned 3 of the 100 messages while the worker ran, at most 97 "
        "behind")
    longest = rows["longest prune hold of the write lock, ms"]  # the probe's, not the steady's
    assert (longest["value"], longest["met"]) == (pytest.approx(14.0), False)
    assert "the probe waited at most 2.0 ms" in longest["against"]
    assert "the end of the commit call" in longest["against"] and "30.0 ms" in longest["against"]
    assert bench_report.evaluate({"vs_raw": {}, "peers": []})  # nothing measured: no error


def test_a_missed_lifetime_target_still_exits_0(
        quick: dict, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    results = dict(quick, lifetime=dict(quick["lifetime"]))
    results["lifetime"]["hold"] = dict(results["lifetime"]["hold"],
                                       held_s=0.5)  # 500 ms, far above 10
    monkeypatch.setattr(bench, "run", lambda **_: results)

    assert bench.main([]) == 0
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines()
                if "longest prune hold of the write lock, ms" in line)
    assert "500.00" in line and "ABOVE TARGET" in line


def test_a_wrong_figure_of_money_after_the_steady_load_fails_the_run(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # the load's bookkeeping expects one cent more per event than the queue stores
    monkeypatch.setattr(bench_retention, "amount_of", lambda i: 101 + i % 900)
    monkeypatch.setattr(bench, "QUICK", bench.replace(LIFETIME_ONLY, migrate=(0, 0)))

    assert bench.main(["--quick"]) == 1
    out = capsys.readouterr().out
    assert "EXACTLY-ONCE CHECK FAILED" in out and "steady load" in out


def test_a_prune_that_left_done_payloads_fails_the_slice(tmp_path: Path) -> None:
    from bench_worker import Worker

    worker, pruner = Worker(), Worker()
    try:
        case = bench_retention.PrunedEndToEnd(tmp_path, 5, [worker], pruner)
        first = case.slice()  # pruned beside the worker, then checked
        case.pruner = Stub()  # type: ignore[assignment]
        with pytest.raises(CheckFailed, match="keep their payload"):
            case.slice()
        case.close()
    finally:
        worker.close()
        pruner.close()

    assert first.messages == 5 and case.pruning[0]["messages"] >= 4


class Stub:
    """A pruning process that answers as if it had run, and prunes nothing."""

    def call(self, **cmd: object) -> dict:
        return {"kept": 0, "messages": 0, "during": 0, "batches": 0, "calls": 0,
                "longest_s": 0.0, "seconds": 0.0}


# -- PostgreSQL -------------------------------------------------------------------

@pytest.fixture
def schemas(pg_server: str) -> Iterator[Schemas]:
    with Schemas(pg_server, "queue_test_life") as made:
        yield made


def test_postgres_space_is_measured_before_and_after_prune_and_vacuum(schemas: Schemas) -> None:
    space = bench_retention.pg_space(schemas.fresh("space"), 60)

    assert set(space) == {"events", "before", "after", "again"}
    assert set(space["before"]) == set(bench_retention.PG_TABLES)
    assert space["before"]["compacted"]["heap"] == 0 < space["after"]["compacted"]["heap"]
    assert all({"heap", "indexes", "total"} == set(sizes) for sizes in space["after"].values())


def test_postgres_migrate_is_timed_beside_a_worker_of_the_previous_engine(
        schemas: Schemas, tmp_path: Path) -> None:
    previous_engine.require_history()
    engine = bench_retention.export_engine(tmp_path)
    moved = bench_retention.migrate_beside_a_worker(engine, schemas.fresh("migrate"), 300, 250)

    assert moved["messages"] == 300 and 0 < moved["held_s"] <= moved["seconds"]
    assert moved["worker_end"] == "empty" or "finished_at_iff_done" in moved["worker_end"]
