"""The check of exercise 4: a stalled worker's late ACK is fenced by the
generation, before and after a redrive.

Each refusal comes as a pair ``(lease, refusal)``. The journal of the
learner's queue says what happened to that lease: its claim must be there
(a lease from another queue is not this story), a later claim must have
noticed it expired (the worker stalled; it did not finish or fail the
message itself), and for the second pair a redrive must follow its claim.
Each refusal must come from its side of the redrive, judged by what it read
of the message (``LeaseLost.stored_state`` and ``stored_generation``):
before it, W2's or dead at the redrive's generation; after it, a later
generation, once W3 has claimed.
The refusal must have been raised by a call on the learner's queue: its
traceback names that queue (``verdicts.raised_by``), which a
refusal built by hand, or raised by another exercise's queue, cannot.
"""

from __future__ import annotations

from typing import Any

from ...audit import Snapshot
from ...errors import QueueError
from ...values import Effect, Lease, Transition
from .verdicts import (Findings, NotAttempted, Verdict, bypassed, checked, compare,
                                figures, nudge, path_of, plain, raised_by, read, same_file,
                                states, untouched, used_start, whose)

__all__ = ["check_4"]

_BEFORE, _AFTER = "before the redrive", "after the redrive"
_KEEP = {_BEFORE: "in the except block of W1's first late ACK, keep `before_redrive = (w1, exc)`",
         _AFTER: "after `q4.redrive(\"E0004\")` and W3's claim, try `q4.complete(w1, newer)` once "
                 "more and keep `after_redrive = (w1, exc)`"}
_TAKE_OVER = ("after W1's lease has ended (`q4.clock.advance(2)`), let W2 claim E0004 "
              "(`w2 = q4.claim()`), then try W1's ACK: its generation is then older than the "
              "stored one")
_ENDED = {"completed": "finished E0004 itself", "invalid_payload": "sent E0004 dead itself "
          "(invalid_payload)", "transient_error": "gave E0004 back itself (transient_error)"}


def check_4(queue: Any, before_redrive: Any = None, after_redrive: Any = None) -> Verdict:
    """A stalled worker's late ACK refused (``stale_generation``), also after a redrive;
    E0004 finally done once: total 3000, effects 1, done 1."""
    def body() -> Verdict:
        world = read(queue, 4)
        if before_redrive is None and after_redrive is None and untouched(world, 4):
            raise NotAttempted("let a stalled worker's lease expire, then try its late ACK")
        parts = (before_redrive, after_redrive)
        no_lease = any(isinstance(p, tuple) and p and p[0] is None for p in parts)
        story_over = parts == (None, None) and world.status.states.get("done") == 1
        if no_lease or story_over:  # the cell ran again on a used start: claims found nothing
            raise used_start(world, 4, "E0004")
        found = Findings(4, "run `start_4` again and play the story of Hint 3 once, keeping "
                            "both pairs (w1, exc)")
        for wrong in compare(world, 3000, 1, states(done=1)):
            found.add(wrong)
        late = _pair(_BEFORE, before_redrive, world, path_of(queue), found)
        _pair(_AFTER, after_redrive, world, path_of(queue), found)
        if _same_refusal(before_redrive, after_redrive):
            found.add(f"{_AFTER}: that is the same refusal as {_BEFORE}", _KEEP[_AFTER])
        nudge(world, found, "let W3 claim E0004 and finish it with the handler that knows toy: "
                            "`w3 = q4.claim()`, then `q4.complete(w3, newer)` (Hint 3)")
        bypassed(world, found, queue)
        stalled = f"generation {late.generation}, attempt {late.attempt}" if late else ""
        return found.verdict(f"the generation fenced the stalled lease ({stalled}) before and "
                             f"after a redrive: {figures(world.status)}")
    return checked(4, body)


def _same_refusal(first: Any, second: Any) -> bool:
    """Both pairs well formed, (lease, refusal), and holding the very same refusal."""
    return all(isinstance(p, tuple) and len(p) == 2 and isinstance(p[1], BaseException)
               for p in (first, second)) and first[1] is second[1]


def _pair(label: str, part: Any, world: Snapshot, path: str, found: Findings) -> Lease | None:
    """Add what is wrong with one (stalled lease, refusal) pair; its lease if well formed."""
    lease = _lease_of(label, part, found)
    if lease is None:
        return None
    history = [t for t in world.journal if t.event_id == lease.event_id]
    claim = next((t for t in history if t.reason == "claimed" and t.generation ==
                  lease.generation and t.attempts == lease.attempt), None)
    if claim is None:
        found.add(f"{label}: that lease ({lease.event_id}, generation {lease.generation}, "
                  f"attempt {lease.attempt}) was not claimed in q4: its claim is not in q4's "
                  "journal", "take W1's lease with `w1 = q4.claim()` on this queue (run "
                  "`start_4` again)")
        return None
    already = len(found.wrong)
    told = isinstance(part[1], Effect) or getattr(part[1], "code", None) == "lease_expired"
    _stalled(label, lease, claim, history, found, told=told)  # the wrong worker first
    _refusal(label, lease, part[1], found, path)
    stored = world.messages.get(lease.event_id)
    if len(found.wrong) == already and stored is not None \
            and stored.generation <= lease.generation:  # only a hand edit lowers it
        found.add(f"{label}: generation of {lease.event_id} expected above the stalled lease's "
                  f"{lease.generation}, found {stored.generation}")
    redrive = next((t for t in history if t.reason == "redrive" and t.seq > claim.seq), None)
    if label == _AFTER and len(found.wrong) == already and redrive is None:
        found.add(f"{label}: expected a redrive of {lease.event_id} after W{lease.generation}'s "
                  "claim, found none", "add toy support, then `q4.redrive(\"E0004\")`, W3's "
                  "claim, and W1's ACK once more (Hint 3)")
    if len(found.wrong) == already and redrive is not None:
        _when(label, lease, part[1], redrive, found)
    return lease


