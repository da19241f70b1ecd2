"""The lifetime sweeps: a migration and a prune killed at each of their steps by a
real process, and every frame prefix of their WAL a power cut can leave;
each file left is version 1 intact or version 2 complete, prune's batches
whole or absent, and each goes on to the uninterrupted run's end."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest

from queue_core.crashpoints import CRASH_EXIT_CODE, LIFETIME_POINTS
from queue_core.lab.sweeps import lifetime
from queue_core.lab.sweeps.powerloss import LifetimePowerLoss, run_lifetime_powerloss
from queue_core.lab.sweeps.sweep import LifetimeRow, run_lifetime_sweep

FILES = Path(__file__).resolve().parent / "files"
SCHEMA1 = [FILES / "schema1-265c64c.sqlite3", FILES / "schema1-0d78855.sqlite3"]
MIGRATIONS = ["migrate schema1-265c64c", "migrate schema1-0d78855"]


@pytest.fixture(scope="module")
def powerloss(tmp_path_factory: pytest.TempPathFactory) -> LifetimePowerLoss:
    return run_lifetime_powerloss(SCHEMA1, workdir=tmp_path_factory.mktemp("lifetime"))


@pytest.fixture(scope="module")
def crashes(tmp_path_factory: pytest.TempPathFactory) -> list[LifetimeRow]:
    return run_lifetime_sweep(SCHEMA1, workdir=tmp_path_factory.mktemp("lifetime"))


def test_every_frame_prefix_of_a_migration_is_version_1_intact_or_a_later_one_complete(
        powerloss: LifetimePowerLoss) -> None:
    assert powerloss.violations == []
    for run in MIGRATIONS:
        images = [image for image in powerloss.images if image.run == run]
        # one commit per step: 1 -> 2 (the rebuild), 2 -> 3 (the id rule recorded),
        # 3 -> 4 (the priority added, the live index rebuilt in the claim's order)
        assert powerloss.commits[run] == 3 and powerloss.frames[run] >= 4
        assert [image.frames for image in images] == list(range(powerloss.frames[run] + 1))
        # an image holds the version of the last commit whose frames it has, whole
        kept = {0: "version 1 intact", 1: "version 2 complete", 2: "version 3 complete",
                3: "version 4 complete"}
        assert [image.detail.split(";")[0] for image in images] == [
            kept[image.commits] for image in images]
        assert (images[0].commits, images[-1].commits) == (0, 3)
        assert images[-2].commits == 2  # the last frame is the third step's commit
        assert {image.commits for image in images} == {0, 1, 2, 3}
        assert {image.detail.split("; ")[1] for image in images} == {
            "migrated and worked on: 17700"}


def test_every_frame_prefix_of_a_prune_holds_whole_batches_and_prune_goes_on(
        powerloss: LifetimePowerLoss) -> None:
    images = [image for image in powerloss.images if image.run == "prune"]
    assert {image.outcome for image in images} == {"ok"}
    assert len(images) == powerloss.frames["prune"] + 1
    # three batches (3, 3 and 2 messages), then the incremental vacuum's commits
    batches = {image.commits: image.detail.split(" whole")[0] for image in images}
    assert [batches[n] for n in range(4)] == ["0", "1", "2", "3"]
    assert set(batches.values()) == {"0", "1", "2", "3"}
    assert Counter(image.commits for image in images)[0] >= 2  # a batch's frames, uncommitted


def test_a_migration_and_a_prune_killed_at_every_step_leave_a_file_that_goes_on(
        crashes: list[LifetimeRow]) -> None:
    assert [row for row in crashes if row.failed] == []
    migrate_points = [p for p in LIFETIME_POINTS if p.startswith("migrate.")]
    prune_points = [p for p in LIFETIME_POINTS if p.startswith("prune.")]
    assert [(row.run, row.step) for row in crashes if row.run != "prune"] == [
        (run, point) for run in MIGRATIONS for point in migrate_points]
    for row in crashes:
        if row.run != "prune":
            kept = "version 2 complete" if row.step == "migrate.after_commit" else \
                "version 1 intact"
            assert row.detail == f"{kept}; migrated and worked on: 17700"
    pruned = {(row.step, row.arrival): row.detail.split(" whole")[0]
              for row in crashes if row.run == "prune"}
    assert set(pruned) == {(point, arrival) for point in prune_points for arrival in (1, 2, 3)}
    for (point, arrival), batches in pruned.items():
        # the batches committed before the crash, and never part of one
        assert int(batches) == arrival - (point != "prune.after_commit")


PRUNE_TWO_THEN_DIE = textwrap.dedent("""
    import sys
    from queue_core import crashpoints
    from queue_core.lab.sweeps import lifetime
    crashpoints.arm("prune.after_commit")
    lifetime.prune_queue(__import__("pathlib").Path(sys.argv[1])).prune(
        lifetime.PRUNE_OLDER_THAN, batch_size=2)
""")


def test_the_prune_judge_sees_a_batch_of_another_size_and_a_half_pruned_message(
        tmp_path: Path) -> None:
    ref = lifetime.prune_end(tmp_path)
    db = lifetime.prune_source(tmp_path / "two.sqlite3")
    child = subprocess.run([sys.executable, "-c", PRUNE_TWO_THEN_DIE, str(db)],
                           capture_output=True, text=True, timeout=120)
    assert child.returncode == CRASH_EXIT_CODE, child.stderr
    assert lifetime.judge_prune(db, ref) == ("part of a batch", "pruned ['E0001', 'E0002']")
    db = lifetime.prune_source(tmp_path / "half.sqlite3")
    with sqlite3.connect(db) as conn:  # a payload dropped without its record
        conn.execute("UPDATE messages SET payload = NULL WHERE event_id = 'E0002'")
    conn.close()
    assert lifetime.judge_prune(db, ref)[0] == "audit finding"


def test_the_migration_judge_sees_a_changed_version_1_file(tmp_path: Path) -> None:
    ref = lifetime.migrate_end(SCHEMA1[0], tmp_path)
    db = lifetime.schema1_source(SCHEMA1[0], tmp_path / "changed.sqlite3")
    with sqlite3.connect(db) as conn:  # a ready message's time moved: the audit accepts it
        conn.execute("UPDATE messages SET available_at = 1011 WHERE event_id = 'E0005'")
    conn.close()
    assert lifetime.judge_migrate(db, ref)[0] == "version 1 changed"
