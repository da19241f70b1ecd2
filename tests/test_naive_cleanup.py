"""The naive cleanup, a deliberately broken contrast: it rolls the done events'
money into ``books`` and deletes their rows, keys included; a replay of a
deleted event is then new to the queue, and the books count its money twice.
``prune`` on the same queue keeps the keys: the replay is a duplicate."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from queue_core import Handler, ModelClock, Queue, audit, drain
from queue_core.lab.story import DEMO_JSONL, naive_cleanup, read_books

E0001 = DEMO_JSONL.splitlines()[0]


def processed(db: Path | str, jsonl: str) -> tuple[Queue, ModelClock]:
    clock = ModelClock(1000)
    queue = Queue(db, clock=clock)
    queue.enqueue_jsonl(jsonl)
    drain(queue, Handler())
    return queue, clock


def test_a_replay_after_the_naive_cleanup_is_new_and_the_books_show_20000_for_a_10000_order(
        store: str) -> None:
    queue, clock = processed(store, E0001)
    cleanup = naive_cleanup(queue)
    assert (cleanup.messages, cleanup.effects, cleanup.journal_rows, cleanup.rolled_cents) == (
        1, 1, 3, 10000)
    books = read_books(queue)
    assert (books.rolled, books.since, books.total) == ({"book": 10000}, {}, 10000)
    assert queue.status().states == {"ready": 0, "leased": 0, "done": 0, "dead": 0}
    clock.advance(3600)
    replay = queue.enqueue_jsonl(E0001)
    assert (replay.inserted, replay.duplicates) == (1, 0)  # the key went with the rows
    drain(queue, Handler())
    books = read_books(queue)
    assert (books.rolled, books.since, books.total) == ({"book": 10000}, {"book": 10000}, 20000)
    # The audit reads the queue, not the books: one order, one effect, nothing wrong.
    snap = audit.snapshot(queue.path)
    assert audit.check(snap) == [] and snap.money == 10000
    assert snap.status.effects == 1 and snap.states() == {"E0001": "done"}
    assert [m.generation for m in snap.messages.values()] == [1]


def test_the_naive_cleanup_of_the_reference_scenario_counts_every_replayed_order_again(
        store: str) -> None:
    queue, clock = processed(store, DEMO_JSONL)  # E0004 (toy) dead, 17000 done
    assert audit.snapshot(queue.path).money == 17000
    cleanup = naive_cleanup(queue)
    assert (cleanup.messages, cleanup.effects, cleanup.journal_rows, cleanup.rolled_cents) == (
        3, 3, 9, 17000)
    snap = audit.snapshot(queue.path)
    assert snap.states() == {"E0004": "dead"} and snap.money == 0 and audit.check(snap) == []
    replay = queue.enqueue_jsonl(DEMO_JSONL)
    assert (replay.inserted, replay.duplicates) == (3, 2)  # only E0004 (dead, kept) and the repeat
    drain(queue, Handler())
    books = read_books(queue)
    assert books.by_category() == {"book": 30000, "pen": 4000} and books.total == 34000
    snap = audit.snapshot(queue.path)
    assert audit.check(snap) == [] and snap.money == 17000 and snap.status.effects == 3
    assert snap.status.states == {"ready": 0, "leased": 0, "done": 3, "dead": 1}


def test_a_second_cleanup_adds_to_the_books_and_keeps_the_money_it_rolled(db_path: Path) -> None:
    queue, _ = processed(db_path, E0001)
    naive_cleanup(queue)
    queue.enqueue_jsonl(DEMO_JSONL.splitlines()[2])  # E0002 pen 2000
    drain(queue, Handler())
    second = naive_cleanup(queue)
    assert (second.messages, second.rolled_cents) == (1, 2000)
    books = read_books(queue)
    assert books.rolled == {"book": 10000, "pen": 2000} and books.since == {}
    with sqlite3.connect(db_path) as conn:
        assert conn.execute("SELECT events FROM books ORDER BY category").fetchall() == [(1,), (1,)]
    conn.close()


def test_the_foreign_keys_forbid_deleting_a_message_without_its_effect(db_path: Path) -> None:
    processed(db_path, E0001)
    conn = sqlite3.connect(db_path)
    conn.execute("PRAGMA foreign_keys = ON")
    with pytest.raises(sqlite3.IntegrityError, match="FOREIGN KEY"):
        conn.execute("DELETE FROM messages WHERE event_id = 'E0001'")
    conn.rollback()
    conn.close()
    assert audit.snapshot(db_path).money == 10000


def test_prune_on_the_same_queue_keeps_the_key_and_the_replay_is_a_duplicate(
        db_path: Path) -> None:
    queue, clock = processed(db_path, DEMO_JSONL)
    queue.enqueue_jsonl('{"event_id": "E0005", "payload": {"category": "pen", "amount_cents": 1}}')
    clock.advance(3600)
    assert queue.prune(60).messages == 3
    replay = queue.enqueue_jsonl(E0001)
    assert (replay.inserted, replay.duplicates) == (0, 1)
    drain(queue, Handler())
    snap = audit.snapshot(db_path)
    assert audit.check(snap) == [] and snap.money == 17001 and snap.status.effects == 4
    assert snap.status.states == {"ready": 0, "leased": 0, "done": 4, "dead": 1}
    assert read_books(queue).total == 17001  # no books: the effects are the whole ledger
