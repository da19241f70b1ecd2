"""JSONL batches: validate the whole envelope, canonicalise each payload.

Nothing here touches a database. ``parse_batch`` either returns a ``Batch``
of distinct events or raises ``BatchRejected`` naming the line and a stable
code, so a batch is refused whole before any transaction starts.

Rejection codes (``BatchRejected.code``):

============================  =================================================
``file_not_found``            the path does not exist (file level)
``file_unreadable``           the path exists but cannot be read (file level)
``file_too_large``            more than 1,000,000 bytes (file level)
``too_many_lines``            more than 1000 non-empty lines (file level)
``invalid_utf8``              the line is not UTF-8
``invalid_json``              the line is not one JSON value
``duplicate_key``             a key repeats inside a JSON object, at any depth
``non_finite_number``         ``NaN``, ``Infinity``, ``-Infinity`` or a number that
                              overflows to infinity (``1e999``), anywhere on the line
``nesting_too_deep``          arrays/objects nested deeper than ``MAX_DEPTH``
``not_an_object``             the line is not a JSON object
``missing_key``               ``event_id`` or ``payload`` is absent
``unexpected_key``            a key other than ``event_id`` and ``payload``
``invalid_event_id``          not an id under the queue's rule (``ids``): for the
                              course's, ``E`` and exactly four ASCII digits
``payload_not_object``        ``payload`` is not a JSON object
``unencodable_string``        a string with no UTF-8 form (a lone surrogate)
``payload_too_large``         the canonical payload exceeds 10,000 bytes
``batch_conflict``            an event id repeats with a different payload
============================  =================================================
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from dataclasses import dataclass
from typing import Any, Iterable

from .errors import BatchConflict, BatchRejected
from .ids import COURSE, matches, why_not

MAX_FILE_BYTES = 1_000_000
MAX_LINES = 1000
MAX_PAYLOAD_BYTES = 10_000
MAX_DEPTH = 64
EVENT_ID = re.compile(r"E[0-9]{4}")  # the course's rule (``ids``)
_BOM = b"\xef\xbb\xbf"
_JSON_SPACE = " \t\r"


@dataclass(frozen=True, slots=True)
class Event:
    """One valid input line: its number, id and canonical payload text."""

    line: int
    event_id: str
    payload: str


@dataclass(frozen=True, slots=True)
class Batch:
    """Distinct events of one validated file, plus the in-file repeats."""

    events: tuple[Event, ...]
    repeats: int
    ids: str = COURSE  # the rule its event ids were checked against (``ids``)

    def __len__(self) -> int:
        return len(self.events)


def payload_digest(payload: str) -> bytes:
    """SHA-256 of a canonical payload's UTF-8 bytes: what the queue keeps of a
    payload forever, and compares a replay with once the payload is pruned."""
    return hashlib.sha256(payload.encode("utf-8")).digest()


def canonical_json(value: Any) -> str:
    """Return the canonical text: sorted keys, no spaces, UTF-8 kept, types kept.

    ``1`` and ``1.0`` stay different. Raises ``ValueError`` for a non-finite
    float (``parse_batch`` refuses those while parsing) and
    ``UnicodeEncodeError`` for a lone surrogate (checked by encoding), which
    ``parse_batch`` turns into ``unencodable_string``.
    """
    text = json.dumps(value, sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False, allow_nan=False)
    text.encode("utf-8")
    return text


def read_batch(path: str | os.PathLike[str], *, ids: str = COURSE) -> Batch:
    """Read and validate a JSONL file; see ``parse_batch`` for the rules."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise BatchRejected("file_not_found", f"no such file: {os.fspath(path)}") from None
    except OSError as exc:
        raise BatchRejected("file_unreadable",
                            f"cannot read {os.fspath(path)}: {exc.strerror or exc}") from None
    return parse_batch(data, ids=ids)


def parse_batch(data: bytes | str, *, ids: str = COURSE) -> Batch:
    """Validate a whole JSONL batch; return its distinct events in file order.

    Event ids are checked against the rule ``ids`` (``ids``: the course's by
    default); ``Queue.enqueue`` checks a batch against its queue's rule again.

    A repeat of an event id with the same canonical payload is counted in
    ``repeats``; with a different payload the batch is rejected
    (``batch_conflict``). Raises ``BatchRejected`` with the line number.
    """
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogatepass")
    if len(data) > MAX_FILE_BYTES:
        raise BatchRejected("file_too_large",
                            f"{len(data):,} bytes; a batch is at most {MAX_FILE_BYTES:,} bytes")
    if data.startswith(_BOM):
        data = data[len(_BOM):]
    lines = [(number, raw) for number, raw in enumerate(data.split(b"\n"), start=1)
             if raw.strip(_JSON_SPACE.encode())]
    if len(lines) > MAX_LINES:
        raise BatchRejected("too_many_lines",
                            f"{len(lines)} non-empty lines; a batch has at most {MAX_LINES}")
    return _dedupe((_parse_line(number, raw, ids) for number, raw in lines), ids)


