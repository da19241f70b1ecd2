"""The business handler: types before values, and an invalid payload goes to
the dead-letter state at once, whole, without spending retries."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from conftest import DATA
from observe import effects, expect, ledger, row
from queue_core import DEFAULT_CATEGORIES, Effect, Handler, InvalidPayload, Queue, drain

INVALID = {
    "category-array": {"category": ["book"], "amount_cents": 1000},
    "category-object": {"category": {"name": "book"}, "amount_cents": 1000},
    "category-number": {"category": 5, "amount_cents": 1000},
    "category-null": {"category": None, "amount_cents": 1000},
    "category-missing": {"amount_cents": 1000},
    "category-unknown-toy": {"category": "toy", "amount_cents": 1000},
    "category-wrong-case": {"category": "Book", "amount_cents": 1000},
    "amount-true": {"category": "book", "amount_cents": True},
    "amount-false": {"category": "book", "amount_cents": False},
    "amount-float-1.0": {"category": "book", "amount_cents": 1.0},
    "amount-float-100.0": {"category": "book", "amount_cents": 100.0},
    "amount-string": {"category": "book", "amount_cents": "100"},
    "amount-array": {"category": "book", "amount_cents": [100]},
    "amount-null": {"category": "book", "amount_cents": None},
    "amount-missing": {"category": "book"},
    "amount-0": {"category": "book", "amount_cents": 0},
    "amount-negative": {"category": "book", "amount_cents": -1},
    "amount-10000000": {"category": "book", "amount_cents": 10_000_000},
    "amount-huge": {"category": "book", "amount_cents": 10**30},
}

VALID = {
    "amount-1": ({"category": "pen", "amount_cents": 1}, Effect("pen", 1)),
    "amount-9999999": ({"category": "bag", "amount_cents": 9_999_999}, Effect("bag", 9_999_999)),
    "extra-fields-ignored": ({"category": "book", "amount_cents": 100, "note": [1]},
                             Effect("book", 100)),
}


@pytest.mark.parametrize("payload", INVALID.values(), ids=INVALID.keys())
def test_an_invalid_payload_raises_invalid_payload_never_type_error(payload: dict) -> None:
    with pytest.raises(InvalidPayload) as caught:
        Handler().effect_of(payload)
    assert caught.value.code == "invalid_payload"


@pytest.mark.parametrize("payload, effect", VALID.values(), ids=VALID.keys())
def test_a_valid_payload_gives_its_effect(payload: dict, effect: Effect) -> None:
    assert Handler().effect_of(payload) == effect


@pytest.mark.parametrize("payload", [[], "book", None, 1],
                         ids=["array", "string", "null", "number"])
def test_a_payload_that_is_not_an_object_is_invalid(payload: Any) -> None:
    with pytest.raises(InvalidPayload):
        Handler().effect_of(payload)


def test_a_newer_handler_accepts_toy_and_the_older_one_is_unchanged() -> None:
    old = Handler()
    new = old.supporting("toy")
    toy = {"category": "toy", "amount_cents": 3000}

    assert new.effect_of(toy) == Effect("toy", 3000)
    assert new.categories == DEFAULT_CATEGORIES | {"toy"}
    assert old.categories == DEFAULT_CATEGORIES == frozenset({"book", "pen", "bag"})
    with pytest.raises(InvalidPayload):
        old.effect_of(toy)


def test_a_subclass_keeps_its_class_when_it_supports_more() -> None:
    class Audited(Handler):
        pass

    assert type(Audited().supporting("toy")) is Audited


@pytest.mark.parametrize("payload", INVALID.values(), ids=INVALID.keys())
def test_an_invalid_payload_is_dead_at_once_stored_whole_and_the_others_go_on(
        queue: Queue, handler: Handler, db_path: Path, payload: dict) -> None:
    lines = [{"event_id": "E0001", "payload": payload},
             {"event_id": "E0002", "payload": {"category": "pen", "amount_cents": 2000}}]
    queue.enqueue_jsonl("".join(json.dumps(item) + "\n" for item in lines))

    outcomes = drain(queue, handler)

    assert [(o.event_id, o.kind, o.code) for o in outcomes] == \
        [("E0001", "dead", "invalid_payload"), ("E0002", "done", None)]
    stored = row(db_path, "E0001")
    assert (stored["state"], stored["attempts"], stored["generation"], stored["last_error"]) == \
        ("dead", 1, 1, "invalid_payload")
    assert json.loads(stored["payload"]) == payload
    assert ledger(db_path) == expect(total=2000, effects=1, done=1, dead=1)


def test_the_invalid_payloads_file_ends_dead_without_money(
        queue: Queue, handler: Handler, db_path: Path) -> None:
    queue.enqueue_file(DATA / "invalid_payloads.jsonl")

    outcomes = drain(queue, handler)

    assert {(o.kind, o.code) for o in outcomes} == {("dead", "invalid_payload")}
    assert len(outcomes) == 6
    assert ledger(db_path) == expect(total=0, effects=0, dead=6)
    assert effects(db_path) == {}
