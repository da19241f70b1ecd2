"""Schema 2 and ``migrate`` on PostgreSQL, tested with the earlier engine itself.

The engine of 265c64c (schema 1) writes the queue of ``tests/files/make_files.py``
into a fresh schema on the private server: E0001 and E0003 done (E0003 at
generation 2), E0002 dead, E0004 leased until 1037, E0005 ready; 15000 of
money. This engine reads it, refuses to write to it, and migrates it; the
earlier engine then refuses the migrated schema, and a worker of the earlier
engine that is running while ``migrate`` commits is refused loudly.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

import pg
import previous_engine
from queue_core.lab.lifetime.earlier import V1_STORY, worker_said
from queue_core import (BatchRejected, Handler, ModelClock, Queue, UnusableFile, audit, drain,
                        migrate, postgres)
from queue_core.crashpoints import CRASH_EXIT_CODE, LIFETIME_POINTS
from queue_core.marks import APPLICATION_ID
from queue_core.lab.lifetime.migration import migrate_killed_at

SCHEMA_VERSION = postgres.SCHEMA_VERSION  # 7: schema 2's tables, the step's function, the
# id rule, each message's priority and the step's claim with a constant LIMIT
# 1 -> 2 rewrites the five messages; 2 -> 3 adds a function, 3 -> 4 replaces it, 4 -> 5
# records the id rule, 5 -> 6 adds the priority (and replaces the function again), 6 -> 7
# replaces the function once more (its claim's LIMIT 1)
BOTH_STEPS = ((1, 5), (2, 0), (3, 0), (4, 0), (5, 0), (6, 0))

ROOT = Path(__file__).resolve().parent.parent
ENGINE = "265c64c"
STATES_BEFORE = {"E0001": "done", "E0002": "dead", "E0003": "done", "E0004": "leased",
                 "E0005": "ready"}


# The committed files' scenario, without its last lines (they tidy a SQLite file's -wal).
SCRIPT = V1_STORY.split("import sqlite3")[0]
assert "queue.enqueue_jsonl(" in SCRIPT and "sqlite3" not in SCRIPT


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    previous_engine.require_history()
    return previous_engine.export(ENGINE, tmp_path_factory.mktemp("engines"))


@pytest.fixture
def schema1(engine: Path, pg_dsn: str) -> str:
    """A fresh schema holding the queue the earlier engine wrote."""
    previous_engine.run(engine, SCRIPT, pg_dsn)
    return pg_dsn


def cli(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "queue_core", "--db", dsn, *args],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)


def schema_state(dsn: str) -> dict[str, Any]:
    """Everything in the queue's schema: each table's rows, its columns, constraints
    and indexes, so that "changed nothing" can be compared exactly."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        tables = [row[0] for row in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() "
            "ORDER BY tablename")]
        state: dict[str, Any] = {"tables": tables}
        for table in tables:
            state[table] = sorted(map(repr, conn.execute(f"SELECT * FROM {table}")))
        state["columns"] = conn.execute(
            "SELECT table_name, column_name, data_type, is_nullable FROM "
            "information_schema.columns WHERE table_schema = current_schema() "
            "ORDER BY 1, 2").fetchall()
        state["constraints"] = conn.execute(
            "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) FROM "
            "pg_constraint WHERE connamespace = current_schema()::regnamespace "
            "ORDER BY 1, 2").fetchall()
        state["indexes"] = conn.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = current_schema() "
            "ORDER BY 1").fetchall()
        state["functions"] = conn.execute(
            "SELECT proname, pg_get_functiondef(oid) FROM pg_proc "
            "WHERE pronamespace = current_schema()::regnamespace ORDER BY 1").fetchall()
    return state


