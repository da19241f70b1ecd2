"""Queues written by the release before PostgreSQL's schema 7, tested with its own code.

The engine of 310843c writes PostgreSQL's schema 6 and SQLite's 4, and knows
priorities. The step to PostgreSQL's 7 replaces the step's function, by one
that claims the worker's next message with a constant ``LIMIT 1`` instead of
``LIMIT p_claim`` (``postgres.step.NEXT_ONLY``), and adds the journal's index by
event, by which prune reads the messages it prunes; no row is rewritten. For
a course queue and a general one: a queue of that version is refused for
writes until ``migrate``, which keeps every fact and every row where it lies;
a second run changes nothing; the function is then a new queue's, the same
function (its oid, arguments and rows) with the constant LIMIT; that engine
refuses the migrated queue and changes nothing. The step
is crash-swept at its four points, and a worker of that engine running across
it goes on, its step calling the new function, with the money exact. SQLite
has no step here: a file that engine wrote is current, and works unmigrated.
"""

from __future__ import annotations

import hashlib
import json
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
from queue_core.postgres.step import _step_function

ROOT = Path(__file__).resolve().parent.parent
ENGINE = previous_engine.SCHEMA6_ENGINE
OLD = 6  # PostgreSQL's; that engine's SQLite files are 4, this engine's own
NEW = postgres.SCHEMA_VERSION
MIGRATION_POINTS = ("migrate.after_begin", "migrate.after_copy", "migrate.before_commit",
                    "migrate.after_commit")
# Every state, 15000 of money (``V1_STORY``), and E0006 ready at priority 7, which
# that engine writes and the step must keep.
STORY = V1_STORY.split("import sqlite3")[0] + (
    "queue.enqueue_jsonl('{\"event_id\": \"E0006\", \"payload\": {\"category\": \"bag\", "
    "\"amount_cents\": 50}}', priority=7)\n")
STATES_BEFORE = {"E0001": "done", "E0002": "dead", "E0003": "done", "E0004": "leased",
                 "E0005": "ready", "E0006": "ready"}
PRIORITIES_BEFORE = {"E0001": 0, "E0002": 0, "E0003": 0, "E0004": 0, "E0005": 0, "E0006": 7}
TABLES = ("messages", "effects", "transitions")


def story(ids: str) -> str:
    """``STORY`` for a queue of the rule ``ids``."""
    return previous_engine.story_of(STORY, ids)


named = previous_engine.named


def by_name(ids: str, facts: dict[str, Any]) -> dict[str, Any]:
    return {named(ids, event_id): fact for event_id, fact in facts.items()}


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    previous_engine.require_history()
    return previous_engine.export(ENGINE, tmp_path_factory.mktemp("engines"))


def write(engine: Path, ids: str, target: str, version: int) -> str:
    done = previous_engine.run(engine, story(ids), target)
    assert done.returncode == 0, done.stderr
    snap = audit.snapshot(target)
    assert snap.version == version and audit.check(snap) == [] and snap.money == 15000
    assert snap.states() == by_name(ids, STATES_BEFORE)
    assert {e: m.priority for e, m in snap.messages.items()} == by_name(ids, PRIORITIES_BEFORE)
    return target


@pytest.fixture(params=["course", "general"])
def written(request: pytest.FixtureRequest, engine: Path, pg_dsn: str) -> tuple[str, str]:
    """(ids, dsn): a PostgreSQL queue that engine wrote, every state in it."""
    return request.param, write(engine, request.param, pg_dsn, OLD)


@pytest.fixture
def course(engine: Path, pg_dsn: str) -> str:
    """A PostgreSQL course queue that engine wrote."""
    return write(engine, "course", pg_dsn, OLD)


def cli(db: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "queue_core", "--db", db, *args],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)


