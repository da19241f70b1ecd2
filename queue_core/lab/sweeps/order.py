"""The claim's order, checked: no due message with a smaller key is passed over.

A claim takes due ``ready`` messages by their key: ``available_at`` less the
priority's head start (``priority.CLAIM_ORDER``), then the event id. Whether
it did is read from the snapshot taken right after the claim's transaction
(``passed_over``): each claim the journal gained since the snapshot before,
and every message still ``ready`` after it. A message still ready that was
due at the claim's time and has a smaller key was passed over. It was ready
at the claim too: nothing else ran in between, and what the claim's own
transaction did before it (an ACK in the worker loop's step, the recovery of
expired leases) made no message ready that the claim could not see. One
check for every way of claiming: ``claim``, ``claim_batch``, the worker
loop's ACK that claims the next (``complete_and_claim``, on PostgreSQL the
schema's step function) and the explorer's every schedule (``explore``).
"""

from __future__ import annotations

from ...ledger import Snapshot
from ...priority import head_start
from ...values import Message, State

__all__ = ["PASSED_OVER", "claim_key", "last_seq", "passed_over"]

PASSED_OVER = "claim_order_passed_over"  # how a finding of ``passed_over`` begins


def claim_key(message: Message) -> tuple[int, str]:
    """Where ``message`` stands in the claim's order: smaller is claimed first."""
    return message.available_at - head_start(message.priority), message.event_id


def last_seq(snap: Snapshot) -> int:
    """The journal's last sequence number in ``snap`` (0 if it has none)."""
    return snap.journal[-1].seq if snap.journal else 0


def passed_over(snap: Snapshot, after_seq: int) -> list[str]:
    """Each claim journalled after ``after_seq`` that passed over a due ``ready``
    message with a smaller key, in words (none: the order held). ``snap`` is read
    right after the transaction of those claims."""
    waiting = [m for m in snap.messages.values() if m.state == State.READY]
    found = []
    for claim in snap.journal:
        if claim.seq <= after_seq or claim.reason != "claimed":
            continue
        key = claim_key(snap.messages[claim.event_id])
        for message in waiting:
            if message.available_at <= claim.at and claim_key(message) < key:
                found.append(f"{PASSED_OVER}: {claim.event_id} (key {key[0]}) claimed at "
                             f"{claim.at} while {message.event_id} (key "
                             f"{claim_key(message)[0]}, priority {message.priority}) was due")
    return found
