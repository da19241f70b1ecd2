"""Bad input from the stream gets the codes a JSONL batch gets, goes to the
dead-letter stream, and leaves the queue file exactly as it was.

One consumer runs in this process against a real Redis server, so that many
kinds of input cost little; the crash scenarios with real processes are in
``test_broker.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

import broker_server
from conftest import snapshot
from queue_core import BatchRejected, parse_batch
from queue_core.lab.broker import Broker, open_broker
from queue_core.lab.broker.consumer import (Consumer, inbox_step, naive_step, prepare_db,
                                            read_event)

GOOD = b'{"event_id": "E0001", "payload": {"category": "book", "amount_cents": 10000}}'

# (id, the entry's event text, the code a batch line with that text gets)
LINES = [
    ("invalid-json", b'{"event_id": "E0001", "payload": {', "invalid_json"),
    ("duplicate-key", b'{"event_id": "E0001", "event_id": "E0002", "payload": {}}',
     "duplicate_key"),
    ("nan", b'{"event_id": "E0001", "payload": {"amount_cents": NaN}}', "non_finite_number"),
    ("deep", b'{"event_id": "E0001", "payload": ' + b"[" * 70 + b"]" * 70 + b"}",
     "nesting_too_deep"),
    ("array", b'["E0001", {}]', "not_an_object"),
    ("no-payload", b'{"event_id": "E0001"}', "missing_key"),
    ("extra-key", b'{"event_id": "E0001", "payload": {}, "note": 1}', "unexpected_key"),
    ("short-id", b'{"event_id": "E001", "payload": {}}', "invalid_event_id"),
    ("unicode-digits", '{"event_id": "E\u0661\u0662\u0663\u0664", "payload": {}}'.encode(),
     "invalid_event_id"),
    ("payload-array", b'{"event_id": "E0001", "payload": [1]}', "payload_not_object"),
    ("lone-surrogate", b'{"event_id": "E0001", "payload": {"note": "\\ud800"}}',
     "unencodable_string"),
    ("too-large", b'{"event_id": "E0001", "payload": {"note": "' + b"x" * 10_001 + b'"}}',
     "payload_too_large"),
    ("not-utf8", b'{"event_id": "E0001", "payload": {"note": "\xff"}}', "invalid_utf8"),
]
# (id, the entry's fields, its code): what only an entry can get wrong
SHAPES = [
    ("no-event-field", {"event_id": b"E0001"}, "missing_key"),
    ("second-field", {"event": GOOD, "source": b"shop"}, "unexpected_key"),
    ("two-lines", {"event": GOOD + b"\n" + GOOD.replace(b"E0001", b"E0002")}, "not_one_line"),
    ("blank", {"event": b"  \r\n"}, "not_one_line"),
]


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    yield from broker_server.server_url()


@pytest.fixture
def broker(redis_url: str) -> Iterator[Broker]:
    made = open_broker(redis_url)
    try:
        yield made
    finally:
        made.drop()


def consume(broker: Broker, db: Path, step=inbox_step, keep: str = "inbox") -> None:
    queue = prepare_db(db, keep)
    consumer = Consumer(broker, "A", queue, step)
    try:
        consumer.run()
    finally:
        consumer.close()


@pytest.mark.parametrize("text, code", [(t, c) for _, t, c in LINES], ids=[i for i, _, _ in LINES])
def test_a_bad_line_gets_the_batch_code_is_dead_lettered_and_writes_nothing(
        broker: Broker, tmp_path: Path, text: bytes, code: str) -> None:
    with pytest.raises(BatchRejected) as as_batch:
        parse_batch(text)
    assert (as_batch.value.code, as_batch.value.line) == (code, 1)  # what a JSONL file gets
    db = tmp_path / "q.sqlite3"
    prepare_db(db, "inbox")
    before = snapshot(db)
    broker.publish_entry({"event": text})
    consume(broker, db)
    dead = broker.dead_letters()
    assert [(d.entry, d.code, d.consumer, d.delivery) for d in dead] == [(1, code, "A", 1)]
    assert dead[0].reason == as_batch.value.message[:200]
    assert broker.pending() == [] and snapshot(db) == before


@pytest.mark.parametrize("fields, code", [(f, c) for _, f, c in SHAPES], ids=[i for i, _, _ in SHAPES])
def test_an_entry_of_the_wrong_shape_is_dead_lettered_with_its_own_code(
        broker: Broker, tmp_path: Path, fields: dict[str, bytes], code: str) -> None:
    with pytest.raises(BatchRejected) as refused:
        read_event({k.encode(): v for k, v in fields.items()})
    assert refused.value.code == code
    db = tmp_path / "q.sqlite3"
    broker.publish_entry(fields)
    consume(broker, db)
    assert [d.code for d in broker.dead_letters()] == [code]
    assert broker.pending() == []
    assert snapshot(db) == {"messages": [], "effects": [], "transitions": []}


@pytest.mark.parametrize("text", [b"\xef\xbb\xbf" + GOOD, GOOD + b"\r\n", b"  " + GOOD],
                         ids=["bom", "crlf", "leading-space"])
def test_what_a_batch_line_may_carry_an_entry_may_carry_too(
        broker: Broker, tmp_path: Path, text: bytes) -> None:
    db = tmp_path / "q.sqlite3"
    broker.publish_entry({"event": text})
    consume(broker, db)
    assert broker.dead_letters() == [] and broker.pending() == []
    assert snapshot(db)["effects"] == [("E0001", "book", 10000)]


def test_a_conflicting_payload_is_dead_lettered_and_the_accepted_one_kept(
        broker: Broker, tmp_path: Path) -> None:
    db = tmp_path / "q.sqlite3"
    broker.publish(GOOD.decode() + "\n" + GOOD.decode().replace("10000", "12000") + "\n"
                   + GOOD.decode().replace(" ", "") + "\n")
    consume(broker, db)
    assert [(d.entry, d.code) for d in broker.dead_letters()] == [(2, "batch_conflict")]
    committed = [(s.entry, s.detail) for s in broker.log() if s.step == "committed"]
    assert committed == [(1, "stored"), (3, "repeat: counted, not stored")]
    assert snapshot(db)["effects"] == [("E0001", "book", 10000)]
    assert broker.pending() == []


def test_a_payload_the_handler_refuses_is_the_queues_dead_letter_or_the_naive_streams(
        broker: Broker, tmp_path: Path) -> None:
    toy = GOOD.decode().replace("book", "toy")
    broker.publish(toy + "\n")
    consume(broker, tmp_path / "inbox.sqlite3")
    assert broker.dead_letters() == []  # stored: the queue sends it dead, redrive can fix it
    states = snapshot(tmp_path / "inbox.sqlite3")["messages"]
    assert [(row[0], row[3], row[8]) for row in states] == [("E0001", "dead", "invalid_payload")]
    other = open_broker(broker.url)
    try:
        other.publish(toy + "\n")
        consume(other, tmp_path / "naive.sqlite3", naive_step, keep="naive")
        assert [d.code for d in other.dead_letters()] == ["invalid_payload"]
        assert other.pending() == []
    finally:
        other.drop()


def test_a_failure_of_the_database_step_is_no_poison_the_entry_stays_pending(
        broker: Broker, tmp_path: Path) -> None:
    def broken_step(queue, line):
        raise OSError("disk full")

    broker.publish(GOOD.decode() + "\n")
    with pytest.raises(OSError, match="disk full"):
        consume(broker, tmp_path / "q.sqlite3", broken_step)
    assert broker.dead_letters() == []
    assert [str(p) for p in broker.pending()] == ["E0001 held by A, delivered 1x"]
    assert [s.step for s in broker.log()] == ["received"]  # no XACK: it will be delivered again
