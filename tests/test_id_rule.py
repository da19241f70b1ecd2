"""The id rule a queue is created with: ``course`` (the default) or ``general``.

On both stores, through the API and the command line: a general queue takes
the ids real sources send and counts each event once; every class of bad id
is refused whole-batch with one line and nothing stored; a queue's rule is
chosen once, and a second, different choice is refused with nothing changed;
the schema's CHECK holds the rule against SQL of one's own.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from queue_core import (BatchRejected, Handler, ModelClock, NotRedrivable, Queue, audit, drain,
                        parse_batch)
from queue_core.errors import IdRuleDiffers
from queue_core.ids import COURSE, GENERAL, matches

ROOT = Path(__file__).resolve().parent.parent
REAL_IDS = ("3f2c1a9e-8b7d-4c1e-9a2b-1234567890ab", "order-2026-000123", "evt_1NG8Du2eZvKYlo2C",
            "shop:order:42", "v1.2.3", "E0001", "a" * 128)
BAD_GENERAL = {"empty": "", "too long": "a" * 129, "control character": "order\x07",
               "newline": "order-1\n", "non-ASCII": "caf\u00e9", "whitespace": "order 1",
               "a slash": "shop/order", "a quote": "o'brien"}


def line(event_id: object, amount: int = 100, category: str = "book") -> str:
    return json.dumps({"event_id": event_id,
                       "payload": {"category": category, "amount_cents": amount}})


def cli(db: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "queue_core", "--db", db, *args],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)


def folder_bytes(path: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.iterdir())}


def test_the_rules_say_what_they_take() -> None:
    assert all(matches(GENERAL, event_id) for event_id in REAL_IDS)
    assert not any(matches(GENERAL, event_id) for event_id in BAD_GENERAL.values())
    assert matches(COURSE, "E0001") and not matches(COURSE, "E00001")
    assert not any(matches(COURSE, event_id) for event_id in REAL_IDS if event_id != "E0001")


def test_a_new_queue_is_a_course_queue_and_says_so(store: str) -> None:
    queue = Queue(store, clock=ModelClock(1000))
    assert queue.id_rule == COURSE
    assert queue.status().as_dict()["ids"] == "course"
    with pytest.raises(BatchRejected) as refused:
        queue.enqueue_jsonl(line("E0001") + "\n" + line("order-1"))
    assert (refused.value.code, refused.value.line) == ("invalid_event_id", 2)
    assert str(refused.value) == ("line 2: invalid_event_id: event_id must be E followed by "
                                  "four ASCII digits, got 'order-1'")
    assert audit.snapshot(store).messages == {}


def test_a_general_queue_counts_the_ids_real_sources_send_exactly_once(store: str) -> None:
    queue = Queue(store, clock=ModelClock(1000), ids="general")
    batch = "\n".join(line(event_id, 100 + i) for i, event_id in enumerate(REAL_IDS))
    assert queue.enqueue_jsonl(batch).inserted == len(REAL_IDS)
    assert queue.enqueue_jsonl(batch).duplicates == len(REAL_IDS)  # a replay: nothing new
    outcomes = drain(queue, Handler())
    assert sorted(o.event_id for o in outcomes if o.kind == "done") == sorted(REAL_IDS)
    snap = audit.snapshot(store)
    assert audit.check(snap) == []
    assert snap.money == sum(100 + i for i in range(len(REAL_IDS)))
    assert set(snap.states().values()) == {"done"} and len(snap.effect_rows) == len(REAL_IDS)
    assert Queue(store).id_rule == GENERAL and Queue(store).metrics().ids == "general"


@pytest.mark.parametrize("kind", sorted(BAD_GENERAL))
def test_each_class_of_bad_id_is_refused_whole_batch_with_nothing_stored(
        store: str, kind: str) -> None:
    queue = Queue(store, clock=ModelClock(1000), ids="general")
    queue.enqueue_jsonl(line("kept-1"))
    before = audit.snapshot(store)
    with pytest.raises(BatchRejected) as refused:
        queue.enqueue_jsonl(line("fine-1") + "\n" + line(BAD_GENERAL[kind]))
    assert (refused.value.code, refused.value.line) == ("invalid_event_id", 2)
    assert "\n" not in str(refused.value) and str(refused.value).startswith(
        "line 2: invalid_event_id: event_id ")
    after = audit.snapshot(store)
    assert (after.messages, after.journal) == (before.messages, before.journal)


def test_a_non_string_id_is_refused_under_either_rule() -> None:
    for rule in (COURSE, GENERAL):
        with pytest.raises(BatchRejected) as refused:
            parse_batch(line(12345), ids=rule)
        assert refused.value.code == "invalid_event_id"


def test_a_batch_checked_against_the_general_rule_is_checked_again_by_a_course_queue(
        store: str) -> None:
    batch = parse_batch(line("E0001") + "\n" + line("order-1"), ids="general")
    queue = Queue(store, clock=ModelClock(1000))
    with pytest.raises(BatchRejected) as refused:
        queue.enqueue(batch)
    assert (refused.value.code, refused.value.line) == ("invalid_event_id", 2)
    assert audit.snapshot(store).messages == {}


def test_a_second_different_choice_is_refused_and_changes_nothing(store: str) -> None:
    Queue(store, clock=ModelClock(1000)).enqueue_jsonl(line("E0001"))
    before = audit.snapshot(store)
    with pytest.raises(IdRuleDiffers) as refused:
        Queue(store, ids="general")
    assert refused.value.code == "id_rule_differs"
    assert "is a course queue" in str(refused.value)
    assert Queue(store, ids="course").id_rule == COURSE  # the same choice again is fine
    after = audit.snapshot(store)
    assert (after.messages, after.journal, after.version) == (
        before.messages, before.journal, before.version)


def test_the_schema_check_holds_the_rule_against_sql_of_ones_own(store: str) -> None:
    # The CHECK accepts exactly what the Python rule accepts: every real id, and no bad one.
    Queue(store, ids="general").enqueue_jsonl(line("a-b.c:d_e"))
    digest = hashlib.sha256(b"{}").digest()
    insert = ("INSERT INTO messages (event_id, payload, payload_sha256, available_at) "
              "VALUES ({0}, '{{}}', {0}, 0)")
    for bad in BAD_GENERAL.values():
        assert not matches(GENERAL, bad)
        if store.startswith("postgresql://"):
            with psycopg.connect(store, autocommit=True) as conn, \
                    pytest.raises(psycopg.errors.CheckViolation):
                conn.execute(insert.format("%s"), (bad, digest))
        else:
            with sqlite3.connect(store) as conn, pytest.raises(sqlite3.IntegrityError):
                conn.execute(insert.format("?"), (bad, digest))
    for good in REAL_IDS:
        assert matches(GENERAL, good)
        if store.startswith("postgresql://"):
            with psycopg.connect(store, autocommit=True) as conn:
                conn.execute(insert.format("%s"), (good, digest))
        else:
            with sqlite3.connect(store) as conn:
                conn.execute(insert.format("?"), (good, digest))
    assert sorted(audit.snapshot(store).messages) == sorted({"a-b.c:d_e", *REAL_IDS})


def test_redrive_follows_the_queues_rule(store: str) -> None:
    queue = Queue(store, clock=ModelClock(1000), ids="general", max_attempts=1)
    queue.enqueue_jsonl(line("order-7", category="toy"))
    assert [o.kind for o in drain(queue, Handler())] == ["dead"]
    queue.redrive("order-7")
    assert audit.snapshot(store).states() == {"order-7": "ready"}
    with pytest.raises(NotRedrivable) as refused:
        queue.redrive("order 7")
    assert refused.value.code == "invalid_event_id" and "' ' (U+0020)" in str(refused.value)
    assert audit.snapshot(store).states() == {"order-7": "ready"}


def test_the_command_line_creates_a_general_queue_once(tmp_path: Path) -> None:
    db = str(tmp_path / "queue.sqlite3")
    batch = tmp_path / "real.jsonl"
    batch.write_text("\n".join(line(event_id) for event_id in REAL_IDS[:3]) + "\n")
    refused = cli(db, "--now", "1000", "enqueue", str(batch))  # a new queue is a course queue
    assert refused.returncode == 2 and refused.stderr.startswith("line 1: invalid_event_id: ")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["real.jsonl"]  # no file made

    done = cli(db, "--now", "1000", "enqueue", "--ids", "general", str(batch))
    assert (done.returncode, done.stdout) == (0, "inserted 3, duplicates 0\n"), done.stderr
    again = cli(db, "--now", "1000", "enqueue", str(batch))  # the queue's own rule from now on
    assert again.stdout == "inserted 0, duplicates 3\n", again.stderr
    before = folder_bytes(tmp_path)
    other = cli(db, "--now", "1000", "enqueue", "--ids", "course", str(batch))
    assert other.returncode == 2 and other.stdout == ""
    assert other.stderr.startswith("id_rule_differs: ") and other.stderr.count("\n") == 1
    unknown = cli(db, "--now", "1000", "enqueue", "--ids", "uuid", str(batch))
    assert unknown.returncode == 2 and "unknown_id_rule: " in unknown.stderr
    assert folder_bytes(tmp_path) == before

    work = cli(db, "--now", "1001", "work")
    assert work.returncode == 0, work.stderr
    status = json.loads(cli(db, "status", "--json").stdout)
    assert status["ids"] == "general" and status["total"] == 300 and status["effects"] == 3
    text = cli(db, "status").stdout
    assert text.splitlines()[-1] == "ids:     general (1 to 128 ASCII letters, digits and _ . : -)"
    assert json.loads(cli(db, "--now", "1001", "metrics", "--json").stdout)["ids"] == "general"


def test_the_command_line_refuses_an_id_no_queue_could_hold_before_opening_one(
        tmp_path: Path, pg_dsn: str) -> None:
    for db in (str(tmp_path / "queue.sqlite3"), pg_dsn):
        done = cli(db, "redrive", "order 7")
        assert done.returncode == 2 and done.stderr.startswith("invalid_event_id: ")
    assert list(tmp_path.iterdir()) == []
    course = cli(str(tmp_path / "queue.sqlite3"), "redrive", "e0001")
    assert course.stderr == ("invalid_event_id: 'e0001' is not an event id (E followed by four "
                             "ASCII digits): did you mean 'E0001'?\n")


def test_a_postgresql_general_queue_through_the_command_line(tmp_path: Path, pg_dsn: str) -> None:
    batch = tmp_path / "real.jsonl"
    batch.write_text("\n".join(line(event_id) for event_id in REAL_IDS[:2]) + "\n")
    assert cli(pg_dsn, "--now", "1000", "enqueue", str(batch)).returncode == 2
    done = cli(pg_dsn, "--now", "1000", "enqueue", "--ids", "general", str(batch))
    assert done.stdout == "inserted 2, duplicates 0\n", done.stderr
    assert cli(pg_dsn, "--now", "1000", "enqueue", str(batch)).stdout == \
        "inserted 0, duplicates 2\n"
    other = cli(pg_dsn, "--now", "1000", "enqueue", "--ids", "course", str(batch))
    assert other.returncode == 2 and other.stderr.startswith("id_rule_differs: ")
    assert cli(pg_dsn, "--now", "1001", "work").returncode == 0
    status = json.loads(cli(pg_dsn, "status", "--json").stdout)
    assert (status["ids"], status["total"], status["states"]["done"]) == ("general", 200, 2)
