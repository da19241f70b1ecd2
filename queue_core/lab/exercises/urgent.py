"""Exercise 10: an urgent message overtakes a backlog, and the backlog still finishes.

    >>> q10 = exercises.start_10(workdir)    # six bulk messages due since t=1000 to 1050, t=1120
    >>> q10.enqueue_jsonl(REFUND_LINE, priority=...)
    >>> drain(q10, Handler().supporting("refund"))
    >>> exercises.check_10(q10)              # one verdict, never an exception

The check reads the learner's file once (``verdicts.read``: the provenance of
its contents included) and asks: was the refund, E1007, claimed before every
bulk message, after it was enqueued, through its priority (the claim's order,
``priority.CLAIM_ORDER``), and done by that first claim? Were the bulk
messages all done too, none left waiting? Are money, effects and states exact
(14500, 7 effects, done 7)? And did the order come from the enqueue's
priority, not from an ``available_at`` or a ``priority`` changed by hand, a
claim written into the journal by hand, or a clock set back? The least
priority that puts the refund first is computed from the package's own rule
(``priority.head_start``), so the verdict says which one would have done it.
A refund enqueued again with another priority is a duplicate that keeps the
stored one, and the verdict says so; before any worker has run, it says that
a worker is what comes next.
"""

from __future__ import annotations

import json
import os
from typing import Any

from ...audit import Snapshot
from ...priority import (CLAIM_ORDER, DEFAULT_PRIORITY, HEAD_START_SECONDS, HIGHEST, PRIORITIES,
                         head_start)
from ...values import Message, Transition
from ..story.scenario import START
from .provenance import hand_out, journal_by_hand, signed_calls
from .setup import folder_refused, fresh
from .verdicts import (Findings, NotAttempted, Verdict, bypassed, checked, compare, figures,
                       path_of, read, states, untouched)

__all__ = ["check_10", "start_10"]

# The backlog: six bulk messages of priority 0, one every 10 s from t=1000.
BACKLOG = (("E1001", "book", 4000), ("E1002", "pen", 500), ("E1003", "bag", 1500),
           ("E1004", "book", 3000), ("E1005", "pen", 1000), ("E1006", "bag", 2000))
EVERY = 10
NOW = START + 120  # the refund arrives two minutes after the first bulk message became due
REFUND = "E1007"
REFUND_LINE = json.dumps({"event_id": REFUND, "payload": {"category": "refund",
                                                          "amount_cents": 2500}})
TOTAL, EFFECTS = 14500, 7
BULK = tuple(event_id for event_id, _, _ in BACKLOG)
_ENQUEUE = "`q10.enqueue_jsonl(REFUND_LINE, priority=...)`"
_WORKER = "`drain(q10, handler_10)`"
_AGAIN = f"run `start_10` again, then {_ENQUEUE} and {_WORKER}"
_ORDINALS = ("first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth")


def start_10(workdir: str | os.PathLike[str]) -> Any:
    """Exercise 10: six bulk messages (priority 0) enqueued one every 10 s from t=1000,
    all due and none claimed; the clock at t=1120, when the refund arrives."""
    if folder_refused(workdir, 10):
        return None
    queue = fresh(workdir, "exercise_10")
    for number, (event_id, category, amount_cents) in enumerate(BACKLOG):
        queue.clock.set(START + number * EVERY)  # type: ignore[attr-defined]
        queue.enqueue_jsonl(json.dumps({"event_id": event_id, "payload": {
            "category": category, "amount_cents": amount_cents}}))
    queue.clock.set(NOW)  # type: ignore[attr-defined]
    return hand_out(queue, 10)


