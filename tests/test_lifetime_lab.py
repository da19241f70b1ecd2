"""The lab of notebook 13: the brokers' windows, the file's size over a steady load,
a migration killed at each step, and a worker of the earlier release meeting a
migrated file (that release's own code, exported from git history)."""

from __future__ import annotations

from pathlib import Path

import pytest

import previous_engine
from queue_core import audit, migrate
from queue_core.crashpoints import CRASH_EXIT_CODE
from queue_core.lab.lifetime import (ENGINES, MIGRATION_POINTS, PREVIOUS, WINDOWS, earlier_cli,
                                     export_engine, kill_migration, migration_frame, steady_load,
                                     windows_frame, worker_across_migration, write_v1_file)

STATES = {"E0001": "done", "E0002": "dead", "E0003": "done", "E0004": "leased",
          "E0005": "ready"}


@pytest.fixture(scope="module")
def v1_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    previous_engine.require_history()
    folder = tmp_path_factory.mktemp("earlier")
    engine = export_engine(PREVIOUS, folder)
    return engine, write_v1_file(engine, folder / "v1.sqlite3")


def test_the_lab_pins_the_same_earlier_engines_as_the_tests() -> None:
    assert set(ENGINES) == set(previous_engine.ENGINES)


def test_the_earlier_engine_writes_a_schema_1_file_with_one_message_of_every_state(
        v1_file: tuple[Path, Path]) -> None:
    snap = audit.snapshot(v1_file[1])
    assert snap.version == 1 and audit.check(snap) == []
    assert snap.states() == STATES and snap.money == 15000 and snap.status.effects == 2


@pytest.mark.parametrize("point", MIGRATION_POINTS)
def test_a_migration_killed_at_each_step_leaves_a_whole_version_and_the_same_money(
        point: str, v1_file: tuple[Path, Path], tmp_path: Path) -> None:
    case = kill_migration(v1_file[1], point, tmp_path)
    assert case.exit_code == CRASH_EXIT_CODE and case.ok
    assert case.version == (2 if point == "migrate.after_commit" else 1)
    assert case.findings == () and case.money == case.money_after == 15000
    assert dict(case.states) == STATES and case.version_after == 4
    assert migration_frame([case]).loc[point, "audit"] == "clean"


def test_a_running_worker_of_the_earlier_release_is_refused_loudly_or_stays_correct(
        v1_file: tuple[Path, Path], tmp_path: Path) -> None:
    engine, source = v1_file
    db = tmp_path / "queue.sqlite3"
    db.write_bytes(source.read_bytes())
    steps = dict(worker_across_migration(engine, db, lambda: migrate(db)))
    assert steps["claim"].startswith("accepted: Lease(event_id='E0005', generation=1")
    assert steps["ACK"] == "refused: IntegrityError: CHECK constraint failed: finished_at_iff_done"
    assert steps["enqueue E0009"] == ("refused: IntegrityError: NOT NULL constraint failed: "
                                      "messages.payload_sha256")
    assert steps["replay E0001"] == "accepted: EnqueueResult(inserted=0, duplicates=1)"
    assert steps["fail"].startswith("accepted: Outcome(event_id='E0005', kind='retry'")
    snap = audit.snapshot(db)
    assert audit.check(snap) == [] and snap.money == 15000 and "E0009" not in snap.messages
    refused = earlier_cli(engine, "--db", str(db), "status")
    assert refused.returncode == 1 and "schema_too_new" in refused.stderr


def test_prune_keeps_the_file_near_its_live_window_and_never_changes_the_money() -> None:
    frame = steady_load(rounds=4, per_round=20)
    kept, pruned = (frame[frame["with prune"] == flag].reset_index() for flag in (False, True))
    assert list(kept["money"]) == list(pruned["money"]) == [210, 820, 1830, 3240]
    assert list(pruned["effects"]) == [20, 40, 60, 80] and list(kept["pruned"]) == [0] * 4
    assert list(pruned["pruned"]) == [0, 20, 40, 60]
    assert pruned["bytes"].iloc[-1] < 0.6 * kept["bytes"].iloc[-1]
    assert kept["bytes"].is_monotonic_increasing


def test_the_windows_table_names_a_source_for_every_system() -> None:
    frame = windows_frame()
    assert list(frame.index) == ["SQS FIFO", "NATS JetStream", "Azure Service Bus",
                                 "River unique jobs", "Oban unique jobs", "this queue"]
    assert all(w.source for w in WINDOWS)
    assert all(after == "accepted as new" or after == "inserted as a new job"
               for after in frame["a duplicate after"][:-1])
