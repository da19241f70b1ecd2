"""Deliberately BROKEN protocols, kept only as teaching contrasts.

Never use these to process real events. Each one removes one safeguard of
``Queue.complete`` so that the crash sweep (``queue_core.lab.sweeps.sweep``) can show
what that safeguard buys. Each is a ``Queue`` subclass that overrides only
public hooks the engine offers for it (``complete``, ``fail``, ``fence``,
``transaction``, ``write_journal``, ``Handler.fault``):

``mark_then_write``      marks the message ``done``, commits, THEN writes the
                         effect in a second transaction: a crash between the
                         two loses the money.
``write_then_mark``      writes the effect, commits, THEN marks ``done`` in a
                         second transaction: a crash between the two leaves
                         the message leased, its lease expires, and the next
                         worker writes the effect again: the money doubles.
``no_generation_check``  the real single transaction, but the fence checks
                         only the state and the deadline stored in the row,
                         not the lease's generation: a worker whose lease
                         expired can finish (or fail) a message that has
                         since been handed to another worker.
``naive_cleanup``        no protocol of its own (the real one finishes every
                         message), but a shop's cleanup of old history: it
                         rolls the done events' effects into ``books``, then
                         deletes their message, effect and journal rows. A
                         replay of a deleted event is new to the queue, and
                         its money is counted again (notebook 13).
``rerun_after_lost_connection`` (the network sweep's, ``NETWORK_PROTOCOLS``)
                         adds to a counter in a transaction of its own,
                         then ACKs; when the connection is lost it runs the
                         whole message again on a new connection, as if
                         nothing had happened: a COMMIT that took effect
                         without its answer coming back is counted twice.

All of them run on both stores, a SQLite file or a PostgreSQL schema
(``create_ledger`` speaks each one's SQL), so the crash sweep can show the
same failures on either.

The two split-transaction protocols write their effects to ``naive_ledger``,
a table with no unique key on ``event_id``, as an ordinary counter or ledger
has (the audit reads it too: ``queue_core.audit.CONTRAST_LEDGER``). The real ``effects`` table's primary key is a second line of defence,
not a replacement for the protocol: leaving it out shows what the protocol
alone guarantees. Each protocol is a ``Queue`` subclass that overrides only
what it breaks, so the real worker (``worker.drain``, ``worker.finish``) and
the real claim drive all of them; each passes through the same named crash
points as far as they apply (``points``). They ACK one lease at a time.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Sequence

from ...audit import CONTRAST_LEDGER
from ...crashpoints import (BETWEEN_TRANSACTIONS, INSIDE_THE_SERVER_STEP, POINTS,
                            PROTOCOL_POINTS, crash_point)
from ...errors import ConnectionLost, IntegrityViolation, LeaseLost, QueueError
from ...handler import Handler
from ...queue import Queue, backoff_seconds, write_journal
from ...sqlite import has_table
from ...values import Effect, Lease, Outcome, State

LEDGER_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS {CONTRAST_LEDGER} (
    seq          INTEGER PRIMARY KEY,
    event_id     TEXT NOT NULL,
    category     TEXT NOT NULL,
    amount_cents INTEGER NOT NULL
) STRICT
"""
# The same table in PostgreSQL's words: ``seq`` numbers the rows as SQLite's rowid does.
PG_LEDGER_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS {CONTRAST_LEDGER} (
    seq          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id     text NOT NULL,
    category     text NOT NULL,
    amount_cents bigint NOT NULL
)
"""

CLAIM_POINTS = tuple(p for p in PROTOCOL_POINTS if p.startswith("claim."))
FAIL_POINTS = tuple(p for p in PROTOCOL_POINTS if p.startswith("fail."))


@dataclass(frozen=True)
class Protocol:
    """A way to finish leases: its name, the ``Queue`` class that implements it,
    the crash points it passes through, and whether it is a broken contrast."""

    name: str
    queue_class: type[Queue]
    points: tuple[str, ...]
    broken: bool

    def open(self, path: str | os.PathLike[str], **options: Any) -> Queue:
        """A queue on ``path`` that finishes leases this protocol's way."""
        return self.queue_class(path, **options)

    def points_on(self, store: str) -> tuple[str, ...]:
        """The crash points it passes through on ``store`` (``sqlite`` or
        ``postgres``): on PostgreSQL, the protocol's own worker step is one
        call of the schema's function, and has no points inside it."""
        if store == "postgres" and self.queue_class.complete_and_claim is Queue.complete_and_claim:
            return tuple(p for p in self.points if p not in INSIDE_THE_SERVER_STEP)
        return self.points


