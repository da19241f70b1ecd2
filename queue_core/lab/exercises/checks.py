"""The checks of exercises 1 to 3: a correction by a new event, a batch refused
whole, a dead message recovered. Each reads the learner's database once and
prints one verdict (``verdicts``)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ...audit import Snapshot
from ...ingest import Batch, read_batch
from ...values import Effect
from .setup import E0001_PAYLOAD
from .provenance import calls_made
from .verdicts import (Findings, NotAttempted, Stop, Verdict, bypassed, checked, compare,
                                figures, nudge, path_of, plain, refusal, read, states, untouched)

__all__ = ["check_1", "check_2", "check_3"]

# Exercise 2's right letter (EXERCISES.md explains it) is no public name: tab
# completion must not offer the answer, nor a check accept it passed back.
_WHY_WHOLE_BATCH = "b"
_REFERENCE_EVENTS = {"E0001", "E0002", "E0003", "E0004"}
_WORKER_1 = "`drain(q1, Handler())`"
_WORKER_3 = ("`drain(q3, newer_handler)`, with `newer_handler = Handler().supporting(\"toy\")`: "
             "`Handler()` alone does not know toy and sends E0004 dead again")
_CONFLICT = Path(__file__).resolve().parents[3] / "data" / "conflict.jsonl"
_KEEP_EDIT = ("run the edit cell with a JSONL line that gives E0001 another amount; it keeps "
              "the exception as edit_refusal")


def _amount(payload: str) -> Any:
    try:
        return json.loads(payload).get("amount_cents")
    except (ValueError, AttributeError):
        return None


def _new_events(world: Snapshot, found: Findings, number: int) -> list[str]:
    """Exercise 1's correction: exactly one new event of 2000, processed."""
    new = sorted(set(world.messages) - _REFERENCE_EVENTS)
    again = f"run `start_{number}` again, then send ONE new event of 2000 and drain"
    if not new:
        found.add("a new event id expected, found none", "enqueue a line with a new event id "
                  f"(e.g. E0005, pen 2000), then {_WORKER_1}")
    elif len(new) > 1:
        found.add(f"one correction event expected (a single new event of 2000: the 3 effects of "
                  f"the start plus 1), found {len(new)}: {', '.join(new)}", again)
    else:
        message = world.messages[new[0]]
        if _amount(message.payload) != 2000:
            found.add(f"{new[0]} brings {plain(_amount(message.payload))}, the difference is "
                      "2000", again)
        if message.state == "dead":
            found.add(f"{new[0]} is dead ({message.last_error}): the handler knows book, pen "
                      "and bag", f"run `start_{number}` again and send the correction with a "
                      "category the handler knows")
    return new


def check_1(queue: Any, edit_refusal: Any = None) -> Verdict:
    """Total 19000 by a NEW event, E0001 untouched, its edit refused (``batch_conflict``)."""
    def body() -> Verdict:
        world = read(queue, 1)
        if edit_refusal is None and untouched(world, 1):
            raise NotAttempted("try the edit of E0001 first, then add a new event and process it")
        found = Findings(1, "run `start_1` again, try the edit of E0001 (keep the refusal), "
                            f"then enqueue one new event of 2000 and {_WORKER_1}")
        for wrong in compare(world, 19000, 4, states(done=4, dead=1)):
            found.add(wrong)
        refusal("the edit of E0001", edit_refusal, "batch_conflict", found, queue=queue,
                keep=_KEEP_EDIT, event_id="E0001",
                other="the edit must be E0001 again, same category, another amount, e.g. "
                      '{"event_id": "E0001", "payload": {"category": "book", '
                      '"amount_cents": 12000}}')
        stored = world.messages.get("E0001")
        if stored is None or stored.payload != E0001_PAYLOAD:
            found.add(f"E0001's payload expected {E0001_PAYLOAD}, found "
                      f"{stored.payload if stored else 'no message'} (changed by hand)",
                      "run `start_1` again: an accepted payload is never edited", first=True)
        new = _new_events(world, found, 1)
        nudge(world, found, f"run a worker: {_WORKER_1}")
        bypassed(world, found, queue)
        return found.verdict("E0001 stayed as accepted (its edit was refused: batch_conflict) "
                             f"and {', '.join(new)} added the difference: {figures(world.status)}")
    return checked(1, body)


