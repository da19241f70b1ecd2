"""Rules that only one line of the engine guards, each pinned by an example:
take the line away and one of these tests fails."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from conftest import snapshot
from observe import expect, ledger, row
from queue_core import Effect, Handler, LeaseLost, ModelClock, Queue
from queue_core.audit import findings
from queue_core.ingest import parse_batch

ONE_BOOK = '{"event_id": "E0001", "payload": {"category": "book", "amount_cents": 10000}}\n'


class GenerationBumpingHandler(Handler):
    """A handler during whose work another claim took the message over: it bumps
    the stored generation inside the ACK's own transaction, where only the
    guarded done-UPDATE can still see it."""

    def apply(self, conn: sqlite3.Connection, event_id: str, payload: Any) -> Effect:
        effect = super().apply(conn, event_id, payload)
        conn.execute("UPDATE messages SET generation = generation + 1 WHERE event_id = ?",
                     (event_id,))
        return effect


def test_an_ack_whose_generation_moved_during_the_handler_is_stale_and_writes_nothing(
        queue: Queue, db_path: Path) -> None:
    queue.enqueue_jsonl(ONE_BOOK)
    lease = queue.claim()
    assert lease is not None
    before = snapshot(db_path)

    with pytest.raises(LeaseLost) as lost:
        queue.complete(lease, GenerationBumpingHandler())

    assert lost.value.code == "stale_generation"
    assert snapshot(db_path) == before
    assert ledger(db_path) == expect(total=0, effects=0, leased=1)
    assert findings(db_path) == []


def test_a_raw_line_separator_inside_a_json_string_does_not_split_the_line() -> None:
    # Built by hand: json.dumps would escape U+2028, and the parser would never see it raw.
    text = '{"event_id": "E0100", "payload": {"note": "a\u2028b", "category": "pen"}}\n'
    assert "\u2028" in text and "\\u2028" not in text

    batch = parse_batch(text.encode("utf-8"))

    assert len(batch) == 1
    assert batch.events[0].payload == '{"category":"pen","note":"a\u2028b"}'


def test_fail_at_the_lease_deadline_is_refused_as_expired_and_changes_nothing(
        queue: Queue, model_clock: ModelClock, db_path: Path) -> None:
    queue.enqueue_jsonl(ONE_BOOK)
    lease = queue.claim()
    assert lease is not None and lease.lease_until == 1002
    model_clock.set(lease.lease_until)  # now == lease_until: the lease has just ended
    before = snapshot(db_path)

    with pytest.raises(LeaseLost) as lost:
        queue.fail(lease, "transient_error")

    assert lost.value.code == "lease_expired"
    assert snapshot(db_path) == before
    assert row(db_path, "E0001")["state"] == "leased"
    assert ledger(db_path) == expect(total=0, effects=0, leased=1)


@pytest.mark.parametrize("call", ["complete", "complete_batch", "fail", "extend"])
def test_anything_but_a_lease_is_a_type_error_before_the_database_is_touched(
        queue: Queue, db_path: Path, call: str) -> None:
    queue.enqueue_jsonl(ONE_BOOK)
    assert queue.claim() is not None
    before = snapshot(db_path)
    attempts = {"complete": lambda: queue.complete(None, Handler()),  # type: ignore[arg-type]
                "complete_batch": lambda: queue.complete_batch([None], Handler()),  # type: ignore[list-item]
                "fail": lambda: queue.fail("E0001"),  # type: ignore[arg-type]
                "extend": lambda: queue.extend({"event_id": "E0001"}, 5)}  # type: ignore[arg-type]

    with pytest.raises(TypeError, match="expected the Lease that claim"):
        attempts[call]()

    assert snapshot(db_path) == before
    assert ledger(db_path) == expect(total=0, effects=0, leased=1)
