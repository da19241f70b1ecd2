"""Each transition of the state machine as ONE guarded statement, and the fence's reasons.

A transition is an ``UPDATE ... WHERE <guard> RETURNING <journal row>``:
the guard is the only check that decides whether it happens (a row that
no longer matches is simply not changed), and the returned row is what the
journal records, in this order::

    event_id, from_state, to_state, generation, attempts, reason

followed by whatever else the caller needs. Returning the journal row from
the statement that makes the change keeps the two from ever disagreeing;
the store decides how it reaches the ``transitions`` table (SQLite: one
INSERT per transaction; PostgreSQL: in the same statement, through a
data-modifying CTE). When a guarded UPDATE matches no row, the row is read
once more, only to say why (``check_fence``).

``event_id {picked}`` in a text is where a write names the rows that a
read (``DUE``, ``EXPIRED``) picked for it; the store says how
(``Store.picked``). On SQLite it is ``IN (<read>)``: ``BEGIN IMMEDIATE``
already admits one writer. On PostgreSQL the read also locks what it picks,
``FOR NO KEY UPDATE SKIP LOCKED`` (a row another worker holds is not a
candidate, and nobody waits for it), and it must run exactly once: an
``IN (<read>)`` may be re-run by the planner for every row it compares
(a nested-loop semi join), and each run skips the rows the runs before it
locked, so a ``LIMIT 1`` would lock, and the UPDATE lease, one row per run.
There the read is an ``ARRAY(...)`` sub-select, which the server evaluates
once per statement whatever plan it picks, and the write changes exactly
the rows it returned.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from .errors import LeaseLost, UnknownEvent
from .priority import CLAIM_ORDER
from .values import Lease, State

JOURNAL_COLUMNS = "event_id, from_state, to_state, generation, attempts, reason"
JOURNAL_INSERT = ("INSERT INTO transitions (at, event_id, from_state, to_state, generation, "
                  "attempts, reason) VALUES (?, ?, ?, ?, ?, ?, ?)")

# The claim's two reads of candidates: each walks its state's range of the
# partial index ``messages_live`` (the ready rows in due order, the few leased
# rows; on PostgreSQL the leases have an index of their own, ``messages_leased``,
# and ``postgres.EXPIRED_READ`` reads it), so the cost of a claim does not grow
# with the done rows kept forever.
# ``payload IS NOT NULL`` is the index's condition, named so that the database
# may use it (a ready or leased row always has its payload: the schema's
# ``pruned_only_when_done``). Parameters: now, now, limit; now.
# The due messages come in the claim's order (``priority.CLAIM_ORDER``: the due
# time less the priority's head start, the index's second column), read from
# the first key up to ``now``; the keys up to ``now`` of messages not due yet (an
# urgent message in backoff) are passed over, at most nine minutes of them.
LIVE = "payload IS NOT NULL"
DUE = (f"SELECT event_id FROM messages WHERE state = 'ready' AND {LIVE} "
       f"AND {CLAIM_ORDER} <= ? AND available_at <= ? "
       f"ORDER BY {CLAIM_ORDER}, event_id LIMIT ?")
# The same read before priorities (PostgreSQL's step function of schema 4 and 5
# spells it). Parameters: now, limit.
DUE_BEFORE_PRIORITY = (f"SELECT event_id FROM messages WHERE state = 'ready' AND {LIVE} "
                       "AND available_at <= ? ORDER BY available_at, event_id LIMIT ?")
EXPIRED = f"SELECT event_id FROM messages WHERE state = 'leased' AND {LIVE} AND lease_until <= ?"

# ready -> leased: the due messages in the claim's order, up to a limit
# (``{picked}`` is the store's form of ``DUE``). Parameters: lease_until, now, now,
# limit. Also returns lease_until, available_at, the stored payload, which the
# lease carries to its holder (``Lease.payload``), and the claim's order
# (``claim_order``, then ``event_id``: it orders the leases, since RETURNING
# promises no order; a claim changes neither).
CLAIM = ("UPDATE messages SET state = 'leased', attempts = attempts + 1, "
         "generation = generation + 1, lease_until = ? "
         "WHERE state = 'ready' AND event_id {picked} "
         "RETURNING event_id, 'ready' AS from_state, 'leased' AS to_state, generation, "
         "attempts, 'claimed' AS reason, lease_until, available_at, payload, "
         f"{CLAIM_ORDER} AS claim_order")
# The leases' order in CLAIM's rows.
CLAIMED_ORDER = ("claim_order", "event_id")

# leased -> ready (budget left: available again from the old deadline on) or
# leased -> dead (no attempt left), for every lease whose deadline has passed
# (``{picked}``: the store's form of ``EXPIRED``). Parameters: max_attempts,
# max_attempts, now.
RECOVER = ("UPDATE messages SET "
           "state = CASE WHEN attempts >= ? THEN 'dead' ELSE 'ready' END, "
           "available_at = CASE WHEN attempts >= ? THEN available_at ELSE lease_until END, "
           "lease_until = NULL, last_error = 'lease_expired' "
           "WHERE state = 'leased' AND event_id {picked} "
           "RETURNING event_id, 'leased' AS from_state, state AS to_state, generation, "
           "attempts, CASE WHEN state = 'dead' THEN 'attempts_exhausted' "
           "ELSE 'lease_expired' END AS reason")

# The guard every holder's write carries: this lease's message, still leased by
# this generation, before its deadline. Parameters: event_id, generation, now.
HELD = "event_id = ? AND state = 'leased' AND generation = ? AND lease_until > ?"

# leased -> done, the ACK's write (the effect is INSERTed in the same
# transaction), with the time it finished, from which retention counts its age.
# Parameters: finished_at, the guard's.
ACK = ("UPDATE messages SET state = 'done', lease_until = NULL, finished_at = ? WHERE " + HELD +
       " RETURNING event_id, 'leased' AS from_state, 'done' AS to_state, generation, "
       "attempts, 'completed' AS reason")


# leased -> ready (retry later) or leased -> dead, after a failure.
# Parameters: to_state, available_at, code, the guard's, reason.
FAIL = ("UPDATE messages SET state = ?, lease_until = NULL, available_at = ?, "
        "last_error = ? WHERE " + HELD +
        " RETURNING event_id, 'leased' AS from_state, state AS to_state, generation, "
        "attempts, CAST(? AS TEXT) AS reason")

# leased -> ready, handed back untouched by its holder: due again at once, in its
# old place, and the attempt it never made is not counted. Its guard is the lease's
# without the deadline: a lease past its deadline that no claim has recovered yet is
# still this generation's, and nobody else's (a recovery makes it ready, a new claim
# a new generation). Giving it back claims no right to the message and writes no
# effect, so it may come late. Parameters: event_id, generation.
HELD_UNTIL_RECOVERED = "event_id = ? AND state = 'leased' AND generation = ?"
RELEASE = ("UPDATE messages SET state = 'ready', lease_until = NULL, attempts = attempts - 1 "
           "WHERE " + HELD_UNTIL_RECOVERED +
           " RETURNING event_id, 'leased' AS from_state, 'ready' AS to_state, generation, "
           "attempts, 'released' AS reason")

# leased -> leased with a later deadline (the heartbeat; no edge, so no journal row).
# Parameters: lease_until, the guard's.
EXTEND = "UPDATE messages SET lease_until = ? WHERE " + HELD + " RETURNING lease_until"

# dead -> ready, attempts reset, generation kept. Parameters: now, event_id.
REDRIVE = ("UPDATE messages SET state = 'ready', attempts = 0, available_at = ? "
           "WHERE event_id = ? AND state = 'dead' "
           "RETURNING event_id, 'dead' AS from_state, 'ready' AS to_state, generation, "
           "attempts, 'redrive' AS reason")

# What the fence reads: before the ACK's handler (it needs the payload, and the
# digest kept from enqueue on, which the stored payload must still have), and
# after a guarded UPDATE that matched nothing (only to say why).
FENCE_COLUMNS = "state, generation, lease_until, payload, payload_sha256"
FENCE_SELECT = f"SELECT {FENCE_COLUMNS} FROM messages WHERE event_id = ?"


def picking(template: str, read: str, picked: Callable[[str], str]) -> str:
    """``template`` (``CLAIM`` or ``RECOVER``) with its rows picked by ``read``
    in the store's way (``Store.picked``)."""
    return template.format(picked=picked(read))