def _when(label: str, lease: Lease, error: Any, redrive: Transition, found: Findings) -> None:
    """Add it if the refusal was not taken on its side of the redrive, judged by what it
    read of the message: before it, the message was W2's or dead, at the redrive's
    generation; after it (and W3's claim), at a later one."""
    state = getattr(error, "stored_state", None)
    generation = getattr(error, "stored_generation", None)
    if state is None or generation is None:
        return  # a refusal that read nothing (an Effect, or another code: said already)
    seen = f"{lease.event_id} was {state}, generation {generation}, when it came"
    # ready at the redrive's generation: redriven, not yet claimed again (a message made
    # ready otherwise, a release say, and claimed again since, is at an earlier one)
    before = generation < redrive.generation or (generation == redrive.generation
                                                 and state != "ready")
    if label == _BEFORE and not before:
        found.add(f"{label}: that refusal was taken after the redrive ({seen})",
                  "keep the refusal of W1's first late ACK, tried while W2 held E0004 or "
                  "after it went dead, before `q4.redrive(\"E0004\")`: " + _KEEP[_BEFORE])
    elif label == _AFTER and generation <= redrive.generation:
        when = "before the redrive" if before else "after the redrive, but before W3 claimed it"
        found.add(f"{label}: that refusal was taken {when} ({seen})", _KEEP[_AFTER])


def _lease_of(label: str, part: Any, found: Findings) -> Lease | None:
    """The lease of a well-formed pair, or None (and what is wrong with the pair)."""
    if part is None:
        found.add(f"{label}: expected the pair (stalled lease, refusal), found None", _KEEP[label])
        return None
    pair = isinstance(part, tuple) and len(part) == 2
    if pair and isinstance(part[1], Lease) and isinstance(part[0], BaseException):
        found.add(f"{label}: the pair is in the wrong order, (refusal, lease)",
                  "write it as (w1, exc): the stalled lease first, then what its ACK got")
        return None
    if not pair or not isinstance(part[0], Lease):
        size = f" of {len(part)}" if isinstance(part, (tuple, list)) else ""
        found.add(f"{label}: expected a pair (stalled lease, refusal), found "
                  f"a {type(part).__name__}{size}",
                  "write it as (w1, exc): W1's Lease from q4.claim(), then the exception")
        return None
    return part[0]


def _refusal(label: str, lease: Lease, error: Any, found: Findings, path: str) -> None:
    """Add what is wrong with the refusal the lease got: it must be stale_generation,
    raised by a call on q4 (``raised_by``: a refusal made by hand names no queue)."""
    who = f"W{lease.generation}"
    origin = raised_by(error) if isinstance(error, QueueError) else path
    if origin is None or not same_file(origin, path):
        by = (whose(origin, 4) if origin
              else "no call on q4 (it was made or raised by your own code)")
        found.add(f"{label}: that {error.code} refusal was raised by {by}, not by {who}'s "
                  "late ACK on q4", f"keep what `q4.complete(w1, ...)` raises: {_KEEP[label]}")
        return
    if isinstance(error, Effect):
        found.add(f"{label}: {who}'s ACK was accepted (it returned an Effect), not refused",
                  _TAKE_OVER)
    elif not isinstance(error, QueueError):
        found.add(f"{label}: expected {who}'s stale_generation refusal (the exception itself), "
                  f"found {plain(error)}", _KEEP[label])
    elif error.code == "lease_expired":
        found.add(f"{label}: {who}'s ACK was refused with lease_expired, not stale_generation: "
                  f"when it tried, no second claim had taken {lease.event_id} over, so its "
                  "lease had only run out of time", _TAKE_OVER)
    elif error.code != "stale_generation":
        found.add(f"{label}: code expected stale_generation, found {error.code}")
    elif getattr(error, "event_id", lease.event_id) != lease.event_id:
        found.add(f"{label}: the refusal is about {getattr(error, 'event_id')}, the lease "
                  f"about {lease.event_id}", "pair each refusal with the lease whose ACK got it")


def _stalled(label: str, lease: Lease, claim: Transition, history: list[Transition],
             found: Findings, *, told: bool) -> None:
    """The lease must be a stalled worker's: a later claim journalled it expired
    (``told``: the refusal's item already said that no claim took over)."""
    if told:
        return
    who = f"W{lease.generation}"
    ending = next((t for t in history if t.seq > claim.seq and t.from_state == "leased"
                   and t.generation == lease.generation), None)
    if ending is None:
        found.add(f"{label}: no second claim took {lease.event_id} over from {who}, so the "
                  f"journal never shows {who}'s lease expired", _TAKE_OVER)
        return
    if ending.reason == "lease_expired":
        return
    stalled = [t.generation for t in history if t.reason == "lease_expired"]
    asked = (f"W{stalled[0]}, generation {stalled[0]}, whose lease expired while it stalled"
             if stalled else "a worker whose lease expired while it stalled (Hint 1)")
    did = _ENDED.get(ending.reason, f"ended its lease itself ({ending.reason})")
    found.add(f"{label}: your refusal came from {who}'s lease (generation {lease.generation}, "
              f"attempt {lease.attempt}), and {who} did not stall: it {did}; the exercise asks "
              f"for the stalled worker's: {asked}",
              "pair the stalled lease with what its own late ACK got: (w1, exc) from "
              "`q4.complete(w1, ...)`")