def sql(dsn: str, statement: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(statement).fetchall()


def columns(dsn: str, table: str) -> list[str]:
    return [row[0] for row in sql(dsn, "SELECT column_name FROM information_schema.columns "
                                       "WHERE table_schema = current_schema() AND "
                                       f"table_name = '{table}' ORDER BY ordinal_position")]


def stored_rows(dsn: str, kept: dict[str, list[str]]) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of the three tables, in the columns ``kept`` names, each with where it
    lies (its ``ctid``): a row rewritten would move."""
    return {table: sql(dsn, f"SELECT ctid::text, {', '.join(kept[table])} "
                            f"FROM {table} ORDER BY 2, 1") for table in TABLES}


@pytest.fixture
def new_layout(pg_server: str) -> Iterator[Any]:
    """What a new PostgreSQL queue of this engine looks like, for the rule ``ids``."""
    def of(ids: str) -> Any:
        for fresh in pg.fresh_schema(pg_server):
            Queue(fresh, ids=ids).status()
            found = pg.layout(fresh)
        return found
    yield of


def everything(dsn: str) -> Any:
    """The queue as it lies: its layout, its version, every row of every column."""
    kept = {table: columns(dsn, table) for table in TABLES}
    return pg.layout(dsn), audit.snapshot(dsn).version, stored_rows(dsn, kept)


def step_function(dsn: str) -> tuple[int, str, str, str]:
    """The step's function as the server holds it: its oid (what a running worker's
    prepared call resolved), its arguments, its rows and its definition."""
    [found] = sql(dsn, "SELECT oid::bigint, pg_get_function_identity_arguments(oid), "
                       "pg_get_function_result(oid), pg_get_functiondef(oid) FROM pg_proc "
                       "WHERE proname = 'queue_core_step' "
                       "AND pronamespace = current_schema()::regnamespace")
    return found


def limits(definition: str) -> list[str]:
    return re.findall(r"\bLIMIT \w+", definition)


def body(version: int) -> str:
    """The function's source as ``postgres.step`` keeps it for schema ``version``."""
    return _step_function(version).split("$step$")[1]


def folder_bytes(target: str) -> dict[str, str]:
    folder = Path(target).parent
    return {path.name: hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(folder.iterdir()) if path.is_file()}


def test_that_engines_queue_is_refused_for_writes_then_migrated_keeping_every_row_in_place(
        engine: Path, written: tuple[str, str], new_layout: Any) -> None:
    ids, db = written
    before, was = audit.snapshot(db), everything(db)
    kept = {table: columns(db, table) for table in TABLES}
    work = cli(db, "--now", "1020", "work")
    assert work.returncode == 1 and work.stdout == ""
    assert work.stderr.startswith("error: schema_too_old: ")
    assert f"schema version {OLD};" in work.stderr
    assert f"writes version {NEW}: run `queue-core migrate` first" in work.stderr
    assert everything(db) == was  # refused: nothing written

    done = cli(db, "migrate")

    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "schema 6 -> 7: 0 messages rewritten" and len(lines) == 2, lines
    assert lines[1].endswith(f" migrated from schema version {OLD} to {NEW}")
    after = audit.snapshot(db)
    assert after.version == NEW == 7 and audit.check(after) == [] and after.money == 15000
    # every message keeps its state, generation, attempts, payload and priority
    assert after.messages == before.messages
    assert {e: m.priority for e, m in after.messages.items()} == by_name(ids, PRIORITIES_BEFORE)
    assert (after.journal, after.effect_rows, after.digests, after.status) == (
        before.journal, before.effect_rows, before.digests, before.status)
    assert stored_rows(db, kept) == was[2]  # no row rewritten, nor moved
    assert pg.layout(db) == new_layout(ids)
    # the function replaced, and the journal's index by event added; nothing else
    assert {k: v for k, v in pg.layout(db).items() if k not in ("functions", "indexes")} == {
        k: v for k, v in was[0].items() if k not in ("functions", "indexes")}
    assert pg.layout(db)["indexes"] - was[0]["indexes"] == {
        ("transitions_event", "CREATE INDEX transitions_event ON transitions USING btree "
                              "(event_id)")} and was[0]["indexes"] < pg.layout(db)["indexes"]
    assert Queue(db).id_rule == ids and Queue(db).status().ids == ids
    settled = everything(db)
    again = cli(db, "migrate")
    assert (again.returncode, again.stdout.endswith(
        f" is already at schema version {NEW}: nothing to do\n")) == (0, True), again
    assert everything(db) == settled
    # The migrated queue works on, in the claim's order: an urgent message first, then
    # the priority 7 that engine wrote, then the rest; each counted once.
    queue = Queue(db, clock=ModelClock(1020))
    urgent = "E0007" if ids == "course" else "urgent-7"
    queue.enqueue_jsonl(f'{{"event_id": "{urgent}", "payload": {{"category": "pen", '
                        f'"amount_cents": 300}}}}', priority=9)
    assert [o.event_id for o in drain(queue, Handler())] == [
        urgent, named(ids, "E0006"), named(ids, "E0005")]
    queue.clock.set(2000)  # E0004's lease (until 1037) has expired
    assert [(o.event_id, o.kind) for o in drain(queue, Handler())] == [
        (named(ids, "E0004"), "done")]
    snap = audit.snapshot(db)
    assert audit.check(snap) == [] and snap.money == 15000 + 300 + 50 + 700 + 2000
    assert snap.states() == {**by_name(ids, {**STATES_BEFORE, "E0004": "done",
                                             "E0005": "done", "E0006": "done"}),
                             urgent: "done"}
    assert snap.messages[urgent].priority == 9