def check_2(queue: Any, conflict_refusal: Any = None, why: Any = None) -> Verdict:
    """The conflicting batch refused whole (line 2, E0001), E0005 absent, 17000 kept."""
    def body() -> Verdict:
        world = read(queue, 2)
        if conflict_refusal is None and why is None and untouched(world, 2):
            raise NotAttempted("enqueue the conflicting batch and keep what it raises")
        path = conflict_path()
        send = f"`q2.enqueue_file(\"{path}\")`"
        found = Findings(2, f"run `start_2` again, send the file with {send} and keep the refusal")
        for wrong in compare(world, 17000, 3, states(done=3, dead=1)):
            found.add(wrong)
        if "E0005" in world.messages:
            found.add(f"E0005 expected absent, found {world.messages['E0005'].state}",
                      "run `start_2` again: this exercise sends only the conflicting file, "
                      "whose refusal keeps E0005 out")
        keep = (f"set conflict_file to the batch's path, \"{path}\" from the notebook's folder, "
                "and run that cell: it keeps the exception as conflict_refusal")
        if getattr(conflict_refusal, "code", None) == "file_not_found":
            found.add("the conflicting batch: the file was not found (file_not_found): a "
                      "relative path starts from the folder the notebook runs in (notebooks/ "
                      f"for notebook 09), so the batch's path is \"{path}\"",
                      f"set `conflict_file = \"{path}\"` and run that cell again")
        elif refusal("the conflicting batch", conflict_refusal, "batch_conflict", found,
                     queue=queue, keep=keep, event_id="E0001", line=2,
                     other=f"send the whole file with {send}, not a line of your own"):
            _the_course_batch(conflict_refusal, found, send)
        _letter(why, found)
        bypassed(world, found, queue)
        return found.verdict("the batch of data/conflict.jsonl was refused whole at line 2 "
                             "(batch_conflict on E0001), so its E0005 on line 1 was not added: "
                             f"{figures(world.status)}")
    return checked(2, body)


def _the_course_batch(error: BaseException, found: Findings, send: str) -> None:
    """The refused batch must be the lines of data/conflict.jsonl (in any spelling of
    the same JSON): the batch that the refused ``enqueue`` was given, read from the
    refusal's own traceback."""
    sent = _refused_batch(error)
    expected = read_batch(_CONFLICT)
    if sent is not None and _lines(sent) == _lines(expected):
        return
    which = ("a batch whose lines could not be read from the refusal" if sent is None else
             f"a batch of your own ({_describe(sent)}), not data/conflict.jsonl "
             f"({_describe(expected)})")
    found.add(f"the conflicting batch: that refusal came from {which}: the exercise asks what "
              "the course's file does, whose E0005 on line 1 the refusal keeps out",
              f"send the whole file with {send}, not a batch of your own")


def _refused_batch(error: BaseException) -> Batch | None:
    """The ``Batch`` that the engine's ``enqueue`` held when it raised ``error``."""
    frame = error.__traceback__
    while frame is not None:
        batch = frame.tb_frame.f_locals.get("batch")
        if isinstance(batch, Batch) and frame.tb_frame.f_code.co_name == "enqueue":
            return batch
        frame = frame.tb_next
    return None


def _lines(batch: Batch) -> tuple[Any, ...]:
    return batch.repeats, tuple((e.line, e.event_id, e.payload) for e in batch.events)


def _describe(batch: Batch) -> str:
    ids = [event.event_id for event in batch.events]
    return f"{len(ids)} event{'s' if len(ids) != 1 else ''}: {', '.join(ids)}"[:120]


