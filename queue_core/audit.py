"""The one reader of stored facts: a consistent snapshot, and what it violates.

``snapshot(path)`` reads everything the queue stores (each message's row,
every effect, money and counts, the whole journal, SQLite's own checks) in
ONE read transaction, so nothing it returns mixes two moments. ``check``
holds a snapshot against the invariants of the protocol and returns named
findings, none when all holds. ``status``, ``metrics``, the crash sweep, the
power-loss sweep, the stress run, the benchmark's verification and every
exercise check read through here; nothing else in the package spells these
queries.

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
import sqlite3
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from .errors import InvalidPayload
from .handler import Handler
from .ingest import payload_digest
from .marks import too_new
from .sqlite import has_table
from .stores import open_store
from .transitions import EXPIRED
from .values import Compacted, Effect, Message, Metrics, State, Status, Transition

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

# A table of effects that the course's broken contrasts write instead of
# ``effects``; it has no unique key, so the audit can see a double there.
CONTRAST_LEDGER = "naive_ledger"

_MESSAGE_COLUMNS = ("event_id, payload, state, attempts, generation, available_at, "
                    "lease_until, last_error")
_JOURNAL_COLUMNS = "seq, at, event_id, from_state, to_state, generation, attempts, reason"
_CHUNK = 500  # event ids per IN (...) list


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


@dataclass(frozen=True, slots=True)
class EffectRow:
    """One stored effect row; ``table`` is ``effects`` or the contrasts' ledger."""

    event_id: str
    category: str
    amount_cents: int
    table: str = "effects"


@dataclass(frozen=True)
class Snapshot:
    """Everything a queue file holds, read at one committed moment."""

    status: Status
    messages: Mapping[str, Message]
    effect_rows: tuple[EffectRow, ...]
    journal: tuple[Transition, ...]
    integrity: tuple[str, ...]
    foreign_keys: tuple[tuple[Any, ...], ...]
    version: int = 1
    # schema 2: each message's payload digest, and each pruned message's record
    digests: Mapping[str, bytes] = field(default_factory=dict)
    compacted: Mapping[str, Compacted] = field(default_factory=dict)

    @property
    def effects(self) -> dict[str, Effect]:
        """The effect of each event (the last row where one was written twice)."""
        return {row.event_id: Effect(row.category, row.amount_cents) for row in self.effect_rows}

    @property
    def money(self) -> int:
        """The sum of every effect row, wherever it was written."""
        return sum(row.amount_cents for row in self.effect_rows)

    def states(self) -> dict[str, str]:
        """Each event's stored state."""
        return {event_id: message.state.value for event_id, message in self.messages.items()}


# -- reading (the caller holds one read transaction) ----------------------------------

def read_status(conn: sqlite3.Connection) -> Status:
    """Counts per state, effects and money per category, as stored."""
    states = {state.value: 0 for state in State}
    states.update(conn.execute("SELECT state, count(*) FROM messages GROUP BY state"))
    # CAST: PostgreSQL sums a bigint column as numeric, which Python reads as Decimal.
    totals = dict(conn.execute("SELECT category, CAST(sum(amount_cents) AS BIGINT) FROM effects "
                               "GROUP BY category ORDER BY category"))
    effects = conn.execute("SELECT count(*) FROM effects").fetchone()[0]
    pruned = conn.execute("SELECT count(*) FROM messages WHERE payload IS NULL").fetchone()[0]
    return Status(states, effects, totals, sum(totals.values()), pruned)


def read_metrics(conn: sqlite3.Connection, now: int) -> Metrics:
    """Depth by state, age of the oldest due message, expired leases not yet
    recovered, the attempts each dead message spent, and when the next
    message that is not due yet becomes due."""
    status = read_status(conn)
    depth = status.states
    oldest = conn.execute("SELECT min(available_at) FROM messages "
                          "WHERE state = 'ready' AND available_at <= ?", (now,)).fetchone()[0]
    next_due = conn.execute("SELECT min(available_at) FROM messages "
                            "WHERE state = 'ready' AND available_at > ?", (now,)).fetchone()[0]
    expired = conn.execute(f"SELECT count(*) FROM ({EXPIRED}) AS expired", (now,)).fetchone()[0]
    dead = dict(conn.execute("SELECT event_id, attempts FROM messages "
                             "WHERE state = 'dead' ORDER BY event_id"))
    return Metrics(now, depth, None if oldest is None else now - oldest, expired, dead, next_due,
                   status.pruned)


def read_messages(conn: sqlite3.Connection, event_id: str | None = None) -> list[Message]:
    """Stored messages in event id order, all or the one named."""
    rows = conn.execute(f"SELECT {_MESSAGE_COLUMNS} FROM messages "
                        "WHERE CAST(? AS TEXT) IS NULL OR event_id = ? ORDER BY event_id", (event_id, event_id))
    return [Message.from_row(row) for row in rows]


