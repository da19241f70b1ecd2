"""A message's priority: a head start in the claim's order, so that nothing waits forever.

A priority is an integer from 0 to 9, set when a message is enqueued (0, the
default, is the order every queue had before priorities). It is a head start
of ``HEAD_START_SECONDS`` per step: the claim takes due messages in the order
of ``available_at - 60 * priority`` (``CLAIM_ORDER``), then by event id. A
message of priority 9 that became due at 12:09 is taken before one of
priority 0 that became due at 12:01, and after one of priority 0 that became
due at 11:59.

Why a head start, and not strict priority: under strict priority a steady
stream of urgent messages starves every other one, for as long as it lasts
(River, Oban and procrastinate order strictly; chapter 15's "How does the
real world do it?" gives the sources). A head start bounds what can overtake
a message of priority ``p`` due at ``t``: only a message of a priority ``q``
at least ``p`` due at most ``(q - p) * 60`` seconds after it, so at most
``(9 - p) * 60`` (at exactly that gap the two keys are equal, and the event
ids decide: one of its own priority overtakes it only in the second ``t``,
with a smaller event id). So its wait is at most the time it takes the
workers to finish what is keyed before it: the messages already ahead at
``t`` and those that can still overtake it, due from ``t`` to
``t + (9 - p) * 60`` (``wait_bound``). Whatever the load, that set is finite.

What a priority does not change: a message is never claimed before it is due
(``available_at <= now``: backoff holds for an urgent message too), and the
fence, the claim budget, backoff, the dead-letter state and redrive are the
same for every priority. A retried or redriven message keeps its priority.
A replay of a stored event with another priority is a duplicate, and keeps
the stored one: the priority says how soon to deliver an event, not what
happened, and a source that repeats an event must not be refused for it.

Nothing here touches a database: both stores' schema, the claim, prune's
read and every refusal of a priority read the rule from here.
"""

from __future__ import annotations

__all__ = ["CLAIM_ORDER", "DEFAULT_PRIORITY", "HEAD_START_SECONDS", "LOWEST", "HIGHEST",
           "PRIORITIES", "PRIORITY_SINCE", "head_start", "require_priority", "wait_bound"]

LOWEST = 0
HIGHEST = 9
PRIORITIES = range(LOWEST, HIGHEST + 1)
DEFAULT_PRIORITY = LOWEST
HEAD_START_SECONDS = 60  # per step of priority: priority 9 is keyed nine minutes earlier
# The claim's order, as both stores' live index holds it (the text must be the
# index's own, so that SQLite matches the expression). Then ``event_id``.
CLAIM_ORDER = f"available_at - {HEAD_START_SECONDS} * priority"
# The schema version from which each store keeps a message's priority (the
# stores' ``SCHEMA_VERSION``s count apart; a queue of an earlier version holds
# every message at the default, and is read as such).
PRIORITY_SINCE = {"sqlite": 4, "postgresql": 6}


def require_priority(priority: object) -> int:
    """``priority`` as a priority, or ``ValueError`` saying what one is."""
    if isinstance(priority, bool) or not isinstance(priority, int) or priority not in PRIORITIES:
        raise ValueError(f"priority must be an integer from {LOWEST} to {HIGHEST}, "
                         f"got {priority!r}")
    return priority


def head_start(priority: int) -> int:
    """How many seconds earlier than its ``available_at`` a message of ``priority`` is keyed."""
    return HEAD_START_SECONDS * require_priority(priority)


def wait_bound(priority: int, ahead: int, urgent_per_second: float, rate: float) -> float:
    """The longest a message of ``priority`` can wait once it is due, in seconds.

    ``ahead`` messages are keyed before it when it becomes due, at ``t``;
    after that, only messages that become due from ``t`` to ``t + (HIGHEST -
    priority) * 60`` can still overtake it: those of a higher priority, and in
    the second ``t`` itself those of its own priority with a smaller event id
    (equal keys: the event ids decide). The window's whole seconds of the
    model clock count, both ends included (at its last second a message of
    the highest priority has this one's key), at most ``urgent_per_second``
    of them in each (every message that can overtake, not only the most
    urgent), in the worst case all of the highest priority. The workers finish ``rate`` messages a second. Once
    that window has closed, nothing new can go before it, so the wait is at
    most the time to finish what is ahead of it (a retry that becomes due
    again in the window counts as one more arrival). Bounded for every load:
    under strict priority, no bound exists once ``urgent_per_second >= rate``.
    """
    require_priority(priority)
    if rate <= 0:
        raise ValueError(f"rate must be positive, got {rate!r}")
    seconds = (HIGHEST - priority) * HEAD_START_SECONDS + 1  # from t to t + window, both ends
    return (ahead + urgent_per_second * seconds) / rate
