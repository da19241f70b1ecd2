"""Schema 2 and ``migrate``, tested with files the earlier engines wrote and with
those engines themselves, taken from git history (``previous_engine``).

Each committed file ``tests/files/schema1-<commit>.sqlite3`` was written by the
engine of that commit (``tests/files/make_files.py`` writes it again): E0001
and E0003 done (E0003 at generation 2), E0002 dead, E0004 leased until 1037,
E0005 ready; 15000 of money.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

import previous_engine
from queue_core import Handler, ModelClock, Queue, UnusableFile, audit, drain, migrate
from queue_core.crashpoints import CRASH_EXIT_CODE, LIFETIME_POINTS
from queue_core.lab.lifetime.earlier import worker_said
from queue_core.sqlite import SCHEMA_VERSION
from queue_core.sqlite.migrations import migrate_step
from queue_core.lab.lifetime.migration import migrate_killed_at

FILES = Path(__file__).resolve().parent / "files"
ROOT = Path(__file__).resolve().parent.parent
PAGE_SIZES = {"265c64c": 1024, "0d78855": 4096}
STATES_BEFORE = {"E0001": "done", "E0002": "dead", "E0003": "done", "E0004": "leased",
                 "E0005": "ready"}


def cli(db: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "queue_core", "--db", str(db), *args],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)


def folder_state(folder: Path) -> dict[str, str]:
    """Every file in ``folder`` with the SHA-256 of its bytes."""
    return {path.name: hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(folder.iterdir())}


def copy_of(commit: str, folder: Path) -> Path:
    target = folder / "queue.sqlite3"
    shutil.copyfile(FILES / f"schema1-{commit}.sqlite3", target)
    return target


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    previous_engine.require_history()
    folder = tmp_path_factory.mktemp("engines")
    return {commit: previous_engine.export(commit, folder) for commit in previous_engine.ENGINES}


@pytest.mark.parametrize("commit", list(previous_engine.ENGINES))
def test_a_file_of_the_earlier_engine_is_read_as_it_is_and_every_write_is_refused(
        commit: str, tmp_path: Path) -> None:
    db = copy_of(commit, tmp_path)
    before = folder_state(tmp_path)
    for reading in (["status"], ["status", "--json"], ["metrics"], ["--now", "1020", "metrics"]):
        done = cli(db, *reading)
        assert done.returncode == 0, done.stderr
    status = json.loads(cli(db, "status", "--json").stdout)
    assert status["states"] == {"ready": 1, "leased": 1, "done": 2, "dead": 1}
    assert status["total"] == 15000 and status["pruned"] == 0
    assert audit.findings(db) == []
    assert folder_state(tmp_path) == before  # byte for byte, and no -wal or -shm left
    batch = tmp_path / "batch.jsonl"
    batch.write_text('{"event_id": "E0009", "payload": {"category": "pen", "amount_cents": 1}}\n')
    before = folder_state(tmp_path)
    for writing in (["enqueue", str(batch)], ["--now", "2000", "work"], ["redrive", "E0002"],
                    ["--now", "2000", "prune", "--older-than", "0"]):
        done = cli(db, *writing)
        assert done.returncode == 1, (writing, done.stdout, done.stderr)
        assert done.stderr.startswith("error: schema_too_old: queue.sqlite3 has queue schema "
                                      "version 1;"), done.stderr
        assert "run `queue-core migrate` first" in done.stderr and done.stdout == ""
        assert folder_state(tmp_path) == before


@pytest.mark.parametrize("commit", list(previous_engine.ENGINES))
def test_migrate_upgrades_the_file_once_keeping_every_fact_and_its_page_size(
        commit: str, tmp_path: Path) -> None:
    db = copy_of(commit, tmp_path)
    before = audit.snapshot(db)
    done = cli(db, "migrate")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["schema 1 -> 2: 5 messages rewritten",
                                        "schema 2 -> 3: 0 messages rewritten",
                                        "schema 3 -> 4: 0 messages rewritten",
                                        "queue.sqlite3 migrated from schema version 1 to 4"]
    after = audit.snapshot(db)
    assert after.version == SCHEMA_VERSION == 4 and audit.check(after) == []
    assert after.messages == before.messages and after.journal == before.journal
    assert after.effect_rows == before.effect_rows and after.status == before.status
    assert {event_id: digest.hex()[:12] for event_id, digest in after.digests.items()} == {
        event_id: hashlib.sha256(message.payload.encode()).hexdigest()[:12]
        for event_id, message in before.messages.items()}
    with sqlite3.connect(db) as conn:
        finished = dict(conn.execute("SELECT event_id, finished_at FROM messages "
                                     "WHERE finished_at IS NOT NULL"))
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
        indexes = [row[0] for row in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL")]
    conn.close()
    done_at = {step.event_id: step.at for step in before.journal if step.to_state == "done"}
    assert finished == done_at == {"E0001": 1000, "E0003": 1010}
    assert page_size == PAGE_SIZES[commit]  # kept: only a VACUUM could change it
    assert indexes == ["messages_live"]
    settled = folder_state(tmp_path)
    again = cli(db, "migrate")
    assert (again.returncode, again.stdout) == (
        0, "queue.sqlite3 is already at schema version 4: nothing to do\n")
    assert folder_state(tmp_path) == settled
    # The migrated file works on: the expired lease recovered, both messages done once.
    work = cli(db, "--now", "2000", "work")
    assert work.returncode == 0, work.stderr
    snap = audit.snapshot(db)
    assert audit.check(snap) == [] and snap.states() == {**STATES_BEFORE, "E0004": "done",
                                                          "E0005": "done"}
    assert snap.money == 17700 and snap.messages["E0004"].generation == 2


@pytest.mark.parametrize("commit", list(previous_engine.ENGINES))
def test_the_earlier_engine_refuses_a_migrated_file_and_changes_nothing(
        commit: str, engines: dict[str, Path], tmp_path: Path) -> None:
    db = copy_of(commit, tmp_path)
    assert cli(db, "migrate").returncode == 0
    batch = tmp_path / "batch.jsonl"
    batch.write_text('{"event_id": "E0009", "payload": {"category": "pen", "amount_cents": 1}}\n')
    before = folder_state(tmp_path)
    for command in (["status"], ["--now", "2000", "work"], ["enqueue", str(batch)],
                    ["redrive", "E0002"]):
        done = previous_engine.cli(engines[commit], "--db", str(db), *command)
        assert done.returncode == 1, (command, done.stdout, done.stderr)
        assert done.stderr == ("error: schema_too_new: " + str(db) + " has queue schema "
                               "version 4; this version of queue_core knows 1 (upgrade it)\n")
        assert folder_state(tmp_path) == before


@pytest.mark.parametrize("commit", list(previous_engine.ENGINES))
def test_a_running_worker_of_the_earlier_engine_is_refused_loudly_or_stays_correct(
        commit: str, engines: dict[str, Path], tmp_path: Path) -> None:
    """Design: schema 2 makes every statement of the earlier engine either still
    correct or refused; its ACK without a finish time and its enqueue without a
    digest fail the schema's constraints, and write nothing."""
    db = copy_of(commit, tmp_path)
    def migrate_now() -> None:  # the worker's session opened, and claimed, before it
        assert migrate(db).steps == ((1, 5), (2, 0), (3, 0))

    said = {line["step"]: line for line in worker_said(engines[commit], db, migrate_now)}
    assert said["claim"]["ok"] == ("Lease(event_id='E0005', generation=1, attempt=1, "
                                   "lease_until=1050)")
    ack, enqueue = said["ACK"], said["enqueue E0009"]
    assert ack["error"] == "IntegrityError" and "finished_at_iff_done" in ack["text"]
    assert enqueue["error"] == "IntegrityError" and "payload_sha256" in enqueue["text"]
    assert said["replay E0001"]["ok"] == "EnqueueResult(inserted=0, duplicates=1)"  # still correct
    assert said["fail"]["ok"].startswith("Outcome(event_id='E0005', kind='retry'")
    snap = audit.snapshot(db)
    assert audit.check(snap) == [] and "E0009" not in snap.messages
    assert snap.states() == {**STATES_BEFORE, "E0005": "ready"} and snap.money == 15000
    queue = Queue(db, clock=ModelClock(2000))
    drain(queue, Handler())
    snap = audit.snapshot(db)
    assert audit.check(snap) == [] and snap.money == 17700
    assert snap.states() == {**STATES_BEFORE, "E0004": "done", "E0005": "done"}