def test_the_migrated_step_claims_its_next_message_with_a_constant_limit_as_a_new_queues(
        written: tuple[str, str], new_layout: Any) -> None:
    ids, db = written
    oid, arguments, result, definition = step_function(db)
    assert limits(definition) == ["LIMIT p_claim"]
    assert body(OLD) in definition  # that engine's text, as ``postgres.step`` keeps it

    assert migrate(db).steps == ((OLD, 0),)

    *same, migrated = step_function(db)
    assert limits(migrated) == ["LIMIT 1"] and "LIMIT p_claim" not in migrated
    assert body(NEW) in migrated  # this engine's text, as a new queue gets it
    assert body(NEW).replace(" LIMIT 1", " LIMIT p_claim", 1) == body(OLD)  # nothing else
    # the same function, called as before and answering the same rows: a running worker's
    # prepared call goes on naming it
    assert same == [oid, arguments, result]
    assert pg.layout(db)["functions"] == new_layout(ids)["functions"]


def test_that_engine_refuses_the_migrated_queue_and_changes_nothing(
        engine: Path, written: tuple[str, str], tmp_path: Path) -> None:
    ids, db = written
    assert migrate(db).steps == ((OLD, 0),)
    batch = tmp_path / "batch.jsonl"
    batch.write_text(f'{{"event_id": "{"E0009" if ids == "course" else "order-9"}", '
                     '"payload": {"category": "pen", "amount_cents": 1}}\n')
    before = everything(db)
    for command in (["status"], ["--now", "2000", "work"],
                    ["enqueue", "--ids", ids, str(batch)], ["redrive", named(ids, "E0002")]):
        done = previous_engine.cli(engine, "--db", db, *command)
        assert done.returncode == 1, (command, done.stdout, done.stderr)
        assert done.stderr.startswith("error: schema_too_new: "), done.stderr
        assert f"has queue schema version {NEW};" in done.stderr
        assert everything(db) == before
    snap = audit.snapshot(db)
    assert audit.check(snap) == [] and snap.money == 15000
    assert snap.states() == by_name(ids, STATES_BEFORE)


@pytest.mark.parametrize("point", MIGRATION_POINTS)
def test_the_step_killed_at_each_point_leaves_version_6_intact_or_version_7_complete(
        point: str, course: str, new_layout: Any) -> None:
    db = course
    before, was = audit.snapshot(db), everything(db)
    kept = {table: columns(db, table) for table in TABLES}

    child = migrate_killed_at(db, point)

    assert child.returncode == CRASH_EXIT_CODE, child.stderr
    snap = audit.snapshot(db)
    assert audit.check(snap) == [] and snap.money == 15000 and snap.messages == before.messages
    assert (snap.journal, snap.effect_rows, snap.digests, snap.status) == (
        before.journal, before.effect_rows, before.digests, before.status)
    if point == "migrate.after_commit":  # the new version, complete
        assert snap.version == NEW and pg.layout(db) == new_layout("course")
        assert stored_rows(db, kept) == was[2]
        assert limits(step_function(db)[3]) == ["LIMIT 1"]
    else:  # the old version, as it was: layout (its function), version and every row
        assert everything(db) == was
        assert snap.version == OLD and limits(step_function(db)[3]) == ["LIMIT p_claim"]
    assert migrate(db).to_version == NEW and audit.findings(db) == []
    settled = everything(db)
    assert migrate(db).steps == () and everything(db) == settled
    assert pg.layout(db) == new_layout("course") and stored_rows(db, kept) == was[2]
    # and it works on: E0006 (priority 7) first, then E0005 (due at 1010), then E0004,
    # due again when its lease ended (1037)
    outcomes = drain(Queue(db, clock=ModelClock(2000)), Handler())
    assert [(o.event_id, o.kind) for o in outcomes] == [
        ("E0006", "done"), ("E0005", "done"), ("E0004", "done")]
    final = audit.snapshot(db)
    assert audit.check(final) == [] and final.money == 15000 + 50 + 2000 + 700


# A worker of that engine whose session opened, and claimed E0006 (priority 7), before
# the step commits; the queue then holds E0010 (priority 0) and E0011 (9), both
# enqueued by this engine at 1020, and E0009, which that worker enqueues.
ACROSS = (*AFTER_MIGRATION[:3],  # ACK, enqueue E0009, replay E0001
          ("claim", "(claimed := queue.claim())"),  # its own claim, in the claim's order
          ("step", "(stepped := queue.complete_and_claim(claimed, Handler()))"),
          ("ACK the next", "queue.complete(stepped[1], Handler())"))
