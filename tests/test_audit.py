"""The shared audit: each finding provoked once by a deliberate edit of a real
file and reported by name; a healthy file gives none; a snapshot taken while
real workers run never disagrees with itself."""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import replace
from pathlib import Path

import pytest

from conftest import DATA
from queue_core import Handler, ModelClock, Queue, UnusableFile, drain
from queue_core.audit import FINDINGS, check, findings, snapshot
from queue_core.lab.story.child import collect, reap, run_child
from queue_core.lab.story.scenario import DEMO_JSONL


def played(db_path: Path) -> Queue:
    """The demo batch run to its end at t=1000: E0001-E0003 done, E0004 dead."""
    queue = Queue(db_path, clock=ModelClock(1000), lease_seconds=2)
    queue.enqueue_jsonl(DEMO_JSONL)
    drain(queue, Handler())
    return queue


def edit(db_path: Path, *statements: str) -> None:
    """Change the file behind the protocol, as its owner with direct SQL could.
    The schema's checks are switched off on this connection only, so that even
    a step the schema refuses can be planted to see the audit name it."""
    conn = sqlite3.connect(db_path, isolation_level=None)
    try:
        conn.execute("PRAGMA ignore_check_constraints = ON")
        conn.execute("BEGIN IMMEDIATE")
        for statement in statements:
            conn.execute(statement)
        conn.execute("COMMIT")
    finally:
        conn.close()


def test_a_healthy_file_gives_no_finding(db_path: Path) -> None:
    queue = played(db_path)

    assert findings(db_path) == [] and queue.audit() == []
    snap = snapshot(db_path)
    assert (snap.money, snap.status.total, snap.status.effects) == (17000, 17000, 3)
    assert snap.states() == {"E0001": "done", "E0002": "done", "E0003": "done", "E0004": "dead"}


EDITS: dict[str, tuple[str, ...]] = {
    "foreign_key_check": ("PRAGMA foreign_keys = OFF",
                          "INSERT INTO transitions (at, event_id, from_state, to_state, generation,"
                          " attempts, reason) VALUES (1000, 'E0009', NULL, 'ready', 0, 0, 'x')"),
    "done_without_effect": ("DELETE FROM effects WHERE event_id = 'E0002'",),
    "effect_without_done": ("INSERT INTO effects VALUES ('E0004', 'toy', 3000)",),
    "effect_differs": ("UPDATE effects SET amount_cents = 11000 WHERE event_id = 'E0001'",),
    "dead_without_reason": ("UPDATE messages SET last_error = NULL WHERE event_id = 'E0004'",),
    "journal_disagrees": ("UPDATE messages SET state = 'ready', last_error = NULL "
                          "WHERE event_id = 'E0004'",),
    "illegal_edge": ("INSERT INTO transitions (at, event_id, from_state, to_state, generation, "
                     "attempts, reason) VALUES (1000, 'E0004', 'dead', 'done', 1, 1, 'x')",
                     "UPDATE messages SET state = 'done', last_error = NULL, "
                     "finished_at = 1000 WHERE event_id = 'E0004'",
                     "INSERT INTO effects VALUES ('E0004', 'toy', 3000)"),
    "generation_skipped": ("UPDATE messages SET generation = 5 WHERE event_id = 'E0003'",),
    "double_ack": ("INSERT INTO transitions (at, event_id, from_state, to_state, generation, "
                   "attempts, reason) SELECT at, event_id, 'done', 'ready', generation, attempts, "
                   "'x' FROM transitions WHERE event_id = 'E0001' AND to_state = 'done'",
                   "INSERT INTO transitions (at, event_id, from_state, to_state, generation, "
                   "attempts, reason) VALUES (1000, 'E0001', 'ready', 'leased', 2, 2, 'claimed')",
                   "INSERT INTO transitions (at, event_id, from_state, to_state, generation, "
                   "attempts, reason) VALUES (1000, 'E0001', 'leased', 'done', 2, 2, 'completed')",
                   "UPDATE messages SET generation = 2, attempts = 2 WHERE event_id = 'E0001'"),
    "stale_lease_accepted": ("UPDATE transitions SET generation = 0 "
                             "WHERE event_id = 'E0002' AND to_state = 'done'",),
    "digest_differs": ("UPDATE messages SET payload_sha256 = zeroblob(32) "
                       "WHERE event_id = 'E0001'",),
    # a pruned message whose compacted record was deleted (the payload dropped by hand)
    "history_missing": ("DELETE FROM transitions WHERE event_id = 'E0001'",
                        "UPDATE messages SET payload = NULL WHERE event_id = 'E0001'"),
}