def create_ledger(queue: Queue) -> None:
    """Create ``naive_ledger`` (no unique key) beside the queue's tables, in
    the queue's store (a SQLite file or a PostgreSQL schema)."""
    with queue.transaction() as conn:
        conn.execute(PG_LEDGER_SCHEMA if queue.store.name == "postgres" else LEDGER_SCHEMA)


class _Contrast(Queue):
    """Base of the broken protocols: the real claim, a broken ACK, one lease at a time."""

    def complete_batch(self, leases: Sequence[Lease],
                       handler: Handler) -> list[Effect | QueueError]:
        raise TypeError(f"{type(self).__name__} is a teaching contrast; it ACKs one lease "
                        "at a time (use complete)")

    def complete_and_claim(self, lease: Lease, handler: Handler) -> tuple[Effect, Lease | None]:
        """The broken ACK, then the real claim in a transaction of its own: the
        worker loop runs the contrast as it would run the protocol."""
        effect = self.complete(lease, handler)
        return effect, self.claim()


class _SplitAck(_Contrast):
    """The effect and the ACK in two transactions; effects go to ``naive_ledger``.

    ``first_half`` and ``second_half`` are the two transactions, each one
    public so that the schedule explorer can run other workers between them.
    """

    def __init__(self, path: str | os.PathLike[str], **options: Any) -> None:
        super().__init__(path, **options)
        create_ledger(self)

    def complete(self, lease: Lease, handler: Handler) -> Effect:
        effect = self.first_half(lease, handler)
        crash_point(BETWEEN_TRANSACTIONS)
        self.second_half(lease, effect)
        crash_point("complete.after_commit")
        return effect

    def first_half(self, lease: Lease, handler: Handler) -> Effect:
        raise NotImplementedError

    def second_half(self, lease: Lease, effect: Effect) -> None:
        raise NotImplementedError


# -- mark, then write (loses money) ------------------------------------------

class MarkThenWrite(_SplitAck):
    """BROKEN: the ACK commits before the effect is written."""

    def first_half(self, lease: Lease, handler: Handler) -> Effect:
        """Mark ``done`` and commit; the effect is computed, not yet written."""
        with self.transaction() as conn:
            crash_point("complete.after_begin")
            # validate first, as a careful naive worker would
            effect = _effect(conn, self, lease, handler)
            _mark_done(conn, self, lease)
            crash_point("complete.before_commit")
        return effect

    def second_half(self, lease: Lease, effect: Effect) -> None:
        """Write the effect, in a transaction of its own."""
        with self.transaction() as conn:
            _write_ledger(conn, lease.event_id, effect)
            crash_point("complete.after_insert")


# -- write, then mark (doubles money) ----------------------------------------

class WriteThenMark(_SplitAck):
    """BROKEN: the effect commits before the ACK, in a separate transaction."""

    def first_half(self, lease: Lease, handler: Handler) -> Effect:
        """Write the effect and commit; the message stays leased."""
        with self.transaction() as conn:
            crash_point("complete.after_begin")
            effect = _effect(conn, self, lease, handler)
            _write_ledger(conn, lease.event_id, effect)
            crash_point("complete.after_insert")
        return effect

    def second_half(self, lease: Lease, effect: Effect) -> None:
        """Mark ``done`` if the lease still holds, in a transaction of its own."""
        with self.transaction() as conn:
            self.fence(conn, lease)
            _mark_done(conn, self, lease)
            crash_point("complete.before_commit")


