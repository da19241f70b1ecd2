"""Priorities on the model clock (notebook 15): a load played on a real queue,
one model second at a time, and how long each message waited.

A ``Load`` is a bulk import at the start (priority 0) and a stream of urgent
refunds, ``urgent_per_second`` of them each second for ``seconds`` seconds,
at priority ``urgent``; one worker finishes ``rate`` messages a model second.
``play_load`` runs it on a real queue: each second its refunds are enqueued, the
queue's metrics are sampled, the worker drains at most ``rate`` messages
(the package's claim and ACK), and the model clock moves on. Nothing sleeps.
``read_waits`` reads from the journal how long each message waited from its
enqueue to its first claim, and how many messages were keyed before it in
the claim's order when it was enqueued: the ``ahead`` of
``priority.wait_bound``.

``StrictPriority`` is a contrast, NOT the package's rule: the real queue with
its claim ordered by priority first, then by due time and event id, which
is how River, Oban and procrastinate order their jobs. Only the order of the
claim differs; the load, the worker and what is measured are the same.
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass
from typing import Any

from ...clock import ModelClock
from ...handler import Handler
from ...priority import (CLAIM_ORDER, DEFAULT_PRIORITY, HEAD_START_SECONDS, HIGHEST,
                         require_priority)
from ...queue import Queue
from ...transitions import CLAIM, DUE, picking
from ...values import Metrics
from ...worker import drain

__all__ = ["REFUND_HANDLER", "Load", "StrictPriority", "Wait", "bulk_import", "longest_wait",
           "play_load", "read_waits", "refunds"]

REFUND_HANDLER = Handler().supporting("refund")  # a refund's amount goes to its own total
BULK = {"category": "book", "amount_cents": 1500}
REFUND = {"category": "refund", "amount_cents": 4200}
FIRST_REFUND = 1000  # refunds are E1000, E1001, ...; the bulk import E0001, E0002, ...
# The package's read of due messages with only its order changed: priority
# first (the highest first), then due time, then event id. Same parameters.
_ORDER = f"ORDER BY {CLAIM_ORDER}, event_id"
if _ORDER not in DUE:  # the package's read changed: this contrast must follow it
    raise ImportError(f"transitions.DUE no longer ends in {_ORDER!r}: update the contrast")
STRICT_DUE = DUE.replace(_ORDER, "ORDER BY priority DESC, available_at, event_id")


@dataclass(frozen=True, slots=True)
class Load:
    """``bulk`` orders at the start (priority 0), then ``urgent_per_second`` refunds of
    priority ``urgent`` each second for ``seconds`` seconds; the worker finishes
    ``rate`` messages a model second."""

    bulk: int
    urgent_per_second: int
    seconds: int
    rate: int
    urgent: int = HIGHEST

    def __post_init__(self) -> None:
        if not 0 < self.bulk < FIRST_REFUND or self.rate < 1 or self.seconds < 0 \
                or self.urgent_per_second < 0:
            raise ValueError(f"not a load this lab can play: {self}")
        require_priority(self.urgent)
        if FIRST_REFUND + self.refunds > 10_000:
            raise ValueError(f"{self.refunds} refunds do not fit the course's ids")

    @property
    def refunds(self) -> int:
        return self.urgent_per_second * self.seconds

    @property
    def messages(self) -> int:
        return self.bulk + self.refunds


class StrictPriority(Queue):
    """A CONTRAST, not queue_core's rule: the claim takes the due message of the
    highest priority first, however long the others have waited (strict priority).

    Everything else is the package's own: the schema, the fence, the ACK, the
    read of due messages with only its ``ORDER BY`` changed. SQLite only: on
    PostgreSQL the worker loop's step claims inside the server's function,
    in the package's order.
    """

    def __init__(self, path: Any, **options: Any) -> None:
        super().__init__(path, **options)
        if self.store.name != "sqlite":
            raise ValueError("the strict-priority contrast runs on a SQLite file only")
        self._claim_sql = picking(CLAIM, STRICT_DUE, self.store.picked)


def _line(number: int, payload: dict[str, Any]) -> str:
    return json.dumps({"event_id": f"E{number:04d}", "payload": payload})


def bulk_import(count: int) -> str:
    """``count`` orders of a bulk import as JSONL: ``E0001``, ``E0002``, ..., 1500 cents each."""
    return "\n".join(_line(n, BULK) for n in range(1, count + 1))


def refunds(count: int, first: int = FIRST_REFUND) -> str:
    """``count`` refunds as JSONL, ``E1000`` (``first``) on, 4200 cents each."""
    return "\n".join(_line(first + n, REFUND) for n in range(count))


def play_load(queue: Queue, load: Load, *, sample_every: int = 10) -> list[Metrics]:
    """Play ``load`` on ``queue`` (on a ``ModelClock``) from the clock's time until every
    message is done; return ``queue.metrics()`` sampled every ``sample_every`` seconds,
    after that second's refunds arrived and before the worker ran, and once at the end."""
    clock = queue.clock
    if not isinstance(clock, ModelClock):
        raise ValueError("play_load needs a queue on a ModelClock: nothing here sleeps")
    samples: list[Metrics] = []
    finished, refund = 0, FIRST_REFUND
    with queue.session():
        queue.enqueue_jsonl(bulk_import(load.bulk))
        for second in range(load.seconds + load.messages // load.rate + 1):
            if second < load.seconds and load.urgent_per_second:
                queue.enqueue_jsonl(refunds(load.urgent_per_second, refund), priority=load.urgent)
                refund += load.urgent_per_second
            if second % sample_every == 0:
                samples.append(queue.metrics())
            finished += len(drain(queue, REFUND_HANDLER, max_messages=load.rate))
            clock.advance(1)
            if finished == load.messages:
                break
        samples.append(queue.metrics())
    if finished != load.messages:
        raise RuntimeError(f"{load.messages - finished} messages of the load were not done")
    return samples


@dataclass(frozen=True, slots=True)
class Wait:
    """How long ``event_id`` waited: enqueued at ``due``, first claimed at ``claimed``;
    ``ahead`` messages were ready and keyed before it in the claim's order then."""

    event_id: str
    priority: int
    due: int
    claimed: int
    ahead: int

    @property
    def seconds(self) -> int:
        return self.claimed - self.due


def read_waits(queue: Queue) -> list[Wait]:
    """Every message's wait from its enqueue to its first claim, in event id order,
    read from the journal and the stored messages (a message never claimed has none).

    ``ahead`` follows the package's claim order (``priority.CLAIM_ORDER``, then the
    event id), whatever order the queue claimed in: it is the ``ahead`` of
    ``priority.wait_bound``. It counts the messages enqueued before it (in
    journal order) and not yet claimed; none of a load is in a backoff.
    """
    priority = {m.event_id: m.priority for m in queue.messages()}
    due: dict[str, int] = {}
    claimed: dict[str, int] = {}
    ahead: dict[str, int] = {}
    keys: list[tuple[int, str]] = []  # the ready messages' claim keys, in order
    for row in queue.transitions():
        key = (due.get(row.event_id, row.at) - HEAD_START_SECONDS * priority[row.event_id],
               row.event_id)
        if row.reason == "enqueued":
            due[row.event_id] = row.at
            ahead[row.event_id] = bisect.bisect_left(keys, key)
            bisect.insort(keys, key)
        elif row.reason == "claimed" and row.event_id not in claimed:
            claimed[row.event_id] = row.at
            keys.remove(key)
    return [Wait(event_id, priority[event_id], due[event_id], claimed[event_id],
                 ahead[event_id]) for event_id in sorted(claimed)]


def longest_wait(measured: list[Wait], priority: int = DEFAULT_PRIORITY) -> Wait:
    """The longest wait among the messages of ``priority`` (the first of equals)."""
    return max((w for w in measured if w.priority == priority), key=lambda w: w.seconds)
