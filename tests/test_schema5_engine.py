"""Queues written by the release before priorities, tested with its own code.

The engine of 11541ae writes SQLite's schema 3 and PostgreSQL's schema 5, and
claims in ``available_at`` order. The step to SQLite's 4 and PostgreSQL's 6
adds each message's priority (0 for every message it finds: no row is
rewritten) and builds the live index in the claim's order; on PostgreSQL it
also replaces the step's function, which the step to 7 then replaces again
(its claim's constant LIMIT: ``test_schema6_engine``). On each store, for a
course queue and a general one: a queue of that version is refused for
writes until ``migrate``, which keeps every fact; a second run changes
nothing; the step is crash-swept at its four points; that engine refuses the
migrated queue when it opens it; a SQLite worker of that engine running
across the step is refused at its next transaction, and a PostgreSQL one
goes on (its own claim in its old order, its step through the new function)
with the money exact.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import psycopg
import pytest

import pg
import previous_engine
from queue_core import CRASH_EXIT_CODE, Handler, ModelClock, Queue, audit, drain, migrate
from queue_core import postgres, sqlite
from queue_core.lab.lifetime.earlier import AFTER_MIGRATION, V1_STORY, worker_said
from queue_core.lab.lifetime.migration import migrate_killed_at

ROOT = Path(__file__).resolve().parent.parent
ENGINE = previous_engine.SCHEMA5_ENGINE
OLD = {"sqlite": 3, "postgres": 5}
STEP = {"sqlite": 4, "postgres": 6}  # the priority's step; PostgreSQL's 7 follows
NEW = {"sqlite": sqlite.SCHEMA_VERSION, "postgres": postgres.SCHEMA_VERSION}
STEPS = {"sqlite": ((3, 0),), "postgres": ((5, 0), (6, 0))}  # what ``migrate`` applies
MIGRATION_POINTS = ("migrate.after_begin", "migrate.after_copy", "migrate.before_commit",
                    "migrate.after_commit")
STORY = V1_STORY.split("import sqlite3")[0]  # every state, 15000 of money
STATES_BEFORE = {"E0001": "done", "E0002": "dead", "E0003": "done", "E0004": "leased",
                 "E0005": "ready"}
TABLES = ("messages", "effects", "transitions")


def story(ids: str) -> str:
    """``STORY`` for a queue of the rule ``ids``."""
    return previous_engine.story_of(STORY, ids)


named = previous_engine.named


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    previous_engine.require_history()
    return previous_engine.export(ENGINE, tmp_path_factory.mktemp("engines"))


def write(engine: Path, store: str, ids: str, tmp_path: Path,
          request: pytest.FixtureRequest) -> str:
    target = (str(tmp_path / "queue.sqlite3") if store == "sqlite"
              else str(request.getfixturevalue("pg_dsn")))
    done = previous_engine.run(engine, story(ids), target)
    assert done.returncode == 0, done.stderr
    snap = audit.snapshot(target)
    assert snap.version == OLD[store] and audit.check(snap) == [] and snap.money == 15000
    assert snap.states() == {named(ids, e): state for e, state in STATES_BEFORE.items()}
    return target


@pytest.fixture(params=[("sqlite", "course"), ("sqlite", "general"), ("postgres", "course"),
                        ("postgres", "general")], ids=lambda p: "-".join(p))
def written(request: pytest.FixtureRequest, engine: Path, tmp_path: Path
            ) -> tuple[str, str, str]:
    """(store, ids, target): a queue that engine wrote, every state in it."""
    store, ids = request.param
    return store, ids, write(engine, store, ids, tmp_path, request)


@pytest.fixture(params=["sqlite", "postgres"])
def course(request: pytest.FixtureRequest, engine: Path, tmp_path: Path) -> tuple[str, str]:
    """(store, target): a course queue that engine wrote."""
    return request.param, write(engine, request.param, "course", tmp_path, request)


def cli(db: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "queue_core", "--db", db, *args],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)


def sql(target: str, statement: str) -> list[tuple[Any, ...]]:
    if target.startswith("postgresql://"):
        with psycopg.connect(target, autocommit=True) as conn:
            return conn.execute(statement).fetchall()
    conn = sqlite.connect_readonly(target)
    try:
        return conn.execute(statement).fetchall()
    finally:
        conn.close()


def columns(target: str, table: str) -> list[str]:
    if target.startswith("postgresql://"):
        return [row[0] for row in sql(target, "SELECT column_name FROM information_schema.columns "
                                              f"WHERE table_schema = current_schema() AND "
                                              f"table_name = '{table}' ORDER BY ordinal_position")]
    return [row[1] for row in sql(target, f"PRAGMA table_info({table})")]


def stored_rows(target: str, kept: dict[str, list[str]]) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of the three tables, in the columns ``kept`` names, each with where it
    lies (PostgreSQL's ``ctid``; SQLite's ``rowid``, where the table has one): a row
    rewritten would move."""
    def where(table: str) -> str:
        if target.startswith("postgresql://"):
            return "ctid::text"
        [(text,)] = sql(target, f"SELECT sql FROM sqlite_master WHERE name = '{table}'")
        return "NULL" if "WITHOUT ROWID" in text.upper() else "rowid"

    return {table: sql(target, f"SELECT {where(table)}, {', '.join(kept[table])} "
                               f"FROM {table} ORDER BY 2, 1") for table in TABLES}