LATER = ('{"event_id": "E0010", "payload": {"category": "book", "amount_cents": 40}}',
         '{"event_id": "E0011", "payload": {"category": "bag", "amount_cents": 5}}')


def test_a_running_worker_of_that_engine_goes_on_across_the_step_through_the_new_function(
        engine: Path, course: str) -> None:
    db = course

    def step() -> None:  # that worker's session opened, and claimed, before it commits
        assert migrate(db).steps == ((OLD, 0),)  # the worker's session is idle: no wait
        assert limits(step_function(db)[3]) == ["LIMIT 1"]
        queue = Queue(db, clock=ModelClock(1020))
        queue.enqueue_jsonl(LATER[0])
        queue.enqueue_jsonl(LATER[1], priority=9)

    said = worker_said(engine, db, step, ACROSS)

    assert [s["step"] for s in said] == ["claim", *(name for name, _ in ACROSS)]
    assert said[0]["ok"].startswith("Lease(event_id='E0006', generation=1"), said
    assert said[1]["ok"] == "Effect(category='bag', amount_cents=50)", said  # E0006's
    assert said[2]["ok"] == "EnqueueResult(inserted=1, duplicates=0)", said  # E0009
    assert said[3]["ok"] == "EnqueueResult(inserted=0, duplicates=1)", said
    # its own claim takes the urgent E0011 first; its step ACKs it and, through the new
    # function, claims the next due message, one: E0005 (due since 1010)
    assert said[4].get("ok", "").startswith("Lease(event_id='E0011', generation=1"), said
    assert said[5].get("ok", "").startswith("(Effect(category='bag', amount_cents=5), "
                                            "Lease(event_id='E0005', generation=1"), said
    assert said[6].get("ok") == "Effect(category='bag', amount_cents=700)", said
    snap = audit.snapshot(db)
    assert audit.check(snap) == [] and snap.version == NEW
    assert snap.money == 15000 + 50 + 5 + 700
    assert {e: (m.state.value, m.priority) for e, m in snap.messages.items()} == {
        "E0001": ("done", 0), "E0002": ("dead", 0), "E0003": ("done", 0),
        "E0004": ("leased", 0), "E0005": ("done", 0), "E0006": ("done", 7),
        "E0009": ("ready", 0), "E0010": ("ready", 0), "E0011": ("done", 9)}
    assert sorted((row.event_id, row.amount_cents) for row in snap.effect_rows) == [
        ("E0001", 10000), ("E0003", 5000), ("E0005", 700), ("E0006", 50), ("E0011", 5)]
    outcomes = drain(Queue(db, clock=ModelClock(3000)), Handler())
    assert sorted((o.event_id, o.kind) for o in outcomes) == [
        ("E0004", "done"), ("E0009", "done"), ("E0010", "done")]
    final = audit.snapshot(db)
    assert audit.check(final) == []
    assert final.money == 15000 + 50 + 5 + 700 + 2000 + 100 + 40
    assert sorted(final.states().values()) == ["dead"] + ["done"] * 8


@pytest.mark.parametrize("ids", ["course", "general"])
def test_a_sqlite_file_that_engine_wrote_is_current_and_works_here_without_a_step(
        engine: Path, ids: str, tmp_path: Path) -> None:
    db = write(engine, ids, str(tmp_path / "queue.sqlite3"), sqlite.SCHEMA_VERSION)
    assert sqlite.SCHEMA_VERSION == 4
    was = folder_bytes(db)

    assert migrate(db).steps == ()

    assert folder_bytes(db) == was  # not a byte written
    queue = Queue(db, clock=ModelClock(1020))
    assert queue.schema_version == 4 and queue.id_rule == ids
    assert [o.event_id for o in drain(queue, Handler())] == [named(ids, "E0006"),
                                                             named(ids, "E0005")]
    queue.clock.set(2000)  # E0004's lease (until 1037) has expired
    assert [(o.event_id, o.kind) for o in drain(queue, Handler())] == [
        (named(ids, "E0004"), "done")]
    snap = audit.snapshot(db)
    assert audit.check(snap) == [] and snap.version == 4
    assert snap.money == 15000 + 50 + 700 + 2000
    assert snap.states() == by_name(ids, {**STATES_BEFORE, "E0004": "done", "E0005": "done",
                                          "E0006": "done"})
    # the same version on both sides: that engine still reads what this one wrote
    status = previous_engine.cli(engine, "--db", db, "status", "--json")
    assert status.returncode == 0, status.stderr
    said = json.loads(status.stdout)
    assert (said["total"], said["states"]) == (17750, {"ready": 0, "leased": 0, "done": 5,
                                                       "dead": 1})