def check_fence(lease: Lease, row: tuple[Any, ...] | None, now: int) -> str:
    """Return the payload of ``row`` (from ``FENCE_SELECT``) if ``lease``
    still holds the message at ``now``; else raise why it does not.

    Raises ``UnknownEvent``, or ``LeaseLost`` with ``stale_generation``
    (claimed again since, or redriven), ``not_leased`` or ``lease_expired``,
    checked in that order: a newer holder's state says nothing about this lease.
    """
    if row is None:
        raise UnknownEvent(f"no message {lease.event_id}")
    state, generation, lease_until, payload = row[:4]
    stored = {"event_id": lease.event_id, "stored_state": str(state),
              "stored_generation": int(generation)}
    if generation != lease.generation:
        raise LeaseLost("stale_generation",
                        f"{lease.event_id}: lease generation {lease.generation}, "
                        f"stored generation {generation}", **stored)
    if state != State.LEASED:
        raise LeaseLost("not_leased", f"{lease.event_id} is {state}, not leased", **stored)
    if lease_until <= now:
        raise LeaseLost("lease_expired",
                        f"{lease.event_id}: lease ended at {lease_until}, now is {now}", **stored)
    return str(payload)


def explain_miss(conn: Any, lease: Lease, now: int) -> LeaseLost | UnknownEvent:
    """Why a guarded UPDATE of ``lease``'s message matched no row, read once more.

    The read sees what the UPDATE saw (under SQLite's write lock) or later
    (PostgreSQL); generations and states only move on, so the row cannot
    hold the lease again.
    """
    try:
        check_fence(lease, conn.execute(FENCE_SELECT, (lease.event_id,)).fetchone(), now)
    except (LeaseLost, UnknownEvent) as exc:
        return exc
    raise AssertionError(f"{lease.event_id}: a guarded UPDATE matched no row, "
                         "yet the lease holds")


def write_journal(conn: Any, rows: Sequence[tuple[Any, ...]]) -> None:
    """Journal state changes inside the caller's open transaction.

    Each row: ``(at, event_id, from_state, to_state, generation, attempts,
    reason)``; the schema refuses a step that is not an edge of the state
    machine.
    """
    if not rows:
        return
    if len(rows) == 1:  # the single-message path: execute is cheaper than executemany
        conn.execute(JOURNAL_INSERT, rows[0])
        return
    conn.executemany(JOURNAL_INSERT, rows)


_CHUNK = 500  # event ids per IN (...) list, well under SQLite's variable limit


def rows_among(conn: Any, template: str, event_ids: list[str]) -> list[tuple[Any, ...]]:
    """The rows of ``template`` (its ``IN ({})`` filled with one parameter per id) for
    ``event_ids``, in chunks of ``_CHUNK`` ids, well under SQLite's variable limit."""
    found: list[tuple[Any, ...]] = []
    for start in range(0, len(event_ids), _CHUNK):
        chunk = event_ids[start:start + _CHUNK]
        found += conn.execute(template.format(", ".join("?" * len(chunk))), chunk).fetchall()
    return found