def conflict_path() -> str:
    """The conflicting batch's path as the check's caller writes it: relative to the
    folder it runs in (``../data/conflict.jsonl`` in notebooks/, where notebook 09 runs)."""
    beside = Path("../data/conflict.jsonl")  # notebooks/ and data/ side by side, as shipped
    if beside.is_file() and _CONFLICT.is_file() and beside.read_bytes() == _CONFLICT.read_bytes():
        return beside.as_posix()
    try:
        return Path(os.path.relpath(_CONFLICT, os.getcwd())).as_posix() if _CONFLICT.is_file() \
            else "../data/conflict.jsonl"
    except ValueError:  # another drive than the working folder's
        return "../data/conflict.jsonl"


def _letter(why: Any, found: Findings) -> None:
    """What is wrong with the chosen explanation (a letter, any case, spaces ignored)."""
    chosen = why.strip().strip(")").lower() if isinstance(why, str) else None
    if chosen in ("a", "c"):
        found.add(f"why the whole batch goes: you chose {chosen}), which is not the right "
                  "explanation", "read Hint 3 in EXERCISES.md and choose again")
    elif chosen != _WHY_WHOLE_BATCH:
        found.add("why the whole batch goes: expected one of the letters a, b or c, found "
                  f"{plain(why)}", 'set why_whole_batch to "a", "b" or "c"')


def check_3(queue: Any) -> Verdict:
    """E0004 done by the newer handler after a redrive: 20000, effects 4, done 4, dead 0."""
    def body() -> Verdict:
        world = read(queue, 3)
        if untouched(world, 3) and "claim_batch" in calls_made(path_of(queue)):
            raise Stop("a worker ran on q3 and found nothing to claim: E0004 is still dead, not "
                       "redriven, and no worker takes a dead message, whatever its handler "
                       "knows: a fixed handler alone does not bring E0004 back",
                       "keep your handler that knows toy and redrive E0004 first: "
                       "`q3.redrive(\"E0004\")`, then `drain(q3, newer_handler)`")
        if untouched(world, 3):
            raise NotAttempted("add toy support, redrive E0004, then run a worker")
        found = Findings(3, "run `start_3` again: `newer_handler = Handler().supporting(\"toy\")` "
                            "first, then `q3.redrive(\"E0004\")`, then "
                            "`drain(q3, newer_handler)`")
        for wrong in compare(world, 20000, 4, states(done=4)):
            found.add(wrong)
        new = sorted(set(world.messages) - _REFERENCE_EVENTS)
        if new:
            found.add(f"no new event expected, found {', '.join(new)}: the 3000 must come from "
                      "E0004 itself", "run `start_3` again and recover E0004 instead")
        _recovery(world, found)
        nudge(world, found, f"run a worker with the handler that knows toy: {_WORKER_3}")
        bypassed(world, found, queue)
        steps = [t for t in world.journal if t.event_id == "E0004" and t.reason == "redrive"]
        wasted = ("" if len(steps) < 2
                  else f" ({len(steps) - 1} redrive before the fix went dead again)")
        return found.verdict(f"toy support first, then redrive: {figures(world.status)}{wasted}")
    return checked(3, body)


def _recovery(world: Snapshot, found: Findings) -> None:
    """E0004: redriven, then done with its own effect, toy 3000."""
    journal = [t for t in world.journal if t.event_id == "E0004"]
    redrives = [t.seq for t in journal if t.reason == "redrive"]
    if not redrives:
        found.add("a redrive of E0004 expected, found none", "`q3.redrive(\"E0004\")`, then "
                  "`drain(q3, newer_handler)` with the handler that knows toy")
    elif journal[-1].reason == "invalid_payload" and journal[-1].seq > redrives[-1]:
        found.add("E0004 went dead again after your last redrive: the handler that processed "
                  "it did not know toy", "redrive E0004 once more and `drain(q3, newer_handler)` "
                  "with `newer_handler = Handler().supporting(\"toy\")` (Hint 3)")
    toy = world.effects.get("E0004")
    if toy != Effect("toy", 3000):
        found.add(f"E0004's effect expected toy 3000, found {toy or 'none'}")
