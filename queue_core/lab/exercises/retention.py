"""Exercise 8: prune, then prove that a replay of E0001 is a duplicate and the money unchanged.

    >>> q8 = exercises.start_8(workdir)     # the reference scenario's end, an hour later
    >>> q8.prune(...)                       # the learner's retention policy
    >>> replay_8 = q8.enqueue_jsonl(E0001_LINE)
    >>> exercises.check_8(q8, replay_8)     # one verdict, never an exception

The check reads the learner's file once (``verdicts.read``: the provenance of
its contents included) and asks: is E0001 pruned (its payload and journal gone,
its key, digest, effect and compacted record kept)? Are all the keys still
there, with no ``books`` beside the queue (the naive cleanup of notebook 13
deletes them)? Are money, effects and states those of the start (17000, 3
effects, done 3, dead 1)? And did the learner's replay, what ``enqueue_jsonl``
returned, count one duplicate and insert nothing? Another payload under
E0001 is refused as ``batch_conflict``, which is no replay.
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
from typing import Any

from ...audit import Snapshot
from ...clock import ModelClock
from ...queue import Queue
from ...errors import QueueError
from ...sqlite import connect_readonly, has_table
from ...values import EnqueueResult
from ..story.scenario import START
from .provenance import hand_out
from .setup import _load_reference, folder_refused, fresh
from .verdicts import (Findings, NotAttempted, Verdict, bypassed, checked, compare, figures,
                       plain, read, states, untouched)

__all__ = ["check_8", "start_8"]

AN_HOUR = 3600
_E0001_LINE = '{"event_id": "E0001", "payload": {"category": "book", "amount_cents": 10000}}'
_AGAIN = ("run `start_8` again, prune q8 with `q8.prune(older_than)`, then replay E0001 "
          "once: `replay_8 = q8.enqueue_jsonl(E0001_LINE)`")
_KEEP = "keep what the replay returned: `replay_8 = q8.enqueue_jsonl(E0001_LINE)`"
_REFERENCE = ("E0001", "E0002", "E0003", "E0004")


def start_8(workdir: str | os.PathLike[str]) -> Any:
    """Exercise 8: the reference scenario's final state (total 17000, E0004 dead), an hour
    after it ended (t=4602)."""
    if folder_refused(workdir, 8):
        return None
    queue = _load_reference(fresh(workdir, "exercise_8"))
    queue.clock.set(START + 2 + AN_HOUR)  # type: ignore[attr-defined]
    return hand_out(queue, 8)


def check_8(queue: Any, replay: Any = None) -> Verdict:
    """E0001 pruned with its key kept; the replay a duplicate; 17000, 3 effects, done 3, dead 1."""
    def body() -> Verdict:
        world = read(queue, 8)
        if replay is None and untouched(world, 8, start_8):
            raise NotAttempted("prune q8 first (`q8.prune(older_than)`), then replay E0001 and "
                               "keep what enqueue_jsonl returns")
        found = Findings(8, _AGAIN)
        bypassed(world, found, queue)
        _keys_kept(world, queue, found)
        if not found:
            _pruned(world, queue, found)
        for wrong in compare(world, 17000, 3, states(done=3, dead=1)):
            found.add(wrong)
        _replay(replay, found)
        if not found:
            _replayed_after_the_prune(queue, found)
        if not found:
            _replayed_on_a_copy(queue, found)
        return found.verdict("E0001's payload and journal are gone and its key, digest, effect "
                             "and compacted record kept; the replay of E0001 on q8 after the "
                             "prune (an enqueue of E0001's line, which q8's witness records) "
                             "was a duplicate (inserted 0, duplicates 1) and the money did not "
                             "move: "
                             f"{figures(world.status)}")
    return checked(8, body)


def _keys_kept(world: Snapshot, queue: Any, found: Findings) -> None:
    """The naive cleanup's traces: keys deleted with their rows, a ``books`` table, and
    E0001 enqueued again as a new event."""
    gone = [event_id for event_id in _REFERENCE if event_id not in world.messages]
    reborn = any(step.event_id == "E0001" and step.from_state is None and step.at != START
                 for step in world.journal)
    books = _has_books(queue)
    if not (gone or reborn or books):
        return
    said = []
    if gone:
        said.append(f"the keys of {', '.join(gone)} were deleted with their rows")
    if reborn:
        said.append("E0001 was enqueued again as a new event, so its money is counted twice")
    if books:
        said.append("a books table beside the queue holds money rolled out of it")
    found.add(f"{'; '.join(said)}: that is the naive cleanup of notebook 13, which forgets the "
              "keys, so a replay of a deleted event is new to the queue",
              "run `start_8` again and use `q8.prune(older_than)`, which keeps every key, "
              "digest and effect", first=True)


def _has_books(queue: Any) -> bool:
    conn = connect_readonly(queue.path if hasattr(queue, "path") else queue)
    try:
        return has_table(conn, "books")
    finally:
        conn.close()


def _pruned(world: Snapshot, queue: Any, found: Findings) -> None:
    """E0001 pruned: no payload, a compacted record, no journal rows of its own."""
    e0001 = world.messages["E0001"]
    if e0001.payload is None and "E0001" in world.compacted:
        return
    now = getattr(getattr(queue, "clock", None), "now", lambda: None)()
    found.add("E0001 still holds its payload and journal: no prune has reached it",
              f"prune q8 with an `older_than` that E0001 passed: it finished at t={START}, "
              f"q8's clock is at t={now}, so `q8.prune({now - START if now else 60})` or less "
              "prunes it")


def _replayed_on_a_copy(queue: Any, found: Findings) -> None:
    """The check's own proof: the same replay, on a copy of q8's file, is a duplicate."""
    with tempfile.TemporaryDirectory(prefix="queue-exercise-8-") as folder:
        copy = os.path.join(folder, "copy.sqlite3")
        source, target = connect_readonly(queue.path), sqlite3.connect(copy)
        try:
            source.backup(target)
        finally:
            source.close()
            target.close()
        answer = Queue(copy, clock=ModelClock(START + 2 + AN_HOUR)).enqueue_jsonl(_E0001_LINE)
    if (answer.inserted, answer.duplicates) != (0, 1):
        found.add(f"a replay of E0001 on a copy of q8 inserts {answer.inserted} and counts "
                  f"{answer.duplicates} duplicates: q8 does not hold E0001's key as a start "
                  "and a prune leave it", _AGAIN)


def _replayed_after_the_prune(queue: Any, found: Findings) -> None:
    """The learner's own replay of E0001 ran on q8 after its last change (the
    prune), and changed nothing: its witness holds an enqueue of E0001's line
    alone that found and left the same content, after the last call that
    changed it."""
    witness = getattr(queue, "witness", None)
    calls = [entry for entry in (witness.entries() or []) if entry.get("kind") == "call"
             and witness.genuine(entry)] if witness is not None else []
    changed = max((i for i, entry in enumerate(calls) if entry["before"] != entry["after"]),
                  default=-1)
    replays = [entry.get("events") or [] for entry in calls[changed + 1:]
               if entry.get("what") == "enqueue" and entry["before"] == entry["after"]]
    if ["E0001"] in replays:
        return
    if replays:
        carried = ", ".join(sorted({event for events in replays for event in events})) or "none"
        found.add(f"the replay after the prune carried {carried}, not E0001's line alone: the "
                  "exercise asks whether E0001, pruned, is still known as a duplicate",
                  "replay E0001's own line on q8: `replay_8 = q8.enqueue_jsonl(E0001_LINE)`")
        return
    found.add("no replay of E0001 ran on q8 after its prune: the replay must meet the pruned "
              "file (a replay before the prune proves nothing about retention, and a result "
              "typed by hand is no replay)",
              "prune first, then replay on q8: `replay_8 = q8.enqueue_jsonl(E0001_LINE)`")


def _replay(replay: Any, found: Findings) -> None:
    """What the learner's replay of E0001 got: one duplicate, nothing inserted."""
    if replay is None:
        found.add("the replay of E0001: expected what q8.enqueue_jsonl returned, found none",
                  _KEEP)
    elif isinstance(replay, QueueError):
        if replay.code == "batch_conflict":
            found.add("the replay was refused (batch_conflict): its line gives E0001 another "
                      "payload, and a replay is the same event again",
                      "replay E0001's own line, `E0001_LINE`, unchanged")
        else:
            found.add(f"the replay was refused ({replay.code}), not counted",
                      "replay E0001's own line, `E0001_LINE`, unchanged")
    elif not isinstance(replay, EnqueueResult):
        found.add(f"the replay of E0001: expected what q8.enqueue_jsonl returned (an "
                  f"EnqueueResult), found {plain(replay)}", _KEEP)
    elif replay.inserted:
        found.add(f"the replay inserted {replay.inserted} event"
                  f"{'s' if replay.inserted != 1 else ''}: where it ran, E0001's key "
                  "was not there (another queue, or one whose history was deleted)",
                  f"on q8 itself, after the prune: {_KEEP}")
    elif replay.duplicates != 1:
        found.add(f"the replay counted {replay.duplicates} duplicates, one expected (E0001's "
                  "line once)", f"replay E0001's line once: {_KEEP}")