def check_10(queue: Any) -> Verdict:
    """E1007 claimed before every bulk message by its priority, and every message done:
    14500, 7 effects, done 7."""
    def body() -> Verdict:
        world = read(queue, 10)
        if untouched(world, 10, start_10):
            raise NotAttempted(f"enqueue the refund with a priority, {_ENQUEUE}, then run a "
                               f"worker: {_WORKER}")
        found = Findings(10, _AGAIN)
        bypassed(world, found, queue)
        _moved_by_hand(world, queue, found)
        _forged(world, queue, found)
        _events(world, found)
        if REFUND in world.messages:
            _repeated(world, queue, found)
            _order(world, found)
        idle = _idle(world, found)
        for wrong in compare(world, TOTAL, EFFECTS, states(done=len(BACKLOG) + 1)):
            found.add(wrong)
        if not idle:
            _unfinished(world, found)
        return found.verdict(_solved(world))
    return checked(10, body)


# -- how the order was reached -------------------------------------------------------

def _steps(world: Snapshot, event_id: str) -> list[Transition]:
    return [step for step in world.journal if step.event_id == event_id]


def _given_priority(queue: Any) -> int | None:
    """The priority that the enqueue which stored the refund was given (its witness entry)."""
    for entry in signed_calls(path_of(queue)):
        if entry.get("what") == "enqueue" and REFUND in (entry.get("events") or ()) \
                and entry["before"] != entry["after"]:
            return entry.get("priority")
    return None


def _repeated(world: Snapshot, queue: Any, found: Findings) -> None:
    """An enqueue of the refund again, with another priority than the stored one, while
    the stored one does not put it first: a duplicate, which keeps the stored priority."""
    refund = world.messages[REFUND]
    repeats = sorted({entry.get("priority") for entry in signed_calls(path_of(queue))
                      if entry.get("what") == "enqueue" and REFUND in (entry.get("events") or ())
                      and entry["before"] == entry["after"]} - {refund.priority, None})
    bulk = [world.messages[e] for e in BULK if e in world.messages]
    if not repeats or not bulk or key(refund) < min(key(message) for message in bulk):
        return
    given = " and ".join(str(priority) for priority in repeats)
    found.add(f"{REFUND} was enqueued again with priority {given}, but a repeat of a stored "
              f"event is a duplicate and changes nothing: the refund kept the priority it was "
              f"stored with, {refund.priority}, and only `start_10` starts over, with the "
              "refund not yet enqueued", _raise(world, refund))


def _moved_by_hand(world: Snapshot, queue: Any, found: Findings) -> None:
    """An ``available_at`` or a ``priority`` that no call of q10's set: each message is
    due from its enqueue on until a retry, an expired lease or a redrive moves it, and
    keeps the priority its enqueue gave it."""
    given = {event_id: DEFAULT_PRIORITY for event_id in BULK}  # as start_10 enqueued them
    if (refund := _given_priority(queue)) is not None:
        given[REFUND] = refund
    again = ("run `start_10` again and let the enqueue give the refund its place: "
             f"{_ENQUEUE}")
    for event_id, priority in given.items():
        stored = world.messages.get(event_id)
        if stored is not None and stored.priority != priority:
            found.add(f"{event_id}'s priority is {stored.priority}, but q10's enqueue gave it "
                      f"{priority}: an UPDATE of its priority with SQL of your own", again)
    moved = []
    for event_id in (*BULK, REFUND):
        stored, steps = world.messages.get(event_id), _steps(world, event_id)
        enqueued = [step.at for step in steps if step.reason == "enqueued"]
        settled = {step.reason for step in steps} <= {"enqueued", "claimed", "completed",
                                                      "released"}
        if stored is not None and enqueued and settled and stored.available_at != enqueued[0]:
            moved.append(f"{event_id}'s from {enqueued[0]} to {stored.available_at}")
    if moved:
        one = len(moved) == 1
        found.add(f"available_at changed with SQL of your own: {', '.join(moved)} (nothing "
                  f"retried {'it' if one else 'them'}, so {'it' if one else 'each'} stays due "
                  "from its enqueue on): a place in the order moved by hand, not by a priority",
                  again)