def test_the_earlier_engines_schema_is_read_as_it_is_and_every_write_is_refused(
        schema1: str, tmp_path: Path) -> None:
    before = schema_state(schema1)
    assert {"messages_ready", "messages_leased"} <= {name for name, _ in before["indexes"]}
    for reading in (["status"], ["status", "--json"], ["metrics"], ["--now", "1020", "metrics"]):
        done = cli(schema1, *reading)
        assert done.returncode == 0, (reading, done.stderr)
    status = json.loads(cli(schema1, "status", "--json").stdout)
    assert status["states"] == {"ready": 1, "leased": 1, "done": 2, "dead": 1}
    assert status["total"] == 15000 and status["pruned"] == 0
    snap = audit.snapshot(schema1)
    assert snap.version == 1 and audit.check(snap) == [] and snap.states() == STATES_BEFORE
    assert schema_state(schema1) == before
    batch = tmp_path / "batch.jsonl"
    batch.write_text('{"event_id": "E0009", "payload": {"category": "pen", "amount_cents": 1}}\n')
    for writing in (["enqueue", str(batch)], ["--now", "2000", "work"], ["redrive", "E0002"],
                    ["--now", "2000", "prune", "--older-than", "0"]):
        done = cli(schema1, *writing)
        assert done.returncode == 1, (writing, done.stdout, done.stderr)
        assert done.stderr.startswith("error: schema_too_old: "), done.stderr
        assert "has queue schema version 1;" in done.stderr
        assert "run `queue-core migrate` first" in done.stderr and done.stdout == ""
        assert schema_state(schema1) == before


def test_migrate_upgrades_the_schema_once_keeping_every_fact(schema1: str) -> None:
    before = audit.snapshot(schema1)
    done = cli(schema1, "migrate")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[:6] == ["schema 1 -> 2: 5 messages rewritten",
                         "schema 2 -> 3: 0 messages rewritten",
                         "schema 3 -> 4: 0 messages rewritten",
                         "schema 4 -> 5: 0 messages rewritten",
                         "schema 5 -> 6: 0 messages rewritten",
                         "schema 6 -> 7: 0 messages rewritten"] and len(lines) == 7
    assert lines[6].endswith(" migrated from schema version 1 to 7"), lines
    after = audit.snapshot(schema1)
    assert after.version == SCHEMA_VERSION == 7 and audit.check(after) == []
    assert after.messages == before.messages and after.journal == before.journal
    assert after.effect_rows == before.effect_rows and after.status == before.status
    assert {event_id: digest.hex() for event_id, digest in after.digests.items()} == {
        event_id: hashlib.sha256(message.payload.encode()).hexdigest()
        for event_id, message in before.messages.items()}
    with psycopg.connect(schema1, autocommit=True) as conn:
        finished = dict(conn.execute("SELECT event_id, finished_at FROM messages "
                                     "WHERE finished_at IS NOT NULL").fetchall())
        indexes = sorted(row[0] for row in conn.execute(
            "SELECT indexname FROM pg_indexes WHERE schemaname = current_schema() "
            "AND tablename = 'messages'"))
    done_at = {step.event_id: step.at for step in before.journal if step.to_state == "done"}
    assert finished == done_at == {"E0001": 1000, "E0003": 1010}  # from the journal
    assert indexes == ["messages_leased", "messages_live", "messages_pkey"]
    assert [name for name, _ in schema_state(schema1)["functions"]] == ["queue_core_step"]
    settled = schema_state(schema1)
    again = cli(schema1, "migrate")
    assert again.returncode == 0, again.stderr
    assert again.stdout.endswith(f" is already at schema version {SCHEMA_VERSION}: "
                                 "nothing to do\n")
    assert schema_state(schema1) == settled
    # The migrated queue works on: the expired lease recovered, both messages done once.
    work = cli(schema1, "--now", "2000", "work")
    assert work.returncode == 0, work.stderr
    snap = audit.snapshot(schema1)
    assert audit.check(snap) == [] and snap.states() == {**STATES_BEFORE, "E0004": "done",
                                                          "E0005": "done"}
    assert snap.money == 17700 and snap.messages["E0004"].generation == 2


