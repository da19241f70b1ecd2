"""What a second, independent connection sees: money, effects, states, rows.

Every domain test checks money, the number of effects and the states
together, because a right sum with a lost message proves nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from conftest import read_back

STATES = ("ready", "leased", "done", "dead")
_COLUMNS = ("payload", "state", "attempts", "generation", "available_at", "lease_until",
            "last_error")


def ledger(db_path: Path) -> dict[str, Any]:
    """Total money, effect count and messages per state, as stored."""
    states = dict.fromkeys(STATES, 0)
    states.update(read_back(db_path, "SELECT state, count(*) FROM messages GROUP BY state"))
    effects, total = read_back(
        db_path, "SELECT count(*), coalesce(sum(amount_cents), 0) FROM effects")[0]
    return {"total": total, "effects": effects, "states": states}


def expect(total: int, effects: int, *, ready: int = 0, leased: int = 0, done: int = 0,
           dead: int = 0) -> dict[str, Any]:
    """The ``ledger`` a test expects, spelled out."""
    return {"total": total, "effects": effects,
            "states": {"ready": ready, "leased": leased, "done": done, "dead": dead}}


def row(db_path: Path, event_id: str) -> dict[str, Any]:
    """One stored message as a dict of its columns."""
    rows = read_back(db_path, f"SELECT {', '.join(_COLUMNS)} FROM messages WHERE event_id = ?",
                     (event_id,))
    assert len(rows) == 1, f"{event_id} is stored {len(rows)} times"
    return dict(zip(_COLUMNS, rows[0]))


def effects(db_path: Path) -> dict[str, tuple[str, int]]:
    """Every stored effect: event id -> (category, amount_cents)."""
    return {event_id: (category, amount) for event_id, category, amount in read_back(
        db_path, "SELECT event_id, category, amount_cents FROM effects ORDER BY event_id")}


def reasons(db_path: Path, event_id: str) -> list[tuple[str | None, str, int, str]]:
    """The journal of one event: (from_state, to_state, generation, reason) in order."""
    return read_back(db_path, "SELECT from_state, to_state, generation, reason FROM transitions "
                              "WHERE event_id = ? ORDER BY seq", (event_id,))