def _forged(world: Snapshot, queue: Any, found: Findings) -> None:
    """Journal rows no call wrote, and a state reached without a claim in the journal."""
    by_hand = set(journal_by_hand(path_of(queue)))
    rows = [step for step in world.journal if step.seq in by_hand]
    claims = [step for step in rows if step.reason == "claimed"]
    again = ("run `start_10` again: only a claim of q10's hands a message out "
             f"(`q10.claim()`, or {_WORKER})")
    who = "(SQL of your own, or a Queue of your own on its file)"
    if claims:
        said = ", ".join(f"{step.seq} ({step.event_id} claimed at t={step.at})"
                         for step in claims[:3])
        found.add(f"a forged claim: the journal's row{'s' if len(claims) > 1 else ''} {said} "
                  f"{'were' if len(claims) > 1 else 'was'} written by no call on q10 {who}",
                  again)
    elif rows:
        said = ", ".join(f"{step.seq} ({step.event_id} {step.reason})" for step in rows[:3])
        found.add(f"journal rows written by no call on q10 {who}: {said}", again)
    unclaimed = sorted(event_id for event_id, message in world.messages.items()
                       if message.state in ("leased", "done")
                       and not any(step.reason == "claimed" for step in _steps(world, event_id)))
    if unclaimed:
        found.add(f"{', '.join(unclaimed)} {'is' if len(unclaimed) == 1 else 'are'} "
                  f"{world.messages[unclaimed[0]].state} without a claim in q10's journal: a "
                  "state written by hand", again)


def _events(world: Snapshot, found: Findings) -> None:
    """The refund, and nothing but the refund, added to the backlog."""
    others = sorted(set(world.messages) - {*BULK, REFUND})
    if others:
        found.add(f"no event but the refund {REFUND} expected, found {', '.join(others)}",
                  f"run `start_10` again and enqueue REFUND_LINE alone: {_ENQUEUE}")
    if REFUND not in world.messages:
        early = [event_id for event_id in BULK if _first_claim(world, event_id) is not None]
        found.add(f"the refund {REFUND} was never enqueued" + (
            f": a worker processed the backlog ({', '.join(early)}) without it" if early else ""),
            f"run `start_10` again, then {_ENQUEUE} first and {_WORKER}" if early
            else f"{_ENQUEUE}, then {_WORKER}")


def _first_claim(world: Snapshot, event_id: str) -> Transition | None:
    return next((step for step in _steps(world, event_id) if step.reason == "claimed"), None)


def key(message: Message) -> tuple[int, str]:
    """A message's place in the claim's order (``CLAIM_ORDER``, then its event id)."""
    return message.available_at - head_start(message.priority), message.event_id


def least_priority(due_at: int, ahead: list[Message]) -> int | None:
    """The least priority that puts a message due at ``due_at`` before every one of
    ``ahead`` in the claim's order; None when none does (they were due too long before)."""
    first = min(key(message) for message in ahead)
    return next((p for p in PRIORITIES if (due_at - head_start(p), REFUND) < first), None)


def _order(world: Snapshot, found: Findings) -> None:
    """The refund's claim before every bulk message's, and after its own enqueue."""
    refund = world.messages[REFUND]
    enqueued = next((s for s in _steps(world, REFUND) if s.reason == "enqueued"), None)
    if enqueued is not None and enqueued.at < NOW:
        found.add(f"the refund was enqueued at t={enqueued.at}, before t={NOW} where start_10 "
                  "left q10's clock: a clock set back puts a message ahead without any "
                  "priority", "run `start_10` again and leave q10's clock alone: the "
                  "refund's priority must put it first")
    claim = _first_claim(world, REFUND)
    since = enqueued.seq if enqueued is not None else 0
    early = [e for e in BULK if (c := _first_claim(world, e)) is not None and c.seq < since]
    if early:
        found.add(f"{', '.join(early)} {'was' if len(early) == 1 else 'were'} claimed before "
                  "the refund was enqueued: a worker ran before it arrived, so there was "
                  "nothing it could overtake", f"run `start_10` again: first {_ENQUEUE}, then "
                  f"{_WORKER}")
        return
    if claim is None:
        return  # not claimed at all: the states say what it is (ready: no worker yet)
    ahead = [e for e in BULK if (c := _first_claim(world, e)) is not None and c.seq < claim.seq]
    if ahead:
        found.add(_behind(world, refund, ahead), _raise(world, refund))
    else:
        _done_by_first_claim(world, claim, found)