def _layout(dsn: str) -> dict[str, Any]:
    """The schema's tables as sets: columns (type, nullable), constraints, indexes."""
    state, here = schema_state(dsn), f" ON {pg.schema_of(dsn)}."
    schema = f" {pg.schema_of(dsn)}."
    return {"tables": state["tables"], "columns": set(state["columns"]),
            "constraints": set(state["constraints"]),
            "indexes": {(name, sql.replace(here, " ON ")) for name, sql in state["indexes"]},
            "functions": {(name, sql.replace(schema, " ")) for name, sql in state["functions"]}}


def test_a_migrated_schema_is_laid_out_as_a_new_one(schema1: str, pg_server: str) -> None:
    """Column for column, constraint for constraint, index for index (the order
    of the columns aside: ALTER TABLE appends them)."""
    assert migrate(schema1).to_version == SCHEMA_VERSION
    for fresh in pg.fresh_schema(pg_server):
        Queue(fresh, clock=ModelClock(1000))  # creates the current schema
        assert _layout(schema1) == _layout(fresh)
        assert [name for name, _ in _layout(fresh)["functions"]] == ["queue_core_step"]


def test_the_earlier_engine_refuses_a_migrated_schema_and_changes_nothing(
        schema1: str, engine: Path, tmp_path: Path) -> None:
    assert cli(schema1, "migrate").returncode == 0
    batch = tmp_path / "batch.jsonl"
    batch.write_text('{"event_id": "E0009", "payload": {"category": "pen", "amount_cents": 1}}\n')
    before = schema_state(schema1)
    for command in (["status"], ["--now", "2000", "work"], ["enqueue", str(batch)],
                    ["redrive", "E0002"]):
        done = previous_engine.cli(engine, "--db", schema1, *command)
        assert done.returncode == 1, (command, done.stdout, done.stderr)
        # That engine's words for a PostgreSQL schema (its file message adds "upgrade it").
        assert done.stderr == ("error: schema_too_new: postgresql://local socket/postgres has "
                               f"queue schema version {SCHEMA_VERSION}; this version of "
                               "queue_core knows 1\n")
        assert schema_state(schema1) == before


def test_a_running_worker_of_the_earlier_engine_is_refused_loudly_or_stays_correct(
        schema1: str, engine: Path) -> None:
    def migrate_now() -> None:  # the worker's session opened, and claimed, before it
        assert migrate(schema1).steps == BOTH_STEPS  # the worker's session is idle: no wait

    said = {line["step"]: line for line in worker_said(engine, schema1, migrate_now)}
    assert said["claim"]["ok"] == ("Lease(event_id='E0005', generation=1, attempt=1, "
                                   "lease_until=1050)")
    assert said["ACK"]["error"] == "CheckViolation", said["ACK"]
    assert "finished_at_iff_done" in said["ACK"]["text"]
    assert said["enqueue E0009"]["error"] == "NotNullViolation", said["enqueue E0009"]
    assert "payload_sha256" in said["enqueue E0009"]["text"]
    # After a refused statement that release's session may stay in its aborted
    # transaction (its pipeline was not always left on an error: a bug this release
    # fixed), so its next calls are refused too: loudly, and writing nothing. Where
    # its session recovered, they are still correct.
    stuck = {"error": "InFailedSqlTransaction",
             "text": "current transaction is aborted, commands ignored until end of "
                     "transaction block"}
    for step, ok in (("replay E0001", "EnqueueResult(inserted=0, duplicates=1)"),
                     ("fail", "Outcome(event_id='E0005', kind='retry'")):
        got = said[step]
        assert got.get("ok", "").startswith(ok) or {k: got.get(k) for k in stuck} == stuck, \
            said
    failed = said["fail"].get("ok") is not None
    snap = audit.snapshot(schema1)
    assert audit.check(snap) == [] and "E0009" not in snap.messages
    assert snap.states() == {**STATES_BEFORE, "E0005": "ready" if failed else "leased"}
    assert snap.money == 15000
    drain(Queue(schema1, clock=ModelClock(2000)), Handler())
    snap = audit.snapshot(schema1)
    assert audit.check(snap) == [] and snap.money == 17700
    assert snap.states() == {**STATES_BEFORE, "E0004": "done", "E0005": "done"}


