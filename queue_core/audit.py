"""The one reader of stored facts: a consistent snapshot, and what it violates.

``snapshot(path)`` reads everything the queue stores (each message's row,
every effect, money and counts, the whole journal, SQLite's own checks) in
ONE read transaction, so nothing it returns mixes two moments. ``check``
holds a snapshot against the invariants of the protocol and returns named
findings, none when all holds. ``status``, ``metrics``, the crash sweep, the
power-loss sweep, the stress run, the benchmark's verification and every
exercise check read through here; nothing else in the package spells these
queries. The queries themselves, and the snapshot that runs them, are in
``ledger``; every one of their names is importable from here too.

Findings (``FINDINGS`` lists them with what each means):

``integrity_check``        SQLite's ``PRAGMA integrity_check`` is not ``ok``
``foreign_key_check``      a row points at a message that does not exist
``done_without_effect``    a ``done`` message has no effect
``effect_without_done``    an effect belongs to a message that is not ``done``
``effect_written_twice``   one event's effect is stored more than once
``effect_differs``         an effect is not what the handler computes from
                           the stored payload (an edited effect)
``money_mismatch``         the stored totals are not the sum of the effects
``dead_without_reason``    a ``dead`` message has no ``last_error``
``journal_disagrees``      an event's last journal state is not its stored state
``illegal_edge``           a journal step is not an edge of the state machine,
                           or does not start where the previous step ended
``generation_skipped``     a claim's generation is not the previous one plus 1,
                           or the stored generation is not the last claim's
``double_ack``             an event was journalled ``done`` more than once
``stale_lease_accepted``   a lease that was no longer the newest finished
                           (ACK or failure) its message
``digest_differs``         a stored payload's SHA-256 is not the digest kept
                           for it (schema 2)
``history_missing``        a pruned message has no compacted record of its
                           journal (schema 2)

On a pruned message (schema 2: ``retention``) the journal is replaced by a
compacted record, and the payload by its digest. The audit then holds the
message and its effect against that record: an edited effect
(``effect_differs``), a deleted effect (``done_without_effect``), a deleted
record (``history_missing``), a record or a generation edited apart
(``generation_skipped``), journal rows written for it again
(``journal_disagrees``). What it cannot see any more: an effect and its record
edited together, consistently (the payload that would contradict both is
gone), and an edited digest (until a replay of the event meets it, and is
refused as a conflict).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass
from typing import Iterable

from .errors import InvalidPayload
from .handler import Handler
from .ingest import payload_digest
from .ledger import (CONTRAST_LEDGER, EffectRow, Snapshot, read_compacted, read_digests,
                     read_effects, read_effects_among, read_journal, read_journal_after,
                     read_journal_among, read_message_rows_among, read_messages,
                     read_messages_among, read_metrics, read_status, read_version, rows_among,
                     snapshot)
from .values import Compacted, Effect, Message, State, Transition

# The reads live in ``ledger``; every name they had here stays importable from here.
__all__ = ["CONTRAST_LEDGER", "EDGES", "FINDINGS", "EffectRow", "Finding", "Snapshot", "check",
           "effect_findings", "findings", "history_findings", "read_compacted", "read_digests",
           "read_effects", "read_effects_among", "read_journal", "read_journal_after",
           "read_journal_among", "read_message_rows_among", "read_messages",
           "read_messages_among", "read_metrics", "read_status", "read_version", "rows_among",
           "snapshot"]

FINDINGS = {
    "integrity_check": "SQLite's integrity check is not ok",
    "foreign_key_check": "a row points at a message that does not exist",
    "done_without_effect": "a done message has no effect",
    "effect_without_done": "an effect belongs to a message that is not done",
    "effect_written_twice": "one event's effect is stored more than once",
    "effect_differs": "an effect is not what the handler computes from the stored payload",
    "money_mismatch": "the stored totals are not the sum of the effects",
    "dead_without_reason": "a dead message has no last_error",
    "journal_disagrees": "an event's last journal state is not its stored state",
    "illegal_edge": "a journal step is not an edge of the state machine, or skips a step",
    "generation_skipped": "a claim's generation is not the previous one plus one",
    "double_ack": "an event was journalled done more than once",
    "stale_lease_accepted": "a lease that was no longer the newest finished its message",
    "digest_differs": "a stored payload's SHA-256 is not the digest kept for it",
    "history_missing": "a pruned message has no compacted record of its journal",
}

# The state machine's edges; the schema's ``legal_edge`` CHECK holds the same.
EDGES = frozenset({(None, State.READY), (State.READY, State.LEASED),
                   (State.LEASED, State.DONE), (State.LEASED, State.READY),
                   (State.LEASED, State.DEAD), (State.DEAD, State.READY)})

@dataclass(frozen=True, slots=True)
class Finding:
    """One violated invariant, named, with the event it concerns and what was found.

    ``name`` is stable (a key of ``FINDINGS``); ``event_id`` is ``None`` when
    the finding concerns the whole file; ``detail`` says what was found.
    """

    name: str
    event_id: str | None
    detail: str

    def __str__(self) -> str:
        where = f"{self.event_id}: " if self.event_id else ""
        return f"{self.name}: {where}{self.detail}"


# -- checking ---------------------------------------------------------------------------

def check(snap: Snapshot) -> list[Finding]:
    """Every invariant the snapshot violates, as named findings (none: all holds)."""
    return [*_sqlite_checks(snap), *_effect_checks(snap), *_money_checks(snap),
            *_journal_checks(snap), *_digest_checks(snap)]


def findings(path: str | os.PathLike[str]) -> list[Finding]:
    """``check(snapshot(path))``: the findings of the file as it stands now."""
    return check(snapshot(path))


def _sqlite_checks(snap: Snapshot) -> Iterable[Finding]:
    if snap.integrity != ("ok",):
        yield Finding("integrity_check", None, "; ".join(snap.integrity)[:300])
    for table, rowid, parent, _ in snap.foreign_keys:
        row = f"a row of {table}" if rowid is None else f"{table} row {rowid}"  # WITHOUT ROWID
        missing = "message" if parent == "messages" else f"row of {parent}"
        yield Finding("foreign_key_check", None, f"{row} points at a missing {missing} "
                                                 f"(the foreign key from {table} to {parent})")


def _effect_checks(snap: Snapshot) -> Iterable[Finding]:
    written = Counter(row.event_id for row in snap.effect_rows)
    for event_id, message in snap.messages.items():
        if message.state == State.DONE and not written[event_id]:
            yield Finding("done_without_effect", event_id, "done, but no effect is stored")
        if message.state == State.DEAD and message.last_error is None:
            yield Finding("dead_without_reason", event_id, "dead, but last_error is empty")
    for event_id, count in sorted(written.items()):
        message = snap.messages.get(event_id)
        if message is None or message.state != State.DONE:
            found = "no message" if message is None else f"a {message.state} message"
            yield Finding("effect_without_done", event_id, f"an effect belongs to {found}")
        if count > 1:
            yield Finding("effect_written_twice", event_id, f"{count} effect rows")
    for row in snap.effect_rows:
        message = snap.messages.get(row.event_id)
        if message is not None:
            yield from effect_findings(row, message, snap.compacted.get(row.event_id))


def effect_findings(row: EffectRow, message: Message,
                    record: Compacted | None = None) -> Iterable[Finding]:
    stored = Effect(row.category, row.amount_cents)
    if message.payload is None:  # pruned: only its compacted record is left to compare with
        if record is not None and (record.category, record.amount_cents) != \
                (stored.category, stored.amount_cents):
            yield Finding("effect_differs", row.event_id,
                          f"effect {stored.category} {stored.amount_cents}, its compacted "
                          f"record kept {record.category} {record.amount_cents}")
        return
    try:
        # Whichever handler version wrote it knew this category; the amount
        # and the category must still be the payload's own.
        expected = Handler({row.category}).effect_of(json.loads(message.payload))
    except InvalidPayload as exc:
        yield Finding("effect_differs", row.event_id,
                      f"effect {stored.category} {stored.amount_cents}, but the payload: {exc}")
        return
    if expected != stored:
        yield Finding("effect_differs", row.event_id,
                      f"effect {stored.category} {stored.amount_cents}, payload says "
                      f"{expected.category} {expected.amount_cents}")


def _money_checks(snap: Snapshot) -> Iterable[Finding]:
    rows = [row for row in snap.effect_rows if row.table == "effects"]
    totals: Counter[str] = Counter()
    for row in rows:
        totals[row.category] += row.amount_cents
    if dict(totals) != dict(snap.status.totals) or len(rows) != snap.status.effects:
        yield Finding("money_mismatch", None, f"stored totals {dict(snap.status.totals)} over "
                      f"{snap.status.effects} effects; the effect rows sum to {dict(totals)} "
                      f"over {len(rows)}")
    counted = Counter(message.state.value for message in snap.messages.values())
    if any(counted[state] != n for state, n in snap.status.states.items()):
        yield Finding("money_mismatch", None, f"state counts {dict(snap.status.states)} "
                      f"differ from the rows {dict(counted)}")


def _journal_checks(snap: Snapshot) -> Iterable[Finding]:
    steps: dict[str, list[Transition]] = {}
    for step in snap.journal:
        steps.setdefault(step.event_id, []).append(step)
    for event_id, message in snap.messages.items():
        if message.payload is None:  # pruned: its record stands for its journal
            yield from _pruned_history(message, snap.compacted.get(event_id),
                                       steps.get(event_id, []))
        else:
            yield from history_findings(message, steps.get(event_id, []))
            if event_id in snap.compacted:
                yield Finding("journal_disagrees", event_id, "a compacted record, but the "
                              "message keeps its payload and journal (it was never pruned)")
    for event_id in sorted(set(steps) - set(snap.messages)):
        yield Finding("journal_disagrees", event_id, "journalled, but no message is stored")


def _pruned_history(message: Message, record: Compacted | None,
                    steps: list[Transition]) -> Iterable[Finding]:
    event_id = message.event_id
    if record is None:
        yield Finding("history_missing", event_id, "pruned, but no compacted record of its "
                      "journal is stored")
    elif record.claims != message.generation:
        yield Finding("generation_skipped", event_id, f"stored generation "
                      f"{message.generation}, its compacted record counted {record.claims} "
                      "claims")
    if steps:
        yield Finding("journal_disagrees", event_id, f"pruned, yet {len(steps)} journal rows "
                      "are stored for it")


def _digest_checks(snap: Snapshot) -> Iterable[Finding]:
    for event_id, digest in snap.digests.items():
        payload = snap.messages[event_id].payload
        if payload is not None and payload_digest(payload) != digest:
            yield Finding("digest_differs", event_id, "the stored payload's SHA-256 is not "
                          "the digest kept for it (a replay would be judged by the digest)")


def history_findings(message: Message, steps: list[Transition]) -> Iterable[Finding]:
    """Walk one event's journal: legal, continuous edges; claims that count
    generations one by one; one ACK; every exit from ``leased`` by the newest lease."""
    event_id, previous, claimed, acks = message.event_id, None, 0, 0
    for step in steps:
        if (step.from_state, step.to_state) not in EDGES or step.from_state != previous:
            yield Finding("illegal_edge", event_id,
                          f"step {step.seq} {step.from_state or 'new'} -> {step.to_state} "
                          f"after {previous or 'nothing'}")
        if step.to_state == State.LEASED:
            if step.generation != claimed + 1:
                yield Finding("generation_skipped", event_id, f"claim at step {step.seq} "
                              f"has generation {step.generation} after {claimed}")
            claimed = step.generation
        elif step.from_state == State.LEASED and step.generation != claimed:
            yield Finding("stale_lease_accepted", event_id,
                          f"step {step.seq} ({step.reason}) by generation {step.generation}, "
                          f"newest lease {claimed}")
        acks += step.to_state == State.DONE
        previous = step.to_state
    if previous != message.state:
        yield Finding("journal_disagrees", event_id, f"stored {message.state}, journal ends "
                      f"at {previous or 'nothing'}")
    if message.generation != claimed:
        yield Finding("generation_skipped", event_id, f"stored generation {message.generation}, "
                      f"the journal's last claim {claimed}")
    if acks > 1:
        yield Finding("double_ack", event_id, f"journalled done {acks} times")