def read_messages_among(conn: Any, event_ids: list[str]) -> list[Message]:
    """The stored messages among ``event_ids`` (in no particular order)."""
    return [Message.from_row(row) for row in rows_among(
        conn, f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE event_id IN ({{}})", event_ids)]


def read_effects_among(conn: Any, event_ids: list[str]) -> dict[str, EffectRow]:
    """The effect rows of ``event_ids`` that exist: event id -> row."""
    return {row[0]: EffectRow(*row) for row in rows_among(
        conn, "SELECT event_id, category, amount_cents FROM effects WHERE event_id IN ({})",
        event_ids)}


def read_journal_after(conn: Any, after: int, limit: int) -> list[Transition]:
    """Up to ``limit`` journal rows after sequence number ``after``, oldest first: a
    walk of the journal a page at a time, which never holds all of it."""
    return [_transition(row) for row in conn.execute(
        f"SELECT {_JOURNAL_COLUMNS} FROM transitions WHERE seq > ? ORDER BY seq LIMIT ?",
        (after, limit))]


def rows_among(conn: Any, template: str, event_ids: list[str]) -> list[tuple[Any, ...]]:
    """The rows of ``template`` (its ``IN ({})`` filled with one parameter per id) for
    ``event_ids``, in chunks of ``_CHUNK`` ids, well under SQLite's variable limit."""
    found: list[tuple[Any, ...]] = []
    for start in range(0, len(event_ids), _CHUNK):
        chunk = event_ids[start:start + _CHUNK]
        found += conn.execute(template.format(", ".join("?" * len(chunk))), chunk).fetchall()
    return found


def read_effects(conn: sqlite3.Connection) -> list[EffectRow]:
    """Every stored effect row, the contrasts' ledger included where it exists."""
    rows = [EffectRow(*row) for row in conn.execute(
        "SELECT event_id, category, amount_cents FROM effects ORDER BY event_id")]
    if has_table(conn, CONTRAST_LEDGER):
        rows += [EffectRow(*row, table=CONTRAST_LEDGER) for row in conn.execute(
            f"SELECT event_id, category, amount_cents FROM {CONTRAST_LEDGER} ORDER BY seq")]
    return rows


def read_journal(conn: sqlite3.Connection, event_id: str | None = None) -> list[Transition]:
    """The journal of state changes in order, for one event or all."""
    rows = conn.execute(f"SELECT {_JOURNAL_COLUMNS} FROM transitions "
                        "WHERE CAST(? AS TEXT) IS NULL OR event_id = ? ORDER BY seq", (event_id, event_id))
    return [_transition(row) for row in rows]


def _transition(row: tuple[Any, ...]) -> Transition:
    seq, at, event_id, src, dst, generation, attempts, reason = row
    return Transition(seq, at, event_id, State(src) if src else None, State(dst), generation,
                      attempts, reason)


def read_version(conn: Any) -> int:
    """The schema version of the queue the connection reads."""
    if isinstance(conn, sqlite3.Connection):
        return int(conn.execute("PRAGMA user_version").fetchone()[0])
    return int(conn.execute("SELECT schema_version FROM queue_core_meta").fetchone()[0])


def read_digests(conn: Any) -> dict[str, bytes]:
    """Each message's payload digest (schema 2)."""
    return {event_id: bytes(digest) for event_id, digest in conn.execute(
        "SELECT event_id, payload_sha256 FROM messages ORDER BY event_id")}


def read_compacted(conn: Any) -> dict[str, Compacted]:
    """Each pruned message's compacted record (schema 2)."""
    return {row[0]: Compacted(*row) for row in conn.execute(
        "SELECT event_id, enqueued_at, claims, redrives, steps, category, amount_cents "
        "FROM compacted ORDER BY event_id")}


def snapshot(path: str | os.PathLike[str]) -> Snapshot:
    """Read every stored fact of the queue file ``path`` in ONE read transaction.

    Reads through ``Store.read``: a snapshot writes nothing, leaves the
    file's folder as it found it (no ``-wal`` or ``-shm`` made, none left),
    never recovers a lease and never takes the write lock, except for
    SQLite's own rollback of a hot journal (``sqlite.roll_back_hot_journal``).
    ``path`` may be a ``postgresql://`` connection string: then the read is
    one ``REPEATABLE READ READ ONLY`` transaction, one snapshot of the whole
    database.

    Refuses what every command refuses, with the same codes and nothing
    written (``store.prepare(create=False)``): ``no_queue_file``,
    ``not_a_queue``, ``not_a_database``, and ``schema_too_new`` for a queue
    a later version of this package made (this one cannot judge it), also
    when its version changed between that check and the read.
    """
    store = open_store(path)
    store.prepare(create=False)

    def read(conn: Any) -> Snapshot:
        version = read_version(conn)
        if version > store.schema_version:
            raise too_new(store.describe(), version, store.schema_version)
        integrity, foreign_keys = store.self_checks(conn)
        return Snapshot(
            status=read_status(conn),
            messages={m.event_id: m for m in read_messages(conn)},
            effect_rows=tuple(read_effects(conn)),
            journal=tuple(read_journal(conn)),
            integrity=integrity, foreign_keys=foreign_keys, version=version,
            digests=read_digests(conn) if version >= 2 else {},
            compacted=read_compacted(conn) if version >= 2 else {})
    return store.read(read)


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