def test_a_session_holding_a_lock_on_messages_blocks_migrate_which_changes_nothing(
        schema1: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(postgres.store, "MIGRATION_LOCK_TIMEOUT", "300ms")
    before = schema_state(schema1)
    with psycopg.connect(schema1) as holder:  # a worker stalled inside its transaction
        holder.execute("SELECT state FROM messages WHERE event_id = 'E0005' FOR UPDATE")
        with pytest.raises(UnusableFile) as blocked:
            migrate(schema1)
        assert blocked.value.code == "migration_blocked"
        assert "waited 300ms" in str(blocked.value) and "nothing was changed" in str(blocked.value)
        holder.rollback()
    assert schema_state(schema1) == before
    snap = audit.snapshot(schema1)
    assert snap.version == 1 and audit.check(snap) == []
    assert migrate(schema1).steps == BOTH_STEPS  # the holder is gone
    snap = audit.snapshot(schema1)
    assert snap.version == SCHEMA_VERSION and audit.check(snap) == []
    assert snap.states() == STATES_BEFORE


def test_the_cli_says_migration_blocked_in_one_line(schema1: str) -> None:
    with psycopg.connect(schema1) as holder:
        holder.execute("LOCK TABLE messages IN ACCESS SHARE MODE")
        done = subprocess.run([sys.executable, "-c", textwrap.dedent("""
            import sys
            from queue_core import cli
            from queue_core.postgres import store
            store.MIGRATION_LOCK_TIMEOUT = "200ms"
            raise SystemExit(cli.main(["--db", sys.argv[1], "migrate"]))
            """), schema1], capture_output=True, text=True, timeout=60, cwd=ROOT)
        holder.rollback()
    assert done.returncode == 1 and done.stdout == "", (done.stdout, done.stderr)
    assert done.stderr.startswith("error: migration_blocked: ") and done.stderr.count("\n") == 1
    assert audit.snapshot(schema1).version == 1


def _waiting_for_the_advisory_lock(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return int(conn.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                                "AND NOT granted AND objid = %s",
                                (APPLICATION_ID & 0xFFFFFFFF,)).fetchone()[0])


def test_two_migrators_started_at_once_apply_the_step_once(schema1: str) -> None:
    with psycopg.connect(schema1, autocommit=True) as holder:
        # Both migrators wait behind this session for the lock every step takes.
        holder.execute("SELECT pg_advisory_lock(%s)", (APPLICATION_ID,))
        runs = [subprocess.Popen([sys.executable, "-m", "queue_core", "--db", schema1, "migrate"],
                                 cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True) for _ in range(2)]
        try:
            for _ in range(600):  # until both wait (each within its 5 s lock timeout)
                if _waiting_for_the_advisory_lock(schema1) == 2:
                    break
                time.sleep(0.01)
            assert _waiting_for_the_advisory_lock(schema1) == 2
        finally:
            holder.execute("SELECT pg_advisory_unlock(%s)", (APPLICATION_ID,))
        outputs = sorted(run.communicate(timeout=120)[0] for run in runs)
    assert [run.returncode for run in runs] == [0, 0], outputs
    # Each step applied once, by one of them: the first to hold the lock applies 1 -> 2;
    # each later step by whichever holds it next (the other, waiting since, may be first there).
    said = [line for out in outputs for line in out.splitlines()]
    assert sorted(line for line in said if line.startswith("schema ")) == [
        "schema 1 -> 2: 5 messages rewritten", "schema 2 -> 3: 0 messages rewritten",
        "schema 3 -> 4: 0 messages rewritten", "schema 4 -> 5: 0 messages rewritten",
        "schema 5 -> 6: 0 messages rewritten", "schema 6 -> 7: 0 messages rewritten"], outputs
    assert all(out.rstrip().endswith((" migrated from schema version 1 to 7",
                                      " is already at schema version 7: nothing to do"))
               for out in outputs), outputs
    snap = audit.snapshot(schema1)
    assert snap.version == SCHEMA_VERSION and audit.check(snap) == []
    assert snap.states() == STATES_BEFORE


MIGRATION_POINTS = [point for point in LIFETIME_POINTS if point.startswith("migrate.")]


@pytest.mark.parametrize("point", MIGRATION_POINTS)
def test_a_migration_killed_at_each_point_leaves_version_1_intact_or_version_2_complete(
        point: str, schema1: str) -> None:
    before = audit.snapshot(schema1)
    child = migrate_killed_at(schema1, point)
    assert child.returncode == CRASH_EXIT_CODE, child.stderr
    snap = audit.snapshot(schema1)
    assert audit.check(snap) == [] and snap.version == (2 if point == "migrate.after_commit" else 1)
    assert snap.messages == before.messages and snap.money == 15000
    assert migrate(schema1).to_version == SCHEMA_VERSION and audit.findings(schema1) == []


# An earlier-engine worker that keeps claiming and releasing (both of which schema
# 2 still accepts) while a 10,000-message schema is migrated beside it; it notes the
# wall-clock time each of its transactions ended, and stops when told.
TIMED_WORKER = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    from queue_core import ModelClock, Queue
    queue = Queue(sys.argv[1], clock=ModelClock(1000), lease_seconds=30)
    stop, ends, refused = Path(sys.argv[2]), [], []
    with queue.session():
        while not stop.exists():
            try:
                lease = queue.claim()
                ends.append(time.time())
                queue.release(lease)  # ready again at once: the next claim takes it again
                ends.append(time.time())
            except Exception as exc:
                refused.append(type(exc).__name__)
            if len(ends) == 400:
                print("warm", flush=True)
    print(json.dumps({"ends": ends, "refused": refused}), flush=True)
""")


def _journal_rows(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return int(conn.execute("SELECT count(*) FROM transitions").fetchone()[0])


def test_how_long_migrating_10000_messages_blocks_a_running_worker(
        engine: Path, pg_dsn: str, tmp_path: Path) -> None:
    """Prints the figures (for the closing note); asserts only what is exact."""
    batch = tmp_path / "batch.jsonl"
    batch.write_text("".join(f'{{"event_id": "E{n:04d}", "payload": {{"category": "book", '
                             f'"amount_cents": {n + 1}}}}}\n' for n in range(10_000)))
    previous_engine.run(engine, textwrap.dedent("""
        import sys
        from queue_core import Handler, ModelClock, Queue
        queue = Queue(sys.argv[1], clock=ModelClock(900), lease_seconds=30)
        lines = open(sys.argv[2]).read().splitlines(keepends=True)
        for start in range(0, len(lines), 1000):  # a batch holds at most 1000 lines
            queue.enqueue_jsonl("".join(lines[start:start + 1000]))
        for _ in range(1000):  # a tenth done, so the step has finish times to find
            queue.complete(queue.claim(), Handler())
        """), pg_dsn, str(batch), timeout=300)
    stop = tmp_path / "stop"
    worker = subprocess.Popen([sys.executable, "-c", TIMED_WORKER, pg_dsn, str(stop)],
                              env={**previous_engine.os.environ, "PYTHONPATH": str(engine)},
                              cwd=engine, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    try:
        assert worker.stdout is not None
        assert worker.stdout.readline() == "warm\n"  # 400 transactions at its own pace
        began = time.time()
        done = migrate(pg_dsn)
        ended = time.time()
        after = _journal_rows(pg_dsn)
        while _journal_rows(pg_dsn) < after + 400:  # it goes on under schema 2
            time.sleep(0.01)
        stop.touch()
        out, err = worker.communicate(timeout=120)
    finally:
        worker.kill()
    assert worker.returncode == 0, err
    assert done.steps == ((1, 10_000), (2, 0), (3, 0), (4, 0), (5, 0), (6, 0))
    said = json.loads(out.splitlines()[-1])
    assert said["refused"] == []  # claims and releases stay correct under schema 2
    ends = said["ends"]
    alone = sorted(b - a for a, b in zip(ends, ends[1:]) if b < began)
    across = [b - a for a, b in zip(ends, ends[1:]) if b >= began and a <= ended]
    print(f"\nPostgreSQL migrate of 10,000 messages (1,000 done): {ended - began:.3f} s; the "
          f"earlier engine's worker beside it: {len(ends)} transactions, median "
          f"{alone[len(alone) // 2] * 1000:.2f} ms apart before it, longest gap across the "
          f"migration {max(across) * 1000:.0f} ms")
    snap = audit.snapshot(pg_dsn)
    assert snap.version == SCHEMA_VERSION and audit.check(snap) == []
    assert sum(m.state == "done" for m in snap.messages.values()) == 1000
    assert snap.money == sum(range(1, 1001))


NON_ASCII = ('{"event_id": "E0007", "payload": {"category": "book", "amount_cents": 1234, '
             '"title": "Café ☕ 東京"}}\n')
REORDERED = ('{"event_id": "E0007", "payload": {"title": "Café ☕ 東京", "amount_cents": 1234, '
             '"category": "book"}}\n')


def test_a_migrated_digest_is_the_engines_own_so_a_pruned_replay_is_still_a_duplicate(
        schema1: str, engine: Path, tmp_path: Path) -> None:
    """The step computes each digest in SQL; a replay of a pruned event is judged by
    it, so it must be the SHA-256 the engine computes, non-ASCII text included."""
    previous_engine.run(engine, textwrap.dedent("""
        import sys
        from queue_core import Handler, ModelClock, Queue
        queue = Queue(sys.argv[1], clock=ModelClock(1030), lease_seconds=30)
        queue.enqueue_jsonl(sys.argv[2])
        leases = queue.claim_batch(2)  # E0005 and E0007 (E0004's lease ends at 1037)
        assert sorted(lease.event_id for lease in leases) == ["E0005", "E0007"], leases
        for lease in leases:
            queue.complete(lease, Handler())
        """), schema1, NON_ASCII)
    assert migrate(schema1).steps == ((1, 6), (2, 0), (3, 0), (4, 0), (5, 0), (6, 0))
    snap = audit.snapshot(schema1)
    assert {e: d.hex() for e, d in snap.digests.items()} == {
        e: hashlib.sha256(m.payload.encode("utf-8")).hexdigest() for e, m in snap.messages.items()}
    queue = Queue(schema1, clock=ModelClock(5000))
    queue.enqueue_jsonl('{"event_id": "E0008", "payload": {"category": "pen", '
                        '"amount_cents": 1}}\n')  # owns the journal's last row
    assert queue.prune(0).messages == 4  # E0001, E0003, E0005, E0007
    snap = audit.snapshot(schema1)
    assert audit.check(snap) == [] and snap.messages["E0007"].payload is None
    money = snap.money
    for replay in (NON_ASCII, REORDERED):  # the same canonical payload
        same = queue.enqueue_jsonl(replay)
        assert (same.inserted, same.duplicates) == (0, 1)
    with pytest.raises(BatchRejected) as refused:
        queue.enqueue_jsonl(NON_ASCII.replace("東京", "京都"))
    assert refused.value.code == "batch_conflict"
    assert audit.snapshot(schema1).money == money == 15000 + 700 + 1234


def test_a_step_longer_than_a_workers_transaction_limit_still_completes(
        schema1: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every session ends a transaction older than ``transaction_timeout`` (17 and
    later); a migration step rewrites every message and may take longer, so it
    lifts that limit for its own transaction. A step made slower than the limit
    completes, and the queue is of the current version."""
    with psycopg.connect(schema1) as conn:
        if conn.info.server_version < postgres.session.TRANSACTION_TIMEOUT_SINCE:
            pytest.skip("this server has no transaction_timeout (PostgreSQL 16 and older)")
    monkeypatch.setattr(postgres.store, "TRANSACTION_TIMEOUT_MS", 300)
    monkeypatch.setitem(postgres.POSTGRES_STEPS, 1,
                        ("SELECT pg_sleep(0.8)", *postgres.POSTGRES_STEPS[1]))
    assert migrate(schema1).steps == BOTH_STEPS
    snap = audit.snapshot(schema1)
    assert snap.version == SCHEMA_VERSION and audit.check(snap) == [] and snap.money == 15000