def _effect(conn: Any, queue: Queue, lease: Lease, handler: Handler) -> Effect:
    payload = queue.fence(conn, lease)
    handler.fault(conn, lease.event_id)
    return handler.effect_of(json.loads(payload))


def _write_ledger(conn: Any, event_id: str, effect: Effect) -> None:
    conn.execute(f"INSERT INTO {CONTRAST_LEDGER} (event_id, category, amount_cents) VALUES (?, ?, ?)",
                 (event_id, effect.category, effect.amount_cents))


def _mark_done(conn: Any, queue: Queue, lease: Lease) -> None:
    conn.execute("UPDATE messages SET state = 'done', lease_until = NULL, finished_at = ? "
                 "WHERE event_id = ? AND state = 'leased' AND generation = ?",
                 (queue.clock.now(), lease.event_id, lease.generation))
    write_journal(conn, [(queue.clock.now(), lease.event_id, State.LEASED, State.DONE,
                     lease.generation, lease.attempt, "completed")])


# -- the real transaction without the generation check ------------------------

def _unfenced(conn: Any, queue: Queue, lease: Lease) -> str:
    """BROKEN fence: state and stored deadline only; the generation is ignored."""
    state, lease_until, payload = conn.execute(
        "SELECT state, lease_until, payload FROM messages WHERE event_id = ?",
        (lease.event_id,)).fetchone()
    if state != State.LEASED:
        raise LeaseLost("not_leased", f"{lease.event_id} is {state}", event_id=lease.event_id)
    if lease_until <= queue.clock.now():  # the deadline of whoever holds it NOW
        raise LeaseLost("lease_expired", f"{lease.event_id} expired", event_id=lease.event_id)
    return str(payload)


class NoGenerationCheck(_Contrast):
    """BROKEN: one transaction, but any worker that once held the lease may
    ACK, and a stale worker's failure report overrides the current holder."""

    def complete(self, lease: Lease, handler: Handler) -> Effect:
        with self.transaction() as conn:
            crash_point("complete.after_begin")
            payload = _unfenced(conn, self, lease)
            try:
                effect = handler.apply(conn, lease.event_id, json.loads(payload))
            except self.store.integrity_errors as exc:
                raise IntegrityViolation(f"{lease.event_id}: {exc}") from exc
            crash_point("complete.after_insert")
            _unfenced(conn, self, lease)
            crash_point("complete.after_recheck")
            conn.execute("UPDATE messages SET state = 'done', lease_until = NULL, "
                         "finished_at = ? WHERE event_id = ? AND state = 'leased'",
                         (self.clock.now(), lease.event_id))
            write_journal(conn, [(self.clock.now(), lease.event_id, State.LEASED, State.DONE,
                             lease.generation, lease.attempt, "completed")])
            crash_point("complete.before_commit")
        crash_point("complete.after_commit")
        return effect

    def fail(self, lease: Lease, code: str = "transient_error", *,
             permanent: bool = False) -> Outcome:
        with self.transaction() as conn:
            crash_point("fail.after_begin")
            _unfenced(conn, self, lease)
            now = self.clock.now()
            dead = permanent or lease.attempt >= self.max_attempts
            to, at = ("dead", now) if dead else ("ready", now + backoff_seconds(lease.attempt))
            conn.execute("UPDATE messages SET state = ?, lease_until = NULL, available_at = ?, "
                         "last_error = ? WHERE event_id = ? AND state = 'leased'",
                         (to, at, code, lease.event_id))
            reason = code if permanent or not dead else "attempts_exhausted"
            write_journal(conn, [(now, lease.event_id, State.LEASED, State(to), lease.generation,
                             lease.attempt, reason)])
            crash_point("fail.before_commit")
        crash_point("fail.after_commit")
        if dead:
            return Outcome(lease.event_id, "dead", lease.generation, code)
        return Outcome(lease.event_id, "retry", lease.generation, code, available_at=at)