def _done_by_first_claim(world: Snapshot, claim: Transition, found: Findings) -> None:
    """The refund, claimed first, finished by that claim: not given up, retried or
    released, and done later, after the backlog (a redrive after a dead end, say)."""
    ended = next((s for s in _steps(world, REFUND) if s.seq > claim.seq), None)
    if ended is None or ended.reason == "completed" or world.messages[REFUND].state != "done":
        return  # finished by its first claim, or not done: the states say what it is
    done = next(s.seq for s in reversed(_steps(world, REFUND)) if s.reason == "completed")
    before = [e for e in BULK if any(s.reason == "completed" and s.seq < done
                                     for s in _steps(world, e))]
    claims = sum(1 for s in _steps(world, REFUND) if s.reason == "claimed")
    redriven = any(s.reason == "redrive" for s in _steps(world, REFUND))
    found.add(f"{REFUND} was claimed first, but that claim ended in {ended.reason} "
              f"({ended.to_state}), not completed{_why(ended)}; it was "
              f"{'redriven and ' if redriven else ''}done only at its "
              f"{_ORDINALS[min(claims, len(_ORDINALS)) - 1]} claim"
              + (f", after {', '.join(before)}" if before else ""), _first_claim_again(ended))


def _why(ended: Transition) -> str:
    return (": the handler that processed it does not know refund"
            if ended.reason == "invalid_payload" else "")


def _first_claim_again(ended: Transition) -> str:
    """Start over, so that the refund's first claim is the one that finishes it."""
    if ended.reason == "invalid_payload":
        return ("run `start_10` again and process with `handler_10 = "
                "Handler().supporting(\"refund\")`: the refund's first claim must be the one "
                "that finishes it")
    return (f"run `start_10` again, then {_ENQUEUE} and {_WORKER}: the refund's first claim "
            "must be the one that finishes it")


def _behind(world: Snapshot, refund: Message, ahead: list[str]) -> str:
    """Why the refund came after ``ahead``, in the claim's own terms."""
    place = _ORDINALS[len(ahead)] if len(ahead) < len(_ORDINALS) else f"number {len(ahead) + 1}"
    at, shift = refund.available_at, head_start(refund.priority)
    first = min(key(world.messages[e]) for e in ahead)
    claimed = f"{REFUND} was claimed {place}, after {', '.join(ahead)}"
    if key(refund) < first:  # the stored keys no longer say why: changed after the claims
        return claimed
    tie = key(refund)[0] == first[0]
    why = (f"which ties with {first[1]}'s and the tie goes to the smaller event id" if tie
           else f"behind theirs ({_keys([world.messages[e] for e in ahead])})")
    return (f"{claimed}: with priority {refund.priority} its key in the claim's order "
            f"({CLAIM_ORDER}, then event_id) was {at} - {shift} = {at - shift}, {why}")


def _raise(world: Snapshot, refund: Message) -> str:
    bulk = [world.messages[e] for e in BULK if e in world.messages]
    least = least_priority(refund.available_at, bulk)
    oldest = min(message.available_at for message in bulk)
    if least is None:
        return (f"run `start_10` again and enqueue the refund at once, at t={NOW}: a message "
                f"due since t={oldest} can be overtaken only by messages due less than "
                f"{HIGHEST * HEAD_START_SECONDS} s after it, the bound that keeps it from "
                "starving")
    return (f"run `start_10` again and enqueue the refund with priority {least} or more: the "
            f"oldest bulk message has been due since t={oldest}, {refund.available_at - oldest} "
            f"s before the refund, and each step of priority is a head start of "
            f"{HEAD_START_SECONDS} s")


def _count(n: int, what: str) -> str:
    words = ("no", "one", "two", "three", "four", "five", "six")
    return f"{words[n] if n < len(words) else n} {what}{'' if n == 1 else 's'}"


