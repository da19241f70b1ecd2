"""Immutable values that callers hold: states, leases, results, journal rows."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any, Mapping


class State(StrEnum):
    """Where a message is in its life; see the state machine in notebook 00."""

    READY = "ready"
    LEASED = "leased"
    DONE = "done"
    DEAD = "dead"


@dataclass(frozen=True, slots=True)
class Lease:
    """The fencing token a worker gets from ``claim`` and hands back to finish.

    ``generation`` grows by one on every claim of this event and is never
    reset, so a lease from an earlier claim can never ACK, even after a
    redrive has reset ``attempt`` to 1.
    """

    event_id: str
    generation: int
    attempt: int
    lease_until: int
    # The stored payload, as the claim read it (``None`` for a lease made by
    # hand): PostgreSQL's worker step computes the effect from it, and the
    # server refuses the ACK unless its SHA-256 is the stored one. Not part of
    # the token's identity, and never shown.
    payload: str | None = field(default=None, repr=False, compare=False)


@dataclass(frozen=True, slots=True)
class Effect:
    """The business result of one event: the amount added to a category."""

    category: str
    amount_cents: int


@dataclass(frozen=True, slots=True)
class EnqueueResult:
    """How many events a batch added and how many were exact repeats."""

    inserted: int
    duplicates: int


@dataclass(frozen=True, slots=True)
class Message:
    """One stored row of ``messages``, exactly as the database holds it."""

    event_id: str
    payload: str | None  # None once pruned: its digest and effect stay (``retention``)
    state: State
    attempts: int
    generation: int
    available_at: int
    lease_until: int | None
    last_error: str | None
    priority: int = 0  # its head start in the claim's order (``priority``)

    @classmethod
    def from_row(cls, row: tuple[Any, ...]) -> "Message":
        """Build from a ``SELECT`` of the columns in declaration order, the priority last."""
        (event_id, payload, state, attempts, generation, available_at, lease_until, last_error,
         priority) = row
        return cls(event_id, payload, State(state), attempts, generation,
                   available_at, lease_until, last_error, priority)


@dataclass(frozen=True, slots=True)
class Compacted:
    """What a pruned message's journal proved, kept in its place (``retention``):
    enqueued at ``enqueued_at``, claimed ``claims`` times (generations 1 to
    ``claims``), redriven ``redrives`` times, completed once by its newest
    lease, in ``steps`` journal rows, with this effect."""

    event_id: str
    enqueued_at: int
    claims: int
    redrives: int
    steps: int
    category: str
    amount_cents: int


@dataclass(frozen=True, slots=True)
class Transition:
    """One journal row: a state change written in the same transaction as it."""

    seq: int
    at: int
    event_id: str
    from_state: State | None
    to_state: State
    generation: int
    attempts: int
    reason: str


@dataclass(frozen=True, slots=True)
class Status:
    """Stored values only: counts per state, effects and money per category."""

    states: Mapping[str, int]
    effects: int
    totals: Mapping[str, int]
    total: int
    pruned: int = 0  # done messages whose payload and journal were pruned
    ids: str = "course"  # the rule the queue's event ids follow (``ids``)
    # Counts per state of each priority stored (``priority``), lowest first; empty
    # while every message has the default priority, 0.
    priorities: Mapping[int, Mapping[str, int]] = field(default_factory=dict)

    def __repr__(self) -> str:
        return _repr_shown(self)

    def as_dict(self) -> dict[str, Any]:
        """The shape ``status --json`` prints (``priorities`` once a message has one
        other than 0, its keys the priorities as text, as JSON's keys are)."""
        shape = {"states": dict(self.states), "effects": self.effects,
                 "totals": dict(self.totals), "total": self.total, "pruned": self.pruned,
                 "ids": self.ids}
        if self.priorities:
            shape["priorities"] = {str(priority): dict(states)
                                   for priority, states in self.priorities.items()}
        return shape


@dataclass(frozen=True, slots=True)
class PriorityFigures:
    """What ``Metrics`` says of the messages of one priority.

    Depth by state, and how long the oldest due ``ready`` one has waited
    (``None`` if none is due).
    """

    depth: Mapping[str, int]
    oldest_ready_age: int | None

    def as_dict(self) -> dict[str, Any]:
        return {"depth": dict(self.depth), "oldest_ready_age": self.oldest_ready_age}


@dataclass(frozen=True, slots=True)
class Metrics:
    """Operational figures at one instant, from stored values only.

    ``oldest_ready_age`` is how long the oldest due ``ready`` message has
    waited (``None`` if none is due); ``expired_leases`` are still stored as
    ``leased`` although their deadline has passed (only a claim recovers
    them); ``dead_attempts`` maps each dead event id to the attempts it spent;
    ``next_due_at`` is the earliest ``available_at`` of a ``ready`` message
    that is not due yet (``None`` if there is none): when a worker that found
    nothing due would next find something.
    """

    at: int
    depth: Mapping[str, int]
    oldest_ready_age: int | None
    expired_leases: int
    dead_attempts: Mapping[str, int]
    next_due_at: int | None = None
    pruned: int = 0  # done messages whose payload and journal were pruned
    ids: str = "course"  # the rule the queue's event ids follow (``ids``)
    # The same figures per priority (``priority``), lowest first; empty while
    # every message has the default priority, 0.
    priorities: Mapping[int, PriorityFigures] = field(default_factory=dict)

    def __repr__(self) -> str:
        return _repr_shown(self)


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one processing attempt ended in, for logs and notebook tables.

    ``kind`` is ``done``, ``retry`` (back to ready at ``available_at``),
    ``dead``, or ``lost`` (the lease was lost before the ACK, or the ACK
    waited past PostgreSQL's ``lock_timeout``: then ``code`` is ``lock_timeout``).
    """

    event_id: str
    kind: str
    generation: int
    code: str | None = None
    effect: Effect | None = None
    available_at: int | None = None
    detail: str = field(default="", compare=False)

    def __str__(self) -> str:
        text = f"{self.event_id} {self.kind} (generation {self.generation})"
        if self.effect is not None:
            text += f": {self.effect.category} +{self.effect.amount_cents}"
        if self.code is not None:
            text += f": {self.code}"
        if self.available_at is not None:
            text += f", available again at {self.available_at}"
        if self.detail:
            text += f": {self.detail}"
        return text


def _repr_shown(value: Any) -> str:
    """The dataclass's repr, without ``priorities`` while it is empty: a queue whose
    messages all have the default priority prints as it did before priorities."""
    shown = [f"{item.name}={getattr(value, item.name)!r}" for item in fields(value)
             if item.name != "priorities" or getattr(value, item.name)]
    return f"{type(value).__name__}({', '.join(shown)})"


def require_positive(name: str, value: object) -> None:
    """Refuse (``ValueError``, naming the argument) a ``value`` that is not a whole
    number of 1 or more: a bool is not one, though Python counts it as an int."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