def test_a_step_applied_by_another_migrator_is_not_applied_again(tmp_path: Path) -> None:
    db = copy_of("265c64c", tmp_path)
    assert migrate_step(db, 1) == 5
    settled = folder_state(tmp_path)
    assert migrate_step(db, 1) is None  # the version read again under the write lock is 2
    assert folder_state(tmp_path) == settled


def test_two_migrators_started_at_once_apply_the_step_once(tmp_path: Path) -> None:
    db = copy_of("265c64c", tmp_path)
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # both migrators wait for the write lock behind it
    try:
        runs = [subprocess.Popen([sys.executable, "-m", "queue_core", "--db", str(db), "migrate"],
                                 cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True) for _ in range(2)]
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    outputs = sorted(run.communicate(timeout=120)[0] for run in runs)
    assert [run.returncode for run in runs] == [0, 0]
    for step in ("schema 1 -> 2: 5 messages rewritten", "schema 2 -> 3: 0 messages rewritten",
                 "schema 3 -> 4: 0 messages rewritten"):
        assert len([out for out in outputs if step in out]) == 1, outputs
    assert audit.findings(db) == [] and audit.snapshot(db).version == 4


MIGRATION_POINTS = [point for point in LIFETIME_POINTS if point.startswith("migrate.")]


@pytest.mark.parametrize("point", MIGRATION_POINTS)
def test_a_migration_killed_at_each_point_leaves_version_1_intact_or_version_2_complete(
        point: str, tmp_path: Path) -> None:
    db = copy_of("0d78855", tmp_path)
    before = audit.snapshot(db)
    child = migrate_killed_at(db, point)
    assert child.returncode == CRASH_EXIT_CODE, child.stderr
    snap = audit.snapshot(db)
    assert audit.check(snap) == [] and snap.version == (2 if point == "migrate.after_commit" else 1)
    assert snap.messages == before.messages and snap.money == 15000
    assert migrate(db).to_version == 4 and audit.findings(db) == []


def test_writes_refused_before_migrate_raise_schema_too_old_in_python_too(tmp_path: Path) -> None:
    db = copy_of("265c64c", tmp_path)
    queue = Queue(db, clock=ModelClock(2000))
    assert queue.schema_version == 1 and queue.status().states["done"] == 2
    with pytest.raises(UnusableFile) as refused:
        queue.claim()
    assert refused.value.code == "schema_too_old"
    with pytest.raises(UnusableFile):
        queue.prune(0)
