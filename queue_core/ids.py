"""The rule a queue's event ids follow, chosen when the queue is created.

Two rules, and a queue never changes its own (``Queue(path, ids=...)``,
``queue-core enqueue --ids RULE``; stored in the queue's metadata, enforced
by the schema's CHECK on ``messages.event_id``):

- ``course``: ``E`` and four ASCII digits, the seed's teaching rule and the
  default. Prune keeps every key forever, so such a queue lives for 10,000
  events in all.
- ``general``: what real sources send, a UUID, ``order-2026-000123``,
  Stripe's ``evt_1NG8Du2eZvKYlo2C``: 1 to 128 ASCII letters, digits and
  ``_ . : -``. 128 is the limit SQS puts on a deduplication id, and
  leaves room for a composite key (``shop:order:2026-000123``); ASCII only, so
  that two spellings of one text (a composed and a decomposed ``é``) are
  never two events; no space, quote, slash or control character, so that an
  id pastes into a shell, a log line and a URL as it is.

Nothing here touches a database: both stores and every refusal of an id
before a file is opened read the rule from here.
"""

from __future__ import annotations

import re

from .errors import IdRuleDiffers

COURSE = "course"
GENERAL = "general"
RULES = (COURSE, GENERAL)
COURSE_CAPACITY = 10_000  # the events a course queue can hold in its whole life
MAX_GENERAL_LENGTH = 128
GENERAL_ALPHABET = "ASCII letters, digits and _ . : -"

_PATTERNS = {COURSE: re.compile(r"E[0-9]{4}"),
             GENERAL: re.compile(r"[A-Za-z0-9_.:-]{1,%d}" % MAX_GENERAL_LENGTH)}
_DESCRIBED = {COURSE: "E followed by four ASCII digits",
              GENERAL: f"1 to {MAX_GENERAL_LENGTH} {GENERAL_ALPHABET}"}
__all__ = ["COURSE", "COURSE_CAPACITY", "GENERAL", "IdRuleDiffers", "RULES", "described", "matches",
           "require_rule", "require_same_rule", "sql_check", "why_not"]
_ALLOWED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.:-")


def require_rule(ids: object) -> str:
    """``ids`` as a rule's name, or ``ValueError`` naming the rules there are."""
    if ids not in RULES:
        raise ValueError(f"ids must be one of {RULES}, got {ids!r}")
    return str(ids)


def require_same_rule(where: str, rule: str, wanted: str) -> None:
    """Refuse a queue whose id rule is not ``wanted`` (``IdRuleDiffers``): a queue's
    rule is chosen when it is created, and never changes."""
    if rule != wanted:
        raise IdRuleDiffers(f"{where} is a {rule} queue (its event ids are {described(rule)}, "
                            f"chosen when it was created) and cannot become a {wanted} queue; "
                            f"create a new queue for {wanted} ids")


def matches(rule: str, event_id: object) -> bool:
    """Whether ``event_id`` is an event id under ``rule``."""
    return isinstance(event_id, str) and _PATTERNS[rule].fullmatch(event_id) is not None


def described(rule: str) -> str:
    """What an id is under ``rule``, in the words the refusals use."""
    return _DESCRIBED[rule]


def why_not(rule: str, event_id: object) -> str:
    """Why ``event_id`` is no id under ``rule``: one clause, for a refusal's message."""
    if rule == COURSE or not isinstance(event_id, str):
        return f"must be {described(rule)}"
    if not event_id:
        return f"is empty; it must be {described(rule)}"
    if len(event_id) > MAX_GENERAL_LENGTH:
        return f"is {len(event_id)} characters long; at most {MAX_GENERAL_LENGTH}"
    position, bad = next((i, c) for i, c in enumerate(event_id, start=1) if c not in _ALLOWED)
    return (f"holds {bad!r} (U+{ord(bad):04X}) at character {position}; only "
            f"{GENERAL_ALPHABET} are allowed")


def sql_check(rule: str, store: str) -> str:
    """The CHECK that holds ``messages.event_id`` to ``rule``, in ``store``'s SQL.

    On SQLite a CHECK is evaluated again only by an UPDATE of a column it
    names, so a state change never re-checks the id. PostgreSQL evaluates
    every CHECK of the table on every new version of a row, so the id's
    check is paid on each claim and ACK there: ``make bench`` measures it
    (``benchmarks/bench_idcheck.py``).
    """
    if store == "sqlite":
        if rule == COURSE:
            return "length(event_id) = 5 AND event_id GLOB 'E[0-9][0-9][0-9][0-9]'"
        # In a GLOB class a '-' last is itself; '^' first negates the class.
        return (f"length(event_id) BETWEEN 1 AND {MAX_GENERAL_LENGTH} "
                "AND event_id NOT GLOB '*[^A-Za-z0-9_.:-]*'")
    if rule == COURSE:
        return "event_id ~ '^E[0-9]{4}$'"
    # Not '^[...]{1,128}$', which accepts the same ids: PostgreSQL's regex engine
    # expands a bounded repeat into states, and that CHECK cost tens of times
    # this one's per UPDATE (make bench prints this one's cost).
    return (f"length(event_id) BETWEEN 1 AND {MAX_GENERAL_LENGTH} "
            "AND event_id !~ '[^A-Za-z0-9_.:-]'")
