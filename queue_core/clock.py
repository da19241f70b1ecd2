"""Clocks in integer seconds: the system clock, and a model clock for lessons.

Only the clock is ever modelled. The model clock moves only when told, so a
notebook or a test can step past a lease deadline without sleeping.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """Anything with ``now()`` in integer seconds: the queue's only source of time."""

    def now(self) -> int: ...


class SystemClock:
    """Wall-clock seconds since the epoch, as ordinary commands use."""

    def now(self) -> int:
        return int(time.time())

    def __repr__(self) -> str:
        return "SystemClock()"


class ModelClock:
    """A clock that stands still until ``advance`` or ``set`` moves it."""

    def __init__(self, start: int = 1000) -> None:
        self._now = _seconds(start)

    def now(self) -> int:
        return self._now

    def advance(self, seconds: int = 1) -> int:
        """Move forward by ``seconds`` (never backwards); return the new time."""
        if _seconds(seconds) < 0:
            raise ValueError("a model clock only moves forward; use set() to jump")
        self._now += seconds
        return self._now

    def set(self, t: int) -> int:
        """Jump to ``t``, backwards included, as a host clock may; return it."""
        self._now = _seconds(t)
        return self._now

    def __repr__(self) -> str:
        return f"ModelClock(now={self._now})"


def _seconds(value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"time is integer seconds, got {value!r}")
    return value
