"""A business handler with transient faults injected on purpose.

The crash sweep, the stress run and the power-loss sweep use it so that
retries and backoff happen in their runs too; child processes rebuild it
from a JSON spec (``FlakyHandler.from_spec``).
"""

from __future__ import annotations

import random
import sqlite3
from typing import Any, Iterable

from ...errors import TransientError
from ...handler import DEFAULT_CATEGORIES, Handler


class FlakyHandler(Handler):
    """The business handler with transient faults injected on purpose.

    Attempt ``n`` of an event fails with ``TransientError`` when the event is
    in ``first_attempt`` and ``n == 1``, or with probability ``rate``. The
    draw is a pure function of ``(seed, event_id, attempt)``, so every
    process makes the same decision and a run can be replayed.
    """

    def __init__(self, categories: Iterable[str] = DEFAULT_CATEGORIES, *, rate: float = 0.0,
                 seed: int = 0, first_attempt: Iterable[str] = ()) -> None:
        super().__init__(categories)
        self.rate, self.seed = rate, seed
        self.first_attempt = frozenset(first_attempt)

    @classmethod
    def from_spec(cls, categories: Iterable[str], spec: dict[str, Any]) -> "FlakyHandler":
        """Build from a child spec's ``faults`` entry (JSON: rate, seed, first_attempt)."""
        return cls(categories, rate=float(spec.get("rate", 0.0)), seed=int(spec.get("seed", 0)),
                   first_attempt=spec.get("first_attempt", ()))

    def supporting(self, *categories: str) -> "FlakyHandler":
        return type(self)(self.categories | frozenset(categories), rate=self.rate,
                          seed=self.seed, first_attempt=self.first_attempt)

    def fails(self, event_id: str, attempt: int) -> bool:
        """Whether attempt ``attempt`` of ``event_id`` gets a transient fault."""
        if attempt == 1 and event_id in self.first_attempt:
            return True
        return random.Random(f"{self.seed}:{event_id}:{attempt}").random() < self.rate

    def fault(self, conn: sqlite3.Connection, event_id: str) -> None:
        """Raise ``TransientError`` if this attempt is scheduled to fail."""
        attempt = conn.execute("SELECT attempts FROM messages WHERE event_id = ?",
                               (event_id,)).fetchone()[0]
        if self.fails(event_id, attempt):
            raise TransientError(f"{event_id}: injected transient fault on attempt {attempt}")
