"""What the command line prints: ``status`` and ``metrics`` as aligned text or
one JSON object, and the last line of ``work``, which says why it stopped.

Text only, from values already read: nothing here opens the queue.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone

from .ids import COURSE, described
from .values import Metrics, Status


def work_summary(metrics: Metrics, processed: int, limit: int | None) -> str:
    """The last line of ``work``: why it stopped, and what is still waiting."""
    due = metrics.oldest_ready_age is not None or metrics.expired_leases > 0
    if due and limit is not None and processed >= limit:
        return (f"stopped at --max {limit} ({processed} processed); the rest is still queued "
                f"(ready {metrics.depth['ready']}, leased {metrics.depth['leased']}): "
                "run work again to go on")
    if due:  # the system clock passed a retry's time after the last claim looked
        return (f"more became due at t={metrics.at} ({processed} processed): "
                "run work again to take it")
    if metrics.next_due_at is not None:
        return (f"nothing due at t={metrics.at} ({processed} processed); "
                f"{_ready(metrics)}, the next due at t={metrics.next_due_at}, "
                f"in {_duration(metrics.next_due_at - metrics.at)}")
    return f"nothing left to claim at t={metrics.at} ({processed} processed)"




def status_lines(status: Status, *, as_json: bool) -> list[str]:
    """``status``: states, effects, money per category and in total."""
    if as_json:
        return [json.dumps(status.as_dict(), sort_keys=False)]
    return ["states:  " + ", ".join(f"{name} {n}" for name, n in status.states.items()),
            *_pruned(status.pruned),
            f"effects: {status.effects}",
            *(f"  {category:<8}{cents:>12}" for category, cents in status.totals.items()),
            f"total:   {status.total}",
            *_ids(status.ids),
            *(f"priority {priority}: " + ", ".join(f"{name} {n}" for name, n in states.items())
              for priority, states in status.priorities.items())]


def _ids(rule: str) -> list[str]:
    """The line on the id rule, for a queue that does not have the course's."""
    return [] if rule == COURSE else [f"ids:     {rule} ({described(rule)})"]


def _pruned(pruned: int) -> list[str]:
    """The line on pruned messages, once there are any (``prune``)."""
    if not pruned:
        return []
    return [f"pruned:  {pruned} of the done (payload and journal dropped; key, digest, "
            "effect kept)"]


def metrics_lines(metrics: Metrics, *, as_json: bool, model_time: bool) -> list[str]:
    """``metrics``: the moment (its UTC date on the system clock), depth, the
    oldest due message or the next one due, expired leases, dead attempts."""
    if as_json:
        return [json.dumps({"at": metrics.at, "depth": dict(metrics.depth),
                            "oldest_ready_age": metrics.oldest_ready_age,
                            "next_due_at": metrics.next_due_at,
                            "expired_leases": metrics.expired_leases,
                            "dead_attempts": dict(metrics.dead_attempts),
                            "pruned": metrics.pruned, "ids": metrics.ids,
                            **({"priorities": {str(priority): figures.as_dict() for
                                               priority, figures in metrics.priorities.items()}}
                               if metrics.priorities else {})})]
    clock = "model time" if model_time else \
        f"{datetime.fromtimestamp(metrics.at, timezone.utc):%Y-%m-%d %H:%M:%S} UTC"
    expired = metrics.expired_leases
    lines = {
        "at": f"t={metrics.at} ({clock})",
        "depth": ", ".join(f"{name} {n}" for name, n in metrics.depth.items()),
        "oldest due": _oldest_due(metrics),
        "expired leases": f"{expired}" + (" (past their deadline; the next claim recovers "
                                          "them)" if expired else ""),
        "dead attempts": ", ".join(f"{event_id} {n}" for event_id, n
                                   in metrics.dead_attempts.items()) or "none dead",
    }
    if metrics.pruned:
        lines["pruned"] = f"{metrics.pruned} done messages (payload and journal dropped)"
    if metrics.ids != COURSE:
        lines["ids"] = f"{metrics.ids} ({described(metrics.ids)})"
    for priority, figures in metrics.priorities.items():  # once one is not the default
        age = figures.oldest_ready_age
        lines[f"priority {priority}"] = (
            ", ".join(f"{name} {n}" for name, n in figures.depth.items())
            + ("; none due" if age is None else f"; oldest due waiting {_duration(age)}"))
    return [f"{name + ':':<16}{value}" for name, value in lines.items()]


def _oldest_due(metrics: Metrics) -> str:
    if metrics.oldest_ready_age is not None:
        return (f"waiting {_duration(metrics.oldest_ready_age)}, "
                f"since t={metrics.at - metrics.oldest_ready_age}")
    if metrics.next_due_at is None:
        return "none due, none ready"
    return (f"none due; {_ready(metrics)}, the next due at t={metrics.next_due_at}, "
            f"in {_duration(metrics.next_due_at - metrics.at)}")


def _ready(metrics: Metrics) -> str:
    ready = metrics.depth["ready"]
    return f"{ready} ready message{'s' if ready != 1 else ''} waiting"


def _duration(seconds: int) -> str:
    """Seconds, with a rounded larger unit when there is one: 90061 s (about 1.0 days)."""
    for unit, size in (("years", 365.25 * 86400), ("days", 86400), ("hours", 3600),
                       ("minutes", 60)):
        if seconds >= 2 * size:
            return f"{seconds} s (about {seconds / size:.1f} {unit})"
    return f"{seconds} s"
