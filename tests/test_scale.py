"""The machinery of ``make scale`` (``benchmarks/scale.py``) at a tiny size: real
worker processes, a real pruner beside them, each store; the audit's results
asserted exactly (states, effects, money, what was pruned), never a rate."""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))

import scale  # noqa: E402
import scale_report  # noqa: E402

from queue_core.lab.servers.pgcases import Schemas  # noqa: E402

TINY = scale.replace(scale.TINY, pg_events=240, pg_workers=(1, 2), sqlite_events=240,
                     sqlite_workers=(1, 2), control=90, raw_s=0.2, sample_s=0.3)


@pytest.fixture
def places(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str, str]]:
    """(queue, control queue, raw commits) of the store the test is parametrised with."""
    if request.param == "sqlite":
        yield tuple(str(tmp_path / f"{name}.sqlite3") for name in ("main", "control", "raw"))
        return
    with Schemas(request.getfixturevalue("pg_server"), "queue_test_scale") as schemas:
        yield schemas.fresh("main"), schemas.fresh("control"), schemas.fresh("raw")


def _quiet(text: str) -> None:
    pass


@pytest.mark.parametrize("places", ["sqlite", "postgres"], indirect=True)
def test_every_event_is_done_once_with_exact_money_through_worker_processes_and_prune(
        places: tuple[str, str, str], tmp_path: Path) -> None:
    store = "sqlite" if places[0].endswith(".sqlite3") else "postgres"
    found: dict[str, Any] = scale.run_store(store, *places, TINY, _quiet)
    events = TINY.pg_events if store == "postgres" else TINY.sqlite_events
    audit = found["audit"]
    assert audit["states"] == {"ready": 0, "leased": 0, "done": events, "dead": 0}
    assert (audit["events"], audit["effects"], audit["findings"]) == (events, events, [])
    assert audit["money"] == audit["money_wanted"] == scale.money_of(0, events) == 52_680
    # prune ran beside the workers: every message but the owner of the journal's last row
    assert audit["pruned"] >= events - 1
    assert [(p["workers"], p["events"], p["kinds"]) for p in found["phases"]] == [
        (1, 80, {"done": 80}), (2, 160, {"done": 160})]
    control = found["control_audit"]
    assert (control["states"]["done"], control["effects"], control["pruned"]) == (90, 90, 0)
    assert control["money"] == scale.money_of(0, 90)
    judged = scale_report.verdicts({"plan": TINY.__dict__, "seconds": 1.0, store: found})
    assert judged[f"{scale_report.NAMES[store]} audit exact"] is True
    assert scale_report.report({"plan": TINY.__dict__, "seconds": 1.0, store: found}, judged)
    picture = scale_report.picture({"plan": TINY.__dict__, "seconds": 1.0, store: found},
                                   tmp_path / "scale.png")
    assert picture.read_bytes().startswith(b"\x89PNG")
    # a full-size run of this store alone (--only) names only it, and leaves the whole
    # run's 15 minutes unjudged; both stores' runs judge them
    alone = {"plan": scale.FULL.__dict__, "seconds": 1_000.0, store: found}
    judged = scale_report.verdicts(alone)
    assert not [name for name in judged if name.startswith("full run")]
    assert scale_report.report(alone, judged)[0] == (
        f"make scale: {scale.FULL.sqlite_events if store == 'sqlite' else scale.FULL.pg_events:,} "
        f"{scale_report.NAMES[store]} events, this machine, 1000 s in all")
    if store == "sqlite":  # ... and one whose PostgreSQL could not start has not measured them
        skipped = {**alone, "postgres_skipped": "no server"}
        judged = scale_report.verdicts(skipped)
        assert judged["full run <= 15 min"] is None
        assert "  not measured full run <= 15 min" in scale_report.report(skipped, judged)
    both = {**alone, "postgres": found, "sqlite": found}
    assert scale_report.verdicts(both)["full run <= 15 min"] is False
    assert scale_report.report(both, scale_report.verdicts(both))[0].startswith(
        "make scale: 1,000,000 PostgreSQL and 200,000 SQLite events")


def test_an_effect_edited_behind_the_queue_fails_the_audit_and_the_target(
        tmp_path: Path) -> None:
    db, raw = str(tmp_path / "main.sqlite3"), str(tmp_path / "raw.sqlite3")
    scale.probe.prepare_raw(raw)
    run = scale.Run("sqlite", db, raw, TINY, _quiet, prune=False)
    run.phase(1, 30)
    conn = sqlite3.connect(db)
    with conn:
        conn.execute("UPDATE effects SET amount_cents = amount_cents + 1 "
                     "WHERE event_id = ?", (scale.event_id(7),))
    conn.close()
    with pytest.raises(scale.CheckFailed, match="money"):
        run.audit()


def test_phases_share_the_events_in_proportion_to_their_workers() -> None:
    assert scale.shares(1_000_000, (1, 2, 4, 8)) == [66_666, 133_333, 266_666, 533_335]
    assert sum(scale.shares(200_000, (1, 2, 4))) == 200_000


def test_a_pruner_that_dies_is_reported_and_the_queue_is_still_audited_whole(
        tmp_path: Path) -> None:
    db, raw = str(tmp_path / "main.sqlite3"), str(tmp_path / "raw.sqlite3")
    scale.probe.prepare_raw(raw)
    run = scale.Run("sqlite", db, raw, TINY, _quiet)
    assert run.pruner is not None
    run.pruner.kill()
    run.phase(1, 30)
    assert "died" in run.stop_pruner()
    audit = run.audit()
    assert (audit["states"]["done"], audit["effects"], audit["money"]) == (
        30, 30, scale.money_of(0, 30))


def test_naptime_for_a_server_that_is_not_this_runs_own_is_refused_before_anything_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    # No server listens there: a run that went on would fail to connect, not refuse.
    monkeypatch.setenv("QUEUE_CORE_PG_DSN", f"postgresql://nobody@/none?host={tmp_path}")
    png = tmp_path / "scale.png"

    with pytest.raises(SystemExit) as ended:
        scale.main(["--scale", "tiny", "--naptime", "1", "--png", str(png)])

    said = capsys.readouterr()
    assert ended.value.code == 2 and said.out == ""
    assert said.err.splitlines()[-1].split(": ", 1)[1] == (
        "error: --naptime sets this run's private PostgreSQL server only: a server "
        "that QUEUE_CORE_PG_DSN names keeps its own settings (unset it, or drop --naptime)")
    assert list(tmp_path.iterdir()) == []  # no picture, no figures written