def layout(target: str) -> Any:
    """The queue's schema as text: SQLite's ``sqlite_master`` (each run of white space
    as one space: SQLite writes a column that ``ADD COLUMN`` appends on the line of
    the one before it), or PostgreSQL's columns, constraints, indexes and functions,
    its schema's name left out, and each table's storage parameters (``pg.layout``)."""
    if not target.startswith("postgresql://"):
        return sorted((kind, name, None if text is None else re.sub(r"\s+", " ", text))
                      for kind, name, text in sql(target, "SELECT type, name, sql FROM "
                                                          "sqlite_master"))
    return pg.layout(target)


@pytest.fixture
def new_layout(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """What a new queue of this engine looks like, on the store of the test's queue."""
    def of(store: str, ids: str) -> Any:
        if store == "sqlite":
            (tmp_path / "new").mkdir(exist_ok=True)
            target = str(tmp_path / "new" / f"{ids}.sqlite3")
            Queue(target, ids=ids).status()
            return layout(target)
        for fresh in pg.fresh_schema(request.getfixturevalue("pg_server")):
            Queue(fresh, ids=ids).status()
            found = layout(fresh)
        return found
    yield of


def everything(target: str) -> Any:
    """The queue as it lies: its layout, its version, every row of every column."""
    kept = {table: columns(target, table) for table in TABLES}
    return layout(target), audit.snapshot(target).version, stored_rows(target, kept)


def folder_bytes(target: str) -> dict[str, str]:
    folder = Path(target).parent
    return {path.name: hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(folder.iterdir()) if path.is_file()}


def test_that_engines_queue_is_refused_for_writes_then_migrated_keeping_every_message(
        engine: Path, written: tuple[str, str, str], new_layout: Any) -> None:
    store, ids, db = written
    before = audit.snapshot(db)
    kept = {table: columns(db, table) for table in TABLES}
    assert "priority" not in kept["messages"]
    rows = stored_rows(db, kept)
    work = cli(db, "--now", "1020", "work")
    assert work.returncode == 1 and work.stdout == ""
    assert work.stderr.startswith("error: schema_too_old: ")
    assert f"schema version {OLD[store]};" in work.stderr

    done = cli(db, "migrate")

    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[:-1] == [f"schema {version} -> {version + 1}: 0 messages rewritten"
                          for version, _ in STEPS[store]], lines
    assert lines[-1].endswith(f" migrated from schema version {OLD[store]} to {NEW[store]}")
    after = audit.snapshot(db)
    assert after.version == NEW[store] and audit.check(after) == [] and after.money == 15000
    # every message keeps its state, generation, attempts, payload... and has priority 0
    assert after.messages == before.messages
    assert {m.priority for m in after.messages.values()} == {0}
    assert sql(db, "SELECT event_id, priority FROM messages ORDER BY event_id") == [
        (event_id, 0) for event_id in sorted(before.messages)]
    assert (after.journal, after.effect_rows, after.digests, after.status) == (
        before.journal, before.effect_rows, before.digests, before.status)
    assert stored_rows(db, kept) == rows  # no row rewritten, nor moved
    assert layout(db) == new_layout(store, ids)
    assert Queue(db).id_rule == ids and Queue(db).status().ids == ids
    settled = folder_bytes(db) if store == "sqlite" else everything(db)
    again = cli(db, "migrate")
    assert (again.returncode, again.stdout.endswith(
        f" is already at schema version {NEW[store]}: nothing to do\n")) == (0, True), again
    assert (folder_bytes(db) if store == "sqlite" else everything(db)) == settled
    # The migrated queue works on: an urgent message overtakes the backlog it found.
    queue = Queue(db, clock=ModelClock(1020))
    urgent = "E0006" if ids == "course" else "urgent-6"
    queue.enqueue_jsonl(f'{{"event_id": "{urgent}", "payload": {{"category": "pen", '
                        f'"amount_cents": 300}}}}', priority=9)
    assert [o.event_id for o in drain(queue, Handler())] == [urgent, named(ids, "E0005")]
    queue.clock.set(2000)  # E0004's lease (until 1037) has expired
    assert [o.kind for o in drain(queue, Handler())] == ["done"]
    snap = audit.snapshot(db)
    assert audit.check(snap) == [] and snap.money == 15000 + 300 + 700 + 2000
    assert snap.messages[urgent].priority == 9


def test_that_engine_refuses_the_migrated_queue_and_changes_nothing(
        engine: Path, written: tuple[str, str, str], tmp_path: Path) -> None:
    store, ids, db = written
    assert migrate(db).steps == STEPS[store]
    batch = tmp_path / "batch.jsonl"
    batch.write_text(f'{{"event_id": "{"E0009" if ids == "course" else "order-9"}", '
                     '"payload": {"category": "pen", "amount_cents": 1}}\n')
    before = folder_bytes(db) if store == "sqlite" else everything(db)
    for command in (["status"], ["--now", "2000", "work"],
                    ["enqueue", "--ids", ids, str(batch)], ["redrive", named(ids, "E0002")]):
        done = previous_engine.cli(engine, "--db", db, *command)
        if (store, ids, command[0]) == ("sqlite", "general", "redrive"):
            # that engine cannot read a newer file's id rule, checks the id against the
            # course's before it opens the file, and refuses it as input
            assert (done.returncode, done.stderr.split(":")[0]) == (2, "invalid_event_id")
        else:
            assert done.returncode == 1, (command, done.stdout, done.stderr)
            assert done.stderr.startswith("error: schema_too_new: "), done.stderr
            assert f"has queue schema version {NEW[store]};" in done.stderr
        assert (folder_bytes(db) if store == "sqlite" else everything(db)) == before


@pytest.mark.parametrize("point", MIGRATION_POINTS)
def test_the_step_killed_at_each_point_leaves_the_old_version_intact_or_the_new_complete(
        point: str, course: tuple[str, str], new_layout: Any) -> None:
    store, db = course
    before, was = audit.snapshot(db), everything(db)
    kept = {table: columns(db, table) for table in TABLES}

    child = migrate_killed_at(db, point)

    assert child.returncode == CRASH_EXIT_CODE, child.stderr
    snap = audit.snapshot(db)
    assert audit.check(snap) == [] and snap.money == 15000 and snap.messages == before.messages
    assert (snap.journal, snap.effect_rows, snap.digests) == (
        before.journal, before.effect_rows, before.digests)
    if point == "migrate.after_commit":  # the priority's step, complete
        assert snap.version == STEP[store]
        assert stored_rows(db, kept) == was[2]
        assert {m.priority for m in snap.messages.values()} == {0}
        found, new = layout(db), new_layout(store, "course")
        if store == "sqlite":  # the new version
            assert found == new
        else:  # all but the step's function and the journal's index by event, which
            # the step to 7 replaces and adds
            assert {k: v for k, v in found.items() if k not in ("functions", "indexes")} == {
                k: v for k, v in new.items() if k not in ("functions", "indexes")}
            assert new["indexes"] - found["indexes"] == {
                ("transitions_event", "CREATE INDEX transitions_event ON transitions USING "
                                      "btree (event_id)")}
            [(name, text)] = found["functions"]
            assert name == "queue_core_step" and "LIMIT p_claim" in text
            assert found["functions"] != new["functions"]
    else:  # the old version, as it was: layout, version and every row
        assert everything(db) == was
    assert migrate(db).to_version == NEW[store] and audit.findings(db) == []
    settled = everything(db)
    assert migrate(db).steps == () and everything(db) == settled
    assert layout(db) == new_layout(store, "course")


# A worker of that engine whose session opened, and claimed E0005, before the step
# commits; on PostgreSQL, the queue then holds E0010 (priority 0) and E0011 (9), both
# enqueued by this engine at 1020, and E0009, which that worker enqueues.
ACROSS = (*AFTER_MIGRATION[:3],  # ACK, enqueue E0009, replay E0001
          ("claim", "(claimed := queue.claim())"),  # its own claim: available_at order
          ("step", "(stepped := queue.complete_and_claim(claimed, Handler()))"),
          ("ACK the next", "queue.complete(stepped[1], Handler())"))
LATER = ('{"event_id": "E0010", "payload": {"category": "book", "amount_cents": 40}}',
         '{"event_id": "E0011", "payload": {"category": "bag", "amount_cents": 5}}')


def test_a_running_worker_of_that_engine_is_refused_on_sqlite_and_goes_on_on_postgresql(
        engine: Path, course: tuple[str, str]) -> None:
    store, db = course

    def step() -> None:  # that worker's session opened, and claimed, before it commits
        assert migrate(db).steps == STEPS[store]
        if store == "postgres":
            queue = Queue(db, clock=ModelClock(1020))
            queue.enqueue_jsonl(LATER[0])
            queue.enqueue_jsonl(LATER[1], priority=9)

    said = worker_said(engine, db, step, ACROSS if store == "postgres" else AFTER_MIGRATION)
    assert said[0]["ok"].startswith("Lease(event_id='E0005', generation=1")
    snap = audit.snapshot(db)
    assert audit.check(snap) == []
    if store == "sqlite":
        # each of its transactions reads the version under the write lock: refused,
        # nothing written
        assert [(s.get("error"), s.get("code")) for s in said[1:]] == [
            ("UnusableFile", "schema_too_new")] * len(AFTER_MIGRATION), said
        assert snap.money == 15000 and snap.states() == {**STATES_BEFORE, "E0005": "leased"}
        drain(Queue(db, clock=ModelClock(3000)), Handler())
        final = audit.snapshot(db)
        assert final.money == 17700 and audit.check(final) == []
        assert sorted(final.states().values()) == ["dead", "done", "done", "done", "done"]
        return
    assert [s["step"] for s in said] == ["claim", *(name for name, _ in ACROSS)]
    assert said[1]["ok"] == "Effect(category='bag', amount_cents=700)", said  # E0005's
    assert said[2]["ok"] == "EnqueueResult(inserted=1, duplicates=0)", said  # E0009
    assert said[3]["ok"] == "EnqueueResult(inserted=0, duplicates=1)", said
    # its own claim reads available_at order and passes the urgent E0011 over (a
    # priority that worker ignores, never misreads); its step calls the new function,
    # which claims in the new order: E0011 before E0010
    assert said[4].get("ok", "").startswith("Lease(event_id='E0009', generation=1"), said
    assert said[5].get("ok", "").startswith("(Effect(category='pen', amount_cents=100), "
                                            "Lease(event_id='E0011', generation=1"), said
    assert said[6].get("ok") == "Effect(category='bag', amount_cents=5)", said
    snap = audit.snapshot(db)
    assert audit.check(snap) == [] and snap.money == 15000 + 700 + 100 + 5
    assert {e: (m.state.value, m.priority) for e, m in snap.messages.items()
            if e >= "E0009"} == {"E0009": ("done", 0), "E0010": ("ready", 0),
                                 "E0011": ("done", 9)}
    outcomes = drain(Queue(db, clock=ModelClock(3000)), Handler())
    assert sorted(o.event_id for o in outcomes) == ["E0004", "E0010"]
    final = audit.snapshot(db)
    assert audit.check(final) == [] and final.money == 15000 + 700 + 100 + 5 + 40 + 2000
    assert sorted(final.states().values()) == ["dead"] + ["done"] * 7
