"""Named places where a worker process can be killed on purpose.

The protocol calls ``crash_point(name)`` at each step where a real worker
could die. Unarmed (always, unless a test or lesson arms one), it is a single
comparison. Armed, the process ends at once with ``os._exit``: no
``finally``, no rollback by Python, exactly like a kill.

Crash points, in the order a message meets them:

=============================  ==========================================
``claim.after_begin``          write lock taken, nothing read yet
``claim.after_select``         candidate row chosen, not yet changed
``claim.before_commit``        claim UPDATE done, not committed
``claim.after_commit``         claim committed, lease not yet returned
``complete.after_begin``       ACK transaction open, nothing checked
``complete.after_insert``      effect INSERTed, lease not re-checked
``complete.after_recheck``     lease re-checked, ``done`` not written
``complete.before_commit``     ``done`` UPDATE written, not committed
``complete.after_commit``      ACK committed, worker not yet told
=============================  ==========================================
"""

from __future__ import annotations

import os

CRASH_EXIT_CODE = 86
POINTS = (
    "claim.after_begin",
    "claim.after_select",
    "claim.before_commit",
    "claim.after_commit",
    "complete.after_begin",
    "complete.after_insert",
    "complete.after_recheck",
    "complete.before_commit",
    "complete.after_commit",
)

_armed: str | None = None


def arm(point: str | None) -> None:
    """Make the next arrival at ``point`` end this process (``None`` disarms)."""
    global _armed
    if point is not None and point not in POINTS:
        raise ValueError(f"unknown crash point {point!r}; known: {', '.join(POINTS)}")
    _armed = point


def armed() -> str | None:
    return _armed


def crash_point(name: str) -> None:
    """End the process here with exit code 86 if ``name`` is armed."""
    if _armed == name:
        os._exit(CRASH_EXIT_CODE)