def test_every_finding_the_audit_knows_has_an_edit_that_provokes_it() -> None:
    assert set(EDITS) | {"integrity_check", "effect_written_twice", "money_mismatch"} == \
        set(FINDINGS)


@pytest.mark.parametrize("name", sorted(EDITS))
def test_each_deliberate_edit_is_reported_by_name(db_path: Path, name: str) -> None:
    played(db_path)

    edit(db_path, *EDITS[name])

    found = findings(db_path)
    assert name in {f.name for f in found}, found
    assert all(f.name in FINDINGS and str(f).startswith(f.name) for f in found)


@pytest.mark.parametrize("planted, detail", [
    ("INSERT INTO transitions (at, event_id, from_state, to_state, generation, attempts, reason)"
     " VALUES (1000, 'E0009', NULL, 'ready', 0, 0, 'x')",
     "transitions row {seq} points at a missing message "
     "(the foreign key from transitions to messages)"),
    ("INSERT INTO effects VALUES ('E0009', 'book', 100)",  # WITHOUT ROWID: no row number
     "a row of effects points at a missing message (the foreign key from effects to messages)"),
], ids=["journal-row", "effect-row"])
def test_a_row_whose_message_is_missing_is_named_in_plain_words(
        db_path: Path, planted: str, detail: str) -> None:
    played(db_path)
    edit(db_path, "PRAGMA foreign_keys = OFF", planted)
    seq = max(step.seq for step in snapshot(db_path).journal)

    found = [f for f in findings(db_path) if f.name == "foreign_key_check"]

    assert [str(f) for f in found] == [f"foreign_key_check: {detail.format(seq=seq)}"]


def test_an_effect_written_twice_in_a_ledger_without_a_key_is_reported(db_path: Path) -> None:
    played(db_path)
    edit(db_path, "CREATE TABLE naive_ledger (seq INTEGER PRIMARY KEY, event_id TEXT, "
                  "category TEXT, amount_cents INTEGER)",
         "INSERT INTO naive_ledger (event_id, category, amount_cents) VALUES ('E0001', 'book', 10000)")

    snap = snapshot(db_path)

    assert [f.name for f in check(snap)] == ["effect_written_twice"]
    assert (snap.money, snap.status.total) == (27000, 17000)  # the double is in the ledger


def test_an_index_that_no_longer_matches_its_table_is_reported_by_the_integrity_check(
        db_path: Path) -> None:
    played(db_path)
    # Redefine the partial index behind SQLite's back: its stored entries now
    # disagree with what its definition says they should hold.
    edit(db_path, "PRAGMA writable_schema = ON",
         "UPDATE sqlite_master SET sql = replace(sql, 'payload IS NOT NULL', 'payload IS NULL') "
         "WHERE name = 'messages_live'")

    assert "integrity_check" in {f.name for f in findings(db_path)}


def test_totals_that_are_not_the_sum_of_the_effect_rows_are_reported(db_path: Path) -> None:
    # One read transaction makes the stored totals and the rows agree; the
    # check is what would notice if a snapshot ever mixed two moments.
    played(db_path)
    snap = snapshot(db_path)
    mixed = replace(snap, status=replace(snap.status, effects=4, totals={"book": 25000}))

    assert [f.name for f in check(mixed)] == ["money_mismatch"]
    assert check(snap) == []


def test_a_snapshot_never_creates_a_file(tmp_path: Path) -> None:
    with pytest.raises(UnusableFile) as refused:  # refused as every command refuses it
        snapshot(tmp_path / "missing.sqlite3")
    assert refused.value.code == "no_queue_file"
    assert list(tmp_path.iterdir()) == []


def test_status_taken_while_two_workers_run_never_mixes_two_moments(tmp_path: Path) -> None:
    db = tmp_path / "busy.sqlite3"
    queue = Queue(db, clock=ModelClock(1000))
    queue.enqueue_file(DATA / "twenty.jsonl")
    amounts = {m.event_id: json.loads(m.payload)["amount_cents"]
               for m in queue.messages()}
    procs = [run_child(db, now=1000, mode="drain", wait=False) for _ in range(2)]
    seen = []
    try:
        while any(p.poll() is None for p in procs):  # type: ignore[union-attr]
            status = queue.status()
            seen.append(status)
            done = status.states["done"]
            assert status.effects == done, status  # each done message has its effect
            assert status.total == sum(status.totals.values())
            time.sleep(0.001)
        for proc in procs:
            collect(proc)  # type: ignore[arg-type]
    finally:
        reap(procs)  # type: ignore[arg-type]
    final = queue.status()
    assert (final.effects, final.states["done"], final.total) == (20, 20, sum(amounts.values()))
    assert len(seen) > 3 and findings(db) == []