# -- the effect outside the ACK, the whole message run again after a lost connection --

class RerunAfterLostConnection(_Contrast):
    """BROKEN: the effect is added to a counter (``naive_ledger``) in a
    transaction of its own, then the message is ACKed; a lost connection is
    taken to mean that nothing happened, and the whole message runs again."""

    def __init__(self, path: str | os.PathLike[str], **options: Any) -> None:
        super().__init__(path, **options)
        create_ledger(self)

    def complete(self, lease: Lease, handler: Handler) -> Effect:
        try:
            return self._whole_message(lease, handler)
        except ConnectionLost:
            self._reconnect()
        try:
            return self._whole_message(lease, handler)
        except LeaseLost:  # the first ACK did take effect after all; the counter ran twice
            return handler.effect_of(json.loads(self._payload(lease)))

    def _whole_message(self, lease: Lease, handler: Handler) -> Effect:
        with self.transaction() as conn:
            handler.fault(conn, lease.event_id)
            effect = handler.effect_of(json.loads(self._payload(lease, conn)))
            _write_ledger(conn, lease.event_id, effect)  # counted, and committed alone
            crash_point("complete.after_insert")
        with self.transaction() as conn:
            self.fence(conn, lease)
            _mark_done(conn, self, lease)
            crash_point("complete.before_commit")
        crash_point("complete.after_commit")
        return effect

    def _payload(self, lease: Lease, conn: Any = None) -> str:
        """The stored payload, read as a counter reads it: no fence."""
        if conn is None:
            with self.transaction() as own:
                return self._payload(lease, own)
        return str(conn.execute("SELECT payload FROM messages WHERE event_id = ?",
                                (lease.event_id,)).fetchone()[0])

    def _reconnect(self) -> None:
        """A new session connection in place of the one that broke."""
        if self._session is not None:
            self._session.close()
            self._session = self.store.connect(synchronous=self.synchronous)


REAL = Protocol("protocol", Queue, PROTOCOL_POINTS, broken=False)
# The contrasts ACK with their own ``complete``: the worker loop's fused step
# (``complete_and_claim.*``) is the protocol's alone.
_CONTRAST_POINTS = tuple(p for p in POINTS if not p.startswith("complete_and_claim."))
_SPLIT_POINTS = tuple(p for p in _CONTRAST_POINTS if p != "complete.after_recheck")
PROTOCOLS = {p.name: p for p in (
    REAL,
    Protocol("mark then write", MarkThenWrite, _SPLIT_POINTS, broken=True),
    Protocol("write then mark", WriteThenMark, _SPLIT_POINTS, broken=True),
    Protocol("no generation check", NoGenerationCheck,
             tuple(p for p in _CONTRAST_POINTS if p != BETWEEN_TRANSACTIONS), broken=True),
)}


# The network sweep's own contrast (``queue_core.lab.sweeps.network``): its
# failure needs a connection that breaks, which no crash point makes.
NETWORK_PROTOCOLS = {p.name: p for p in (
    Protocol("rerun after lost connection", RerunAfterLostConnection, (), broken=True),
)}


def protocol(name: str) -> Protocol:
    """The protocol called ``name``; raises ``ValueError`` for an unknown one."""
    known = {**PROTOCOLS, **NETWORK_PROTOCOLS}
    try:
        return known[name]
    except KeyError:
        raise ValueError(f"unknown protocol {name!r}; known: {', '.join(known)}") from None


# -- a cleanup that forgets the keys (doubles money on a late replay) ---------------