def require_ids(batch: Batch, rule: str) -> None:
    """Refuse a batch checked against another rule than ``rule`` if an event id
    of it is none under ``rule`` (the first such line, as ``parse_batch`` would)."""
    if batch.ids == rule:
        return
    for event in batch.events:
        if not matches(rule, event.event_id):
            raise BatchRejected("invalid_event_id", f"event_id {why_not(rule, event.event_id)}"
                                f" (a {rule} queue), got {_short(event.event_id)}",
                                line=event.line)


def _dedupe(events: Iterable[Event], ids: str) -> Batch:
    seen: dict[str, Event] = {}
    repeats = 0
    for event in events:
        first = seen.get(event.event_id)
        if first is None:
            seen[event.event_id] = event
        elif first.payload == event.payload:
            repeats += 1
        else:
            raise BatchConflict(
                f"{event.event_id} repeats line {first.line} with a different payload; "
                "a correction needs a new event id",
                line=event.line, event_id=event.event_id)
    return Batch(tuple(seen.values()), repeats, ids)


def _parse_line(number: int, raw: bytes, ids: str) -> Event:
    def reject(code: str, message: str) -> BatchRejected:
        return BatchRejected(code, message, line=number)

    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        bad = raw[exc.start]
        raise reject("invalid_utf8", f"the line's byte {exc.start + 1} (counted from 1), "
                     f"0x{bad:02X}, is not UTF-8") from None
    envelope = _load_json(text, reject)
    if not isinstance(envelope, dict):
        raise reject("not_an_object", f"expected a JSON object, got {_kind(envelope)}")
    _check_keys(envelope, reject)
    event_id, payload = envelope["event_id"], envelope["payload"]
    if not matches(ids, event_id):
        raise reject("invalid_event_id", f"event_id {why_not(ids, event_id)}, "
                     f"got {_short(event_id)}")
    if not isinstance(payload, dict):
        raise reject("payload_not_object", f"payload must be a JSON object, got {_kind(payload)}")
    return Event(number, event_id, _canonical_payload(payload, reject))


def _load_json(text: str, reject: Any) -> Any:
    try:
        value = json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_no_constant,
                           parse_float=_finite_float)
    except _DuplicateKey as exc:
        raise reject("duplicate_key", f"key {exc.args[0]!r} appears twice in one object") from None
    except _NonFinite as exc:
        raise reject("non_finite_number", exc.args[0]) from None
    except RecursionError:
        raise reject("nesting_too_deep", f"nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:  # JSONDecodeError, or an integer too long to convert
        raise reject("invalid_json", _json_reason(exc)) from None
    if _depth(value) > MAX_DEPTH:
        raise reject("nesting_too_deep", f"nested deeper than {MAX_DEPTH} levels")
    return value


def _check_keys(envelope: dict[str, Any], reject: Any) -> None:
    for key in ("event_id", "payload"):
        if key not in envelope:
            raise reject("missing_key", f"the key {key!r} is missing")
    extra = sorted(set(envelope) - {"event_id", "payload"})
    if extra:
        raise reject("unexpected_key",
                     f"only event_id and payload are allowed, found {_short(extra[0])}")


def _canonical_payload(payload: dict[str, Any], reject: Any) -> str:
    try:
        text = canonical_json(payload)
    except UnicodeEncodeError:
        raise reject("unencodable_string",
                     "a string holds a lone surrogate, which has no UTF-8 form") from None
    size = len(text.encode("utf-8"))
    if size > MAX_PAYLOAD_BYTES:
        raise reject("payload_too_large",
                     f"canonical payload is {size:,} bytes; at most {MAX_PAYLOAD_BYTES:,}")
    return text


class _DuplicateKey(ValueError):
    pass


class _NonFinite(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _DuplicateKey(key)
        result[key] = value
    return result


def _no_constant(name: str) -> Any:
    """Refuse ``NaN``, ``Infinity`` and ``-Infinity`` wherever they stand: Python's
    json accepts them, JSON does not, and a database would store them as text."""
    raise _NonFinite(f"{name} is not a JSON number")


def _finite_float(literal: str) -> float:
    """Parse a number with a fraction or an exponent, refusing one that overflows."""
    value = float(literal)
    if math.isinf(value):
        shown = literal if len(literal) <= 40 else literal[:37] + "..."
        raise _NonFinite(f"{shown} overflows to infinity")
    return value


def _depth(value: Any) -> int:
    """Nesting depth of arrays and objects, computed without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, level)
        stack.extend((child, level + 1) for child in children)
    return deepest


def _json_reason(exc: ValueError) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg} at column {exc.colno}"
    return str(exc)


def _kind(value: Any) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
             int: "a number", float: "a number", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
