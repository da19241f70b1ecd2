"""The business handler: which payloads count as a paid order, and for how much.

The transport accepts any valid JSON object; only the handler knows the
business fields. A newer handler version may accept more categories:
``Handler().supporting("toy")`` is that newer version.
"""

from __future__ import annotations

import sqlite3
from typing import Any, Iterable

from .errors import InvalidPayload
from .values import Effect

DEFAULT_CATEGORIES = frozenset({"book", "pen", "bag"})
MAX_AMOUNT_CENTS = 9_999_999
# The one write of ``Handler.apply``; PostgreSQL's worker step runs the same
# statement on the server (``postgres.STEP_FUNCTION``). Parameters: event_id,
# category, amount_cents.
EFFECT_INSERT = "INSERT INTO effects (event_id, category, amount_cents) VALUES (?, ?, ?)"


class Handler:
    """Validate a payload and write its effect on the ACK's own connection."""

    def __init__(self, categories: Iterable[str] = DEFAULT_CATEGORIES) -> None:
        self.categories = frozenset(categories)

    def supporting(self, *categories: str) -> "Handler":
        """Return a newer handler that also accepts ``categories``: names, each a
        non-empty string (``ValueError`` otherwise). An effect's category is never
        empty (the schema's ``category_named``): a handler that accepted one would
        have each such message's ACK refused by the database, stopping the worker,
        instead of dead-lettering the message."""
        bad = sorted(repr(c) for c in categories if not isinstance(c, str) or not c)
        if bad:
            raise ValueError(f"a category is a name, a non-empty string; got {', '.join(bad)}: "
                             "leave it out, or name the category")
        return type(self)(self.categories | frozenset(categories))

    def effect_of(self, payload: Any) -> Effect:
        """Return the effect of a payload, or raise ``InvalidPayload``.

        Types are checked before values: a category that is a JSON array must
        not reach the set lookup (it would raise ``TypeError``), and
        ``True`` or ``100.0`` is not an amount in cents.
        """
        if not isinstance(payload, dict):
            raise InvalidPayload("payload is not an object")
        category = payload.get("category")
        if not isinstance(category, str):
            raise InvalidPayload(f"category must be a string, got {_describe(category)}")
        if category not in self.categories:
            known = ", ".join(sorted(self.categories))
            raise InvalidPayload(f"unknown category {category!r} (this handler knows {known})")
        amount = payload.get("amount_cents")
        if type(amount) is not int:  # bool is a subclass of int; 1.0 is a float
            raise InvalidPayload(f"amount_cents must be an integer, got {_describe(amount)}")
        if not 1 <= amount <= MAX_AMOUNT_CENTS:
            raise InvalidPayload(f"amount_cents must be 1..{MAX_AMOUNT_CENTS}, got {amount}")
        return Effect(category, amount)

    def fault(self, conn: sqlite3.Connection, event_id: str) -> None:
        """Raise ``TransientError`` here to fail this attempt; by default, never.

        Called first by ``apply`` (and by anything that computes an effect
        the protocol's way): a hook for a handler whose dependency can be
        busy. The course's ``FlakyHandler`` fails chosen attempts here. It
        may read with ``conn``, never write: PostgreSQL's worker step calls
        it before the step's transaction begins.
        """

    def apply(self, conn: sqlite3.Connection, event_id: str, payload: Any) -> Effect:
        """Write the effect with ``conn``, inside the caller's open transaction."""
        self.fault(conn, event_id)
        effect = self.effect_of(payload)
        conn.execute(EFFECT_INSERT, (event_id, effect.category, effect.amount_cents))
        return effect

    def __repr__(self) -> str:
        return f"Handler(categories={sorted(self.categories)})"


def _describe(value: Any) -> str:
    if value is None:
        return "nothing"
    return f"{type(value).__name__} {value!r}"[:60]
