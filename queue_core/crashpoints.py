"""Named places where a worker process can be killed on purpose.

The protocol calls ``crash_point(name)`` at each step where a real worker
could die. Unarmed (always, unless a test or lesson arms one), it is a single
comparison. Armed, the process ends at once with ``os._exit``: no
``finally``, no rollback by Python, exactly like a kill.

Crash points, in the order a message meets them:

=======================================  ======================================
``claim.after_begin``                    write lock taken, nothing read yet
``claim.before_commit``                  expired leases recovered, the due
                                         message leased and journalled (one
                                         guarded UPDATE each), not committed
``claim.after_commit``                   claim committed, lease not yet returned
``complete.after_begin``                 ACK transaction open, nothing checked
``complete.after_insert``                effect INSERTed, lease not re-checked
``complete.after_recheck``               lease re-checked after the INSERT (by
                                         the guarded ``done`` UPDATE), not
                                         committed
``complete.before_commit``               ``done`` and its journal row written,
                                         not committed
``complete.after_commit``                ACK committed, worker not yet told
``complete_and_claim.after_insert``      the worker loop's step (the ACK that
                                         claims the next message): effect
                                         INSERTed, lease not re-checked
``complete_and_claim.after_recheck``     ``done`` written by the guarded
                                         UPDATE; the next message not yet
                                         claimed
``complete_and_claim.before_commit``     the next message leased too, both
                                         journalled, not committed
``complete_and_claim.after_commit``      both committed: the worker holds the
                                         next lease and dies with it
``fail.after_begin``                     failure transaction open, nothing checked
``fail.before_commit``                   ``ready``/``dead`` written, not committed
``fail.after_commit``                    failure committed, worker not yet told
=======================================  ======================================

``complete.between_transactions`` is reached only by the deliberately broken
protocols of ``queue_core.lab.story.contrasts``, which split the effect and the ACK
into two transactions: the first has committed, the second has not begun.

On PostgreSQL the worker loop's step is one call of the schema's function
(``postgres.STEP_FUNCTION``): no Python runs between its statements, so its
``after_insert`` and ``after_recheck`` do not exist there
(``INSIDE_THE_SERVER_STEP``). Its ``before_commit`` is reached before the call
is sent (its ``BEGIN``, the call and its ``COMMIT`` are one message: nothing
is begun yet), its ``after_commit`` once it committed.

``PROTOCOL_POINTS`` lists the protocol's own points in that order,
``POINTS`` adds the contrasts' one in its place (the crash sweep derives its
rows from it); ``arm``
refuses any other name, so a typo in a test or a child spec fails loudly
instead of never crashing.
"""

from __future__ import annotations

import os

CRASH_EXIT_CODE = 86
PROTOCOL_POINTS = (
    "claim.after_begin",
    "claim.before_commit",
    "claim.after_commit",
    "complete.after_begin",
    "complete.after_insert",
    "complete.after_recheck",
    "complete.before_commit",
    "complete.after_commit",
    "complete_and_claim.after_insert",
    "complete_and_claim.after_recheck",
    "complete_and_claim.before_commit",
    "complete_and_claim.after_commit",
    "fail.after_begin",
    "fail.before_commit",
    "fail.after_commit",
)
BETWEEN_TRANSACTIONS = "complete.between_transactions"
INSIDE_THE_SERVER_STEP = ("complete_and_claim.after_insert", "complete_and_claim.after_recheck")
# Every point in the order a message meets it; the contrasts' one sits between
# the first transaction's commit and the second's.
POINTS = tuple(point for name in PROTOCOL_POINTS for point in (
    (BETWEEN_TRANSACTIONS, name) if name == "complete.after_commit" else (name,)))

# A migration's and a prune's points: not on a message's way, so not rows of the
# crash sweep of the protocol; their own sweeps arm them.
LIFETIME_POINTS = (
    "migrate.after_begin",      # write lock taken, version not yet read again
    "migrate.after_copy",       # the step's tables rewritten, version not yet set
    "migrate.before_commit",    # new version set, not committed
    "migrate.after_commit",     # committed, nothing reported yet
    "prune.after_begin",        # a prune batch's write lock taken, nothing read
    "prune.after_compact",      # payloads dropped, records written, journal rows kept
    "prune.before_commit",      # journal rows deleted, not committed
    "prune.after_commit",       # the batch committed, space not yet given back
)

_armed: str | None = None
_arrivals_left = 1


def arm(point: str | None, *, after: int = 1) -> None:
    """Make the ``after``-th arrival at ``point`` end this process (``None`` disarms).

    ``after`` above 1 lets a worker finish some messages before it dies, as
    the stress run needs; the sweep uses the first arrival.
    """
    global _armed, _arrivals_left
    if point is not None and point not in POINTS and point not in LIFETIME_POINTS:
        raise ValueError(f"unknown crash point {point!r}; known: "
                         f"{', '.join(POINTS + LIFETIME_POINTS)}")
    if isinstance(after, bool) or not isinstance(after, int) or after < 1:
        raise ValueError(f"after must be a positive integer, got {after!r}")
    _armed, _arrivals_left = point, after


def armed() -> str | None:
    return _armed


def crash_point(name: str) -> None:
    """End the process here with exit code 86 if ``name`` is armed and due."""
    if _armed == name:
        _arrive()


def _arrive() -> None:
    global _arrivals_left
    _arrivals_left -= 1
    if _arrivals_left <= 0:
        os._exit(CRASH_EXIT_CODE)