def _keys(messages: list[Message]) -> str:
    keys = sorted(key(message)[0] for message in messages)
    return str(keys[0]) if keys[0] == keys[-1] else f"{keys[0]} to {keys[-1]}"


# -- the backlog finished ---------------------------------------------------------------

def _idle(world: Snapshot, found: Findings) -> bool:
    """No claim at all in q10's journal: no worker has run yet, and that is what to do."""
    waiting = [e for e in (*BULK, REFUND) if e in world.messages
               and world.messages[e].state == "ready"]
    if not waiting or any(step.reason == "claimed" for step in world.journal):
        return False
    refund = world.messages.get(REFUND)
    bulk = sum(1 for e in waiting if e in BULK)
    which = (f"the refund {REFUND}, enqueued with priority {refund.priority}, and the "
             f"{_count(bulk, 'bulk message')} are all" if refund is not None
             and REFUND in waiting
             else f"{', '.join(waiting)} {'is' if len(waiting) == 1 else 'are'}")
    found.add(f"no worker has run yet: {which} still ready",
              f"run a worker until nothing is due: {_WORKER}")
    return True


def _unfinished(world: Snapshot, found: Findings) -> None:
    """A bulk message left waiting (starving), claimed and not finished, or given up."""
    bulk = {e: world.messages[e] for e in BULK if e in world.messages}
    waiting = [e for e, m in bulk.items() if m.state == "ready"]
    if waiting:
        found.add(f"the backlog starves: {', '.join(waiting)} "
                  f"{'is' if len(waiting) == 1 else 'are'} still ready, and no worker has "
                  f"processed {'it' if len(waiting) == 1 else 'them'}",
                  f"run a worker until nothing is due: {_WORKER}")
    held = [e for e in (*BULK, REFUND) if e in world.messages
            and world.messages[e].state == "leased"]
    if held:
        found.add(f"{', '.join(held)} claimed and never finished (leased)",
                  f"run `start_10` again and let {_WORKER} finish every message it claims")
    dead = [f"{e} ({m.last_error})" for e, m in bulk.items() if m.state == "dead"]
    if dead:
        found.add(f"bulk messages given up, dead: {', '.join(dead)}: the backlog must be done, "
                  "not dropped", f"run `start_10` again and let {_WORKER} finish them")
    refund = world.messages.get(REFUND)
    if refund is not None and refund.state == "dead":
        found.add(f"{REFUND} is dead ({refund.last_error}): the handler that processed it does "
                  "not know refund", "run `start_10` again and process with `handler_10 = "
                  "Handler().supporting(\"refund\")`")
    elif refund is not None and refund.state == "ready":
        ended = [s for s in _steps(world, REFUND) if s.from_state == "leased"]
        if ended:  # claimed, and back: its first claim can no longer be the one that finishes it
            found.add(f"{REFUND} is ready again: its claim ended in {ended[-1].reason}, and no "
                      "worker has claimed it since", _first_claim_again(ended[0]))
        else:
            found.add(f"{REFUND} is ready: no worker has processed it yet",
                      f"run a worker: {_WORKER}")


def _solved(world: Snapshot) -> str:
    refund = world.messages.get(REFUND)
    if refund is None:
        return figures(world.status)
    bulk = [world.messages[e] for e in BULK if e in world.messages]
    at, shift = refund.available_at, head_start(refund.priority)
    least = least_priority(at, bulk)
    oldest = min(message.available_at for message in bulk)
    return (f"the refund {REFUND}, enqueued at t={at} with priority {refund.priority}, was "
            f"claimed first: its key in the claim's order ({CLAIM_ORDER}, then event_id), "
            f"{at} - {shift} = {at - shift}, came before the backlog's, {_keys(bulk)} (priority "
            f"{least} is the least that does it: a head start of more than the {at - oldest} s "
            f"the oldest had been due); then all {len(bulk)} bulk messages were done too, none "
            f"left starving: {figures(world.status)}")