# The shop's ledger: one running total per category, kept in the queue's own file
# beside the queue's tables. Once a cleanup has run, the money is in two places:
# ``books`` holds what was rolled up, ``effects`` what was done since.
BOOKS_SCHEMA = """
CREATE TABLE IF NOT EXISTS books (
    category     TEXT PRIMARY KEY,
    amount_cents INTEGER NOT NULL,
    events       INTEGER NOT NULL
) STRICT
"""
PG_BOOKS_SCHEMA = """
CREATE TABLE IF NOT EXISTS books (
    category     text PRIMARY KEY,
    amount_cents bigint NOT NULL,
    events       bigint NOT NULL
)
"""
_ROLL_UP = ("INSERT INTO books (category, amount_cents, events) "
            "SELECT e.category, SUM(e.amount_cents), COUNT(*) FROM effects e "
            "JOIN messages m ON m.event_id = e.event_id WHERE m.state = 'done' "
            "GROUP BY e.category ON CONFLICT (category) DO UPDATE SET "
            "amount_cents = books.amount_cents + excluded.amount_cents, "
            "events = books.events + excluded.events")
_DONE = "(SELECT event_id FROM messages WHERE state = 'done')"


@dataclass(frozen=True, slots=True)
class Cleanup:
    """What ``naive_cleanup`` deleted: done messages, their effect and journal rows
    (and compacted records), and the money it rolled into ``books``."""

    messages: int
    effects: int
    journal_rows: int
    rolled_cents: int

    def __str__(self) -> str:
        return (f"naive cleanup: {self.rolled_cents} rolled into the books; deleted "
                f"{self.messages} done messages, {self.effects} effect rows, "
                f"{self.journal_rows} journal rows")


@dataclass(frozen=True, slots=True)
class Books:
    """The shop's money after a cleanup: what ``books`` rolled up, plus what ``effects``
    hold since (the queue's own total, the only one its audit sees)."""

    rolled: dict[str, int]
    since: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.rolled.values()) + sum(self.since.values())

    def by_category(self) -> dict[str, int]:
        return {category: self.rolled.get(category, 0) + self.since.get(category, 0)
                for category in sorted({*self.rolled, *self.since})}


def naive_cleanup(queue: Queue) -> Cleanup:
    """BROKEN: roll every done event's effect into ``books``, then delete the event's
    rows (journal, effect, message: the foreign keys forbid any other order).
    The money is kept; the keys are not, so a replay of a deleted event is new."""
    with queue.transaction() as conn:
        conn.execute(PG_BOOKS_SCHEMA if queue.store.name == "postgres" else BOOKS_SCHEMA)
        rolled = conn.execute("SELECT COALESCE(SUM(e.amount_cents), 0) FROM effects e JOIN "
                              "messages m ON m.event_id = e.event_id WHERE m.state = 'done'"
                              ).fetchone()[0]
        conn.execute(_ROLL_UP)
        # counted before each DELETE: PostgreSQL's pipeline mode reports no row count
        counts = [int(conn.execute(f"SELECT count(*) FROM {table} WHERE event_id IN {_DONE}"
                                   ).fetchone()[0]) for table in ("messages", "effects",
                                                                  "transitions")]
        for table in ("transitions", "compacted", "effects", "messages"):
            conn.execute(f"DELETE FROM {table} WHERE event_id IN {_DONE}")
    return Cleanup(*counts, int(rolled))


def read_books(queue: Queue) -> Books:
    """The shop's money: ``books`` (empty before a first cleanup) and ``effects``."""
    def read(conn: Any) -> Books:
        rolled: dict[str, int] = {}
        if has_table(conn, "books"):
            rolled = {c: int(a) for c, a in conn.execute(
                "SELECT category, amount_cents FROM books ORDER BY category")}
        since: dict[str, int] = {}
        for category, amount in conn.execute(
                "SELECT category, amount_cents FROM effects ORDER BY event_id"):
            since[category] = since.get(category, 0) + int(amount)
        return Books(rolled, since)
    return queue._read(read)
