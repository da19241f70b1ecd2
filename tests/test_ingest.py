"""Every input rule of SPEC section 2, tried on both sides of its boundary.

A rejection names a stable code and the line, and leaves the database
exactly as it was: each case runs against a queue that already holds the
reference batch, and the whole database is compared before and after.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import DATA, snapshot
from observe import expect, ledger, row
from queue_core import BatchRejected, EnqueueResult, Queue, canonical_json, parse_batch
from queue_core.ingest import MAX_DEPTH, MAX_FILE_BYTES, MAX_LINES, MAX_PAYLOAD_BYTES

BOOK = {"category": "book", "amount_cents": 100}


def line(event_id: object = "E0100", payload: object = BOOK, **extra: object) -> str:
    return json.dumps({"event_id": event_id, "payload": payload, **extra}) + "\n"


@pytest.fixture
def stocked(queue: Queue, db_path: Path) -> Queue:
    """A queue that already holds the reference batch, so 'unchanged' means something."""
    queue.enqueue_file(DATA / "demo.jsonl")
    assert ledger(db_path) == expect(total=0, effects=0, ready=4)
    return queue


def assert_rejected(queue: Queue, db_path: Path, data: str | bytes, code: str,
                    line_number: int | None) -> None:
    before = snapshot(db_path)
    with pytest.raises(BatchRejected) as caught:
        queue.enqueue_jsonl(data)
    assert (caught.value.code, caught.value.line) == (code, line_number)
    assert snapshot(db_path) == before


def payload_of_size(size: int, char: str = "x") -> dict[str, str]:
    """A payload whose canonical UTF-8 form is exactly ``size`` bytes, mostly ``char``."""
    overhead = len(canonical_json({"note": ""}).encode())
    count, rest = divmod(size - overhead, len(char.encode()))
    payload = {"note": char * count + "x" * rest}
    assert len(canonical_json(payload).encode()) == size
    return payload


# -- rejected lines: code and line number, database unchanged ------------------------

REJECTED = {
    # envelope shape
    "line-is-an-array": ('[1, 2]\n', "not_an_object"),
    "line-is-a-string": ('"E0100"\n', "not_an_object"),
    "empty-object": ('{}\n', "missing_key"),
    "missing-payload": ('{"event_id": "E0100"}\n', "missing_key"),
    "missing-event-id": ('{"payload": {}}\n', "missing_key"),
    "extra-key": (line(source="shop"), "unexpected_key"),
    "payload-array": (line(payload=[1, 2, 3]), "payload_not_object"),
    "payload-string": (line(payload="{}"), "payload_not_object"),
    "payload-null": (line(payload=None), "payload_not_object"),
    "payload-number": (line(payload=100), "payload_not_object"),
    # event id shapes
    "id-three-digits": (line("E123"), "invalid_event_id"),
    "id-five-digits": (line("E12345"), "invalid_event_id"),
    "id-lower-case": (line("e0001"), "invalid_event_id"),
    "id-arabic-indic-digits": (line("E\u0661\u0662\u0663\u0664"), "invalid_event_id"),
    "id-fullwidth-digits": (line("E\uff10\uff10\uff10\uff11"), "invalid_event_id"),
    "id-trailing-newline": (line("E0001\n"), "invalid_event_id"),
    "id-leading-space": (line(" E0001"), "invalid_event_id"),
    "id-number": (line(1), "invalid_event_id"),
    "id-null": (line(None), "invalid_event_id"),
    # JSON itself
    "truncated": ('{"event_id": "E0100", "payload": {\n', "invalid_json"),
    "two-values-on-one-line": (line().strip() + line(), "invalid_json"),
    "trailing-comma": ('{"event_id": "E0100", "payload": {},}\n', "invalid_json"),
    "single-quotes": ("{'event_id': 'E0100', 'payload': {}}\n", "invalid_json"),
    "integer-too-long-to-convert": (
        '{"event_id": "E0100", "payload": {"n": 1' + "0" * 5000 + '}}\n', "invalid_json"),
    "form-feed-only-line": ('\f\n', "invalid_json"),
    # duplicate keys at any depth
    "duplicate-key-in-envelope": ('{"event_id": "E0100", "event_id": "E0101", "payload": {}}\n',
                                  "duplicate_key"),
    "duplicate-key-in-payload": ('{"event_id": "E0100", "payload": {"a": 1, "a": 1}}\n',
                                 "duplicate_key"),
    "duplicate-key-at-depth": (
        '{"event_id": "E0100", "payload": {"a": [{"b": {"c": 1, "c": 2}}]}}\n', "duplicate_key"),
    # non-finite numbers
    "nan": ('{"event_id": "E0100", "payload": {"n": NaN}}\n', "non_finite_number"),
    "infinity": ('{"event_id": "E0100", "payload": {"n": Infinity}}\n', "non_finite_number"),
    "minus-infinity": ('{"event_id": "E0100", "payload": {"n": -Infinity}}\n', "non_finite_number"),
    "overflow-to-infinity": ('{"event_id": "E0100", "payload": {"n": 1e999}}\n',
                             "non_finite_number"),
    # strings with no UTF-8 form
    "lone-surrogate-in-value": ('{"event_id": "E0100", "payload": {"s": "\\ud800"}}\n',
                                "unencodable_string"),
    "lone-surrogate-in-key": ('{"event_id": "E0100", "payload": {"\\udfff": 1}}\n',
                              "unencodable_string"),
    # nesting
    "nesting-one-level-too-deep": (
        '{"event_id": "E0100", "payload": {"a": ' + "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1)
        + "}}\n", "nesting_too_deep"),
    "100000-open-brackets": ('{"event_id": "E0100", "payload": {"a": ' + "[" * 100_000 + "}}\n",
                             "nesting_too_deep"),
    "100000-nested-arrays": ('{"event_id": "E0100", "payload": {"a": ' + "[" * 100_000
                             + "]" * 100_000 + "}}\n", "nesting_too_deep"),
    "100000-nested-objects": ('{"event_id": "E0100", "payload": ' + '{"a": ' * 100_000 + "1"
                              + "}" * 100_001 + "\n", "nesting_too_deep"),
    # size of the canonical payload
    "payload-10001-bytes": (line(payload=payload_of_size(MAX_PAYLOAD_BYTES + 1)),
                            "payload_too_large"),
    "payload-10001-bytes-of-two-byte-chars": (
        line(payload=payload_of_size(MAX_PAYLOAD_BYTES + 1, "\u00e9")), "payload_too_large"),
    # a repeat with another payload, inside the batch
    "in-batch-conflict": (line("E0100") + line("E0100", {"category": "book", "amount_cents": 101}),
                          "batch_conflict"),
    "in-batch-int-vs-float": (line("E0100", {"n": 1}) + line("E0100", {"n": 1.0}),
                              "batch_conflict"),
}


@pytest.mark.parametrize("data, code", REJECTED.values(), ids=REJECTED.keys())
def test_a_bad_line_rejects_the_batch_with_its_code_and_leaves_the_database_unchanged(
        stocked: Queue, db_path: Path, data: str, code: str) -> None:
    good = line("E0099")
    # the bad line is the last line, after a good line and a blank one
    assert_rejected(stocked, db_path, good + "\n" + data, code, data.count("\n") + 2)
    assert ledger(db_path) == expect(total=0, effects=0, ready=4)


# Without ``parse_constant`` and ``parse_float`` a non-finite number outside the payload
# would still be refused, but under another code (in brackets): pinned in every position.
NON_FINITE = {
    "nan-as-event-id": ('{"event_id": NaN, "payload": {}}', "NaN"),  # invalid_event_id
    "infinity-as-payload": ('{"event_id": "E0100", "payload": Infinity}',
                            "Infinity"),  # payload_not_object
    "minus-infinity-under-an-extra-key": ('{"event_id": "E0100", "payload": {}, "x": -Infinity}',
                                          "-Infinity"),  # unexpected_key
    "nan-as-the-whole-line": ("NaN", "NaN"),  # not_an_object
    "nan-in-an-array-line": ("[1, NaN]", "NaN"),  # not_an_object
    "nan-deep-in-the-payload": ('{"event_id": "E0100", "payload": {"a": [{"b": [NaN]}]}}', "NaN"),
    "overflow-as-event-id": ('{"event_id": 1e999, "payload": {}}', "1e999"),  # invalid_event_id
    "overflow-under-an-extra-key": ('{"event_id": "E0100", "payload": {}, "x": -1e999}',
                                    "-1e999"),  # unexpected_key
    "overflow-as-the-whole-line": ("-1.5E+400", "-1.5E+400"),  # not_an_object
    "overflow-just-past-the-largest-double": (
        '{"event_id": "E0100", "payload": {"n": 1.8e308}}', "1.8e308"),
    "long-overflow-shortened-in-the-message": (
        '{"event_id": "E0100", "payload": {"n": 1' + "0" * 400 + '.0}}', "1" + "0" * 36 + "..."),
}


@pytest.mark.parametrize("text, literal", NON_FINITE.values(), ids=NON_FINITE.keys())
def test_a_non_finite_number_anywhere_on_the_line_is_refused_as_such_naming_its_literal(
        stocked: Queue, db_path: Path, text: str, literal: str) -> None:
    before = snapshot(db_path)
    with pytest.raises(BatchRejected) as caught:
        stocked.enqueue_jsonl(line("E0099") + text + "\n")

    overflow = literal not in ("NaN", "Infinity", "-Infinity")
    reason = "overflows to infinity" if overflow else "is not a JSON number"
    assert (caught.value.code, caught.value.line) == ("non_finite_number", 2)
    assert caught.value.message == f"{literal} {reason}"
    assert snapshot(db_path) == before
    assert ledger(db_path) == expect(total=0, effects=0, ready=4)


def test_the_largest_finite_double_is_accepted_and_stored_as_written(
        stocked: Queue, db_path: Path) -> None:
    text = '{"event_id": "E0100", "payload": {"n": 1.7976931348623157e308, "m": -1e-999}}\n'

    assert stocked.enqueue_jsonl(text) == EnqueueResult(inserted=1, duplicates=0)

    assert row(db_path, "E0100")["payload"] == '{"m":-0.0,"n":1.7976931348623157e+308}'
    assert ledger(db_path) == expect(total=0, effects=0, ready=5)


INVALID_BYTES = {
    "lone-continuation-byte": b"\x80",
    "invalid-start-byte": b"\xff",
    "overlong-slash": b"\xc0\xaf",
    "encoded-surrogate": b"\xed\xa0\x80",
    "truncated-sequence": b"\xe2\x82",
    "latin-1-e-acute": b"\xe9",
}


@pytest.mark.parametrize("bad", INVALID_BYTES.values(), ids=INVALID_BYTES.keys())
def test_a_line_that_is_not_utf8_is_rejected_and_leaves_the_database_unchanged(
        stocked: Queue, db_path: Path, bad: bytes) -> None:
    data = line("E0099").encode() + b'{"event_id": "E0100", "payload": {"s": "b' + bad + b'ok"}}\n'
    assert_rejected(stocked, db_path, data, "invalid_utf8", 2)
    assert ledger(db_path) == expect(total=0, effects=0, ready=4)


def test_a_python_string_with_a_lone_surrogate_is_rejected_as_not_utf8(
        stocked: Queue, db_path: Path) -> None:
    text = line("E0099") + '{"event_id": "E0100", "payload": {"s": "\ud800"}}'
    assert_rejected(stocked, db_path, text, "invalid_utf8", 2)


def test_the_line_number_counts_blank_lines_bom_and_crlf(stocked: Queue, db_path: Path) -> None:
    data = "\ufeff" + line("E0100").replace("\n", "\r\n") + "\r\n  \t\r\n" + line("E12")
    assert_rejected(stocked, db_path, data, "invalid_event_id", 4)


# -- accepted lines: the other side of each boundary -----------------------------------

ACCEPTED = {
    "id-E0000": (line("E0000"), {"E0000": '{"amount_cents":100,"category":"book"}'}),
    "id-E9999": (line("E9999"), {"E9999": '{"amount_cents":100,"category":"book"}'}),
    "empty-payload": (line(payload={}), {"E0100": "{}"}),
    "nesting-at-the-limit": (
        '{"event_id": "E0100", "payload": {"a": ' + "[" * (MAX_DEPTH - 2) + "]" * (MAX_DEPTH - 2)
        + "}}\n", {"E0100": '{"a":' + "[" * (MAX_DEPTH - 2) + "]" * (MAX_DEPTH - 2) + "}"}),
    "keys-sorted-spaces-removed": ('{"payload": {"b": [1, 2.5, "x"], "a": {"d": null, "c": true}},'
                                   '   "event_id": "E0100"}\n',
                                   {"E0100": '{"a":{"c":true,"d":null},"b":[1,2.5,"x"]}'}),
    "utf8-kept-not-escaped": ('{"event_id": "E0100", "payload": {"s": "\\u00e9\\ud83d\\ude00"}}\n',
                              {"E0100": '{"s":"\u00e9\U0001F600"}'}),
    "int-and-float-kept": (line(payload={"i": 1, "f": 1.0, "big": 10**30}),
                           {"E0100": '{"big":1000000000000000000000000000000,"f":1.0,"i":1}'}),
    "line-separator-inside-a-string": (line(payload={"s": "a\u2028b"}),
                                       {"E0100": '{"s":"a\u2028b"}'}),
}


@pytest.mark.parametrize("data, stored", ACCEPTED.values(), ids=ACCEPTED.keys())
def test_a_valid_line_is_stored_as_its_canonical_payload(
        stocked: Queue, db_path: Path, data: str, stored: dict[str, str]) -> None:
    assert stocked.enqueue_jsonl(data) == EnqueueResult(inserted=len(stored), duplicates=0)

    assert {event_id: row(db_path, event_id)["payload"] for event_id in stored} == stored
    assert ledger(db_path) == expect(total=0, effects=0, ready=4 + len(stored))


@pytest.mark.parametrize("char", ["x", "\u00e9", "\u20ac", "\U0001F600"],
                         ids=["ascii", "two-byte", "three-byte", "four-byte"])
def test_a_canonical_payload_of_exactly_10000_bytes_is_accepted(
        stocked: Queue, db_path: Path, char: str) -> None:
    payload = payload_of_size(MAX_PAYLOAD_BYTES, char)
    # neither the spaces nor the \u escapes of the line count: only the canonical UTF-8
    text = '{"event_id": "E0100", "payload": {  "note" :  ' + json.dumps(payload["note"]) + "  }}\n"

    assert stocked.enqueue_jsonl(text) == EnqueueResult(inserted=1, duplicates=0)

    assert len(row(db_path, "E0100")["payload"].encode()) == MAX_PAYLOAD_BYTES
    assert ledger(db_path) == expect(total=0, effects=0, ready=5)


def test_bom_crlf_and_blank_or_whitespace_only_lines_are_accepted(
        stocked: Queue, db_path: Path) -> None:
    data = ("\ufeff" + line("E0100") + "\n \t \n" + line("E0101") + "\r\n\r\n"
            + line("E0100")).replace("\n", "\r\n").replace("\r\r\n", "\r\n")

    assert stocked.enqueue_jsonl(data) == EnqueueResult(inserted=2, duplicates=1)

    assert ledger(db_path) == expect(total=0, effects=0, ready=6)


def test_a_repeat_with_keys_in_another_order_is_a_duplicate_not_a_conflict(
        stocked: Queue, db_path: Path) -> None:
    data = ('{"event_id": "E0100", "payload": {"category": "book", "amount_cents": 100}}\n'
            '{"payload": {"amount_cents": 100, "category": "book"}, "event_id": "E0100"}\n')

    assert stocked.enqueue_jsonl(data) == EnqueueResult(inserted=1, duplicates=1)

    assert ledger(db_path) == expect(total=0, effects=0, ready=5)


# -- file-level limits --------------------------------------------------------------------

def many_lines(count: int, blank_between: bool = True) -> str:
    separator = "\n \n" if blank_between else ""
    return separator.join(line(f"E{i:04d}") for i in range(count))


def test_1000_non_empty_lines_are_accepted_whatever_the_blank_lines_between(
        queue: Queue, db_path: Path) -> None:
    data = many_lines(MAX_LINES)
    assert data.count("\n") > MAX_LINES

    assert queue.enqueue_jsonl(data) == EnqueueResult(inserted=1000, duplicates=0)

    assert ledger(db_path) == expect(total=0, effects=0, ready=1000)


def test_1001_non_empty_lines_are_rejected_and_nothing_is_written(
        stocked: Queue, db_path: Path) -> None:
    assert_rejected(stocked, db_path, many_lines(MAX_LINES) + "\n" + line("E9999"),
                    "too_many_lines", None)
    assert ledger(db_path) == expect(total=0, effects=0, ready=4)


def file_of_size(size: int) -> bytes:
    """1000 valid lines that add up to exactly ``size`` bytes."""
    lines = [line(f"E{i:04d}", {"note": ""}) for i in range(MAX_LINES)]
    short = size - sum(len(text) for text in lines)
    per_line, rest = divmod(short, MAX_LINES)
    padded = [text.replace('""', '"' + "x" * (per_line + (i < rest)) + '"')
              for i, text in enumerate(lines)]
    data = "".join(padded).encode()
    assert len(data) == size
    return data


def test_a_file_of_exactly_1000000_bytes_is_accepted(
        queue: Queue, db_path: Path, tmp_path: Path) -> None:
    path = tmp_path / "full.jsonl"
    path.write_bytes(file_of_size(MAX_FILE_BYTES))

    assert queue.enqueue_file(path) == EnqueueResult(inserted=1000, duplicates=0)

    assert ledger(db_path) == expect(total=0, effects=0, ready=1000)


@pytest.mark.parametrize("how", ["file", "text"])
def test_a_file_of_1000001_bytes_is_rejected_and_nothing_is_written(
        stocked: Queue, db_path: Path, tmp_path: Path, how: str) -> None:
    data = file_of_size(MAX_FILE_BYTES + 1)
    before = snapshot(db_path)
    with pytest.raises(BatchRejected) as caught:
        if how == "file":
            path = tmp_path / "big.jsonl"
            path.write_bytes(data)
            stocked.enqueue_file(path)
        else:
            stocked.enqueue_jsonl(data)

    assert (caught.value.code, caught.value.line) == ("file_too_large", None)
    assert snapshot(db_path) == before
    assert ledger(db_path) == expect(total=0, effects=0, ready=4)


@pytest.mark.parametrize("make, code", [
    (lambda tmp: tmp / "missing.jsonl", "file_not_found"),
    (lambda tmp: tmp, "file_unreadable"),
], ids=["missing-file", "a-directory"])
def test_a_file_that_cannot_be_read_is_rejected_with_a_file_level_code(
        stocked: Queue, db_path: Path, tmp_path: Path, make, code: str) -> None:
    before = snapshot(db_path)
    with pytest.raises(BatchRejected) as caught:
        stocked.enqueue_file(make(tmp_path))

    assert (caught.value.code, caught.value.line) == (code, None)
    assert snapshot(db_path) == before


def test_an_empty_file_is_an_empty_batch(stocked: Queue, db_path: Path) -> None:
    assert stocked.enqueue_jsonl("\ufeff\r\n\n   \n") == EnqueueResult(inserted=0, duplicates=0)
    assert ledger(db_path) == expect(total=0, effects=0, ready=4)


# -- the files the course shows --------------------------------------------------------------

DATA_REJECTIONS = {
    "reject_duplicate_key.jsonl": ("duplicate_key", 1),
    "reject_event_id.jsonl": ("invalid_event_id", 2),
    "reject_extra_key.jsonl": ("unexpected_key", 1),
    "reject_nan.jsonl": ("non_finite_number", 1),
    "reject_not_json.jsonl": ("invalid_json", 2),
    "reject_not_utf8.jsonl": ("invalid_utf8", 1),
    "reject_payload_not_object.jsonl": ("payload_not_object", 1),
    "conflict.jsonl": ("batch_conflict", 2),
}


def test_every_reject_file_in_data_is_covered() -> None:
    shown = {path.name for path in DATA.glob("reject_*.jsonl")} | {"conflict.jsonl"}
    assert shown == set(DATA_REJECTIONS)


@pytest.mark.parametrize("name, code, line_number",
                         [(name, *expected) for name, expected in DATA_REJECTIONS.items()],
                         ids=DATA_REJECTIONS.keys())
def test_each_bad_input_file_of_the_course_is_rejected_with_its_code(
        stocked: Queue, db_path: Path, name: str, code: str, line_number: int) -> None:
    before = snapshot(db_path)
    with pytest.raises(BatchRejected) as caught:
        stocked.enqueue_file(DATA / name)

    assert (caught.value.code, caught.value.line) == (code, line_number)
    assert snapshot(db_path) == before
    assert ledger(db_path) == expect(total=0, effects=0, ready=4)


@pytest.mark.parametrize("name, events", [("demo.jsonl", 4), ("twenty.jsonl", 20),
                                          ("invalid_payloads.jsonl", 6)])
def test_the_valid_data_files_parse_whole(name: str, events: int) -> None:
    assert len(parse_batch((DATA / name).read_bytes())) == events
