"""Retention: ``prune`` drops what old ``done`` messages no longer need, and
keeps what deduplication needs forever.

The seed's warning: done rows are kept for deduplication, so deleting
history arbitrarily breaks it. A queue that forgets an event's key accepts
its late duplicate as new, and counts its money again (the brokers that keep
a dedupe window of minutes do exactly that; see notebook 13). So prune
never forgets a key. For each ``done`` message that finished at least
``older_than`` seconds ago it drops:

- the payload text: its SHA-256 stays, and a replay is judged by it (the
  same canonical payload is a duplicate, another one a ``batch_conflict``);
- the message's journal rows: they are replaced by ONE compacted record of
  what they proved (enqueued once, claimed ``claims`` times, generation by
  generation, redriven ``redrives`` times, completed once by the newest
  lease), which the audit holds the message and its effect against.

It keeps, forever: the key, the digest, the state ``done`` with its
generation and finish time, and the effect (the business record: money never
changes by pruning). It never touches ``ready``, ``leased`` or ``dead``
messages (a dead message's payload is what redrive needs), nor a message
whose journal the audit would not accept (it is kept whole, and counted).

Pruning runs in short transactions of at most ``batch_size`` messages each,
beside running workers: each batch holds the write lock for a few
milliseconds. A prune killed at any moment leaves a consistent queue: each
batch commits whole or not at all, and the next prune goes on. A journal
sequence number is never reused: the message that owns the journal's last
row is left for a later prune (SQLite numbers a new row after the largest
one present). On a SQLite file made with incremental auto-vacuum (every
file this version creates) the pages freed are then given back to the file
system; on an older file they are reused by the file as it grows.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable

from . import audit
from .crashpoints import crash_point
from .values import Message, State, Transition

if TYPE_CHECKING:
    from .queue import Queue

__all__ = ["PRUNE_BATCH", "Pruned", "prune"]

PRUNE_BATCH = 100           # messages per prune transaction
VACUUM_PAGES = 64           # pages given back per incremental-vacuum transaction

# The done messages old enough to prune, oldest first, from the ``done`` range of
# ``messages_live`` (a pruned message leaves it). Parameters: cutoff, cutoff, limit.
_CANDIDATES = ("SELECT event_id FROM messages WHERE state = 'done' AND payload IS NOT NULL "
               "AND available_at <= ? AND finished_at <= ? ORDER BY available_at, event_id "
               "LIMIT ?")
# The journal, oldest first, a page at a time: the walk stops as soon as it has
# what it came for, and never holds the whole journal. Parameters: after, limit.
_JOURNAL = ("SELECT seq, at, event_id, from_state, to_state, generation, attempts, reason "
            "FROM transitions WHERE seq > ? ORDER BY seq LIMIT ?")
_CHUNK = 500


@dataclass(frozen=True, slots=True)
class Pruned:
    """What ``prune`` did, and what it kept.

    Messages pruned, the journal rows their records replaced, the messages
    kept whole because the audit would not accept their journal, the
    transactions it took, and the bytes the file gave back (SQLite).
    """

    older_than: int
    at: int
    messages: int
    journal_rows: int
    kept: tuple[str, ...]
    batches: int
    bytes_freed: int
    longest_batch_seconds: float  # the longest write-lock hold of one batch (wall clock)

    def lines(self) -> list[str]:
        """What ``queue-core prune`` prints (no wall-clock figures)."""
        said = [f"pruned {self.messages} done message{'s' if self.messages != 1 else ''} "
                f"finished at least {self.older_than} s before t={self.at}: their payloads "
                f"and {self.journal_rows} journal rows dropped, in {self.batches} "
                f"transaction{'s' if self.batches != 1 else ''}; keys, digests, effects "
                "and one compacted record each kept"]
        if self.kept:
            said.append(f"kept whole {len(self.kept)} whose journal the audit does not "
                        f"accept ({', '.join(self.kept[:5])}): run the audit")
        said.append(f"{self.bytes_freed} bytes given back to the file system")
        return said


def prune(queue: "Queue", older_than: int, *, batch_size: int = PRUNE_BATCH) -> Pruned:
    """Prune ``queue``'s done messages that finished at least ``older_than`` seconds
    before its clock's now (see the module). Refuses a queue of an earlier
    schema version (``schema_too_old``), like every write."""
    if isinstance(older_than, bool) or not isinstance(older_than, int) or older_than < 0:
        raise ValueError(f"older_than must be a whole number of seconds, 0 or more, "
                         f"got {older_than!r}")
    now = queue.clock.now()
    cutoff = now - older_than
    size_before = _file_bytes(queue)
    pruned = rows = batches = 0
    kept: list[str] = []
    longest = 0.0
    while True:
        started = time.perf_counter()
        with queue.transaction() as conn:
            crash_point("prune.after_begin")
            queue.store.serialize_enqueue(conn)  # PostgreSQL: one prune or enqueue at a time
            done, refused, dropped = _one_batch(conn, cutoff, batch_size, kept)
            crash_point("prune.before_commit")
        crash_point("prune.after_commit")
        longest = max(longest, time.perf_counter() - started)
        if done or dropped:
            batches += 1
        pruned, rows = pruned + done, rows + dropped
        kept += refused
        if done + len(refused) < batch_size:
            break
    _give_back(queue)
    return Pruned(older_than, now, pruned, rows, tuple(kept), batches,
                  max(0, size_before - _file_bytes(queue)), longest)


def _one_batch(conn: Any, cutoff: int, limit: int,
               skip: list[str]) -> tuple[int, list[str], int]:
    """Prune one batch inside the caller's transaction: (pruned, kept whole, journal rows)."""
    last = conn.execute("SELECT event_id FROM transitions "
                        "ORDER BY seq DESC LIMIT 1").fetchone()
    ids = [row[0] for row in conn.execute(_CANDIDATES, (cutoff, cutoff, limit + len(skip) + 1))]
    ids = [event_id for event_id in ids
           if event_id not in skip and (last is None or event_id != last[0])][:limit]
    if not ids:
        return 0, [], 0
    messages = {m.event_id: m for m in _messages(conn, ids)}
    effects = {row[0]: row[1:] for row in _rows(
        conn, "SELECT event_id, category, amount_cents FROM effects WHERE event_id IN ({})", ids)}
    steps = _journal_of(conn, set(ids))
    records, refused, seqs = [], [], []
    for event_id in ids:
        message, history = messages[event_id], steps.get(event_id, [])
        effect = effects.get(event_id)
        if effect is None or any(audit.history_findings(message, history)) or any(
                audit._effect_matches(audit.EffectRow(event_id, *effect), message)):
            refused.append(event_id)
            continue
        records.append((event_id, history[0].at, message.generation,
                        sum(step.from_state == State.DEAD for step in history),
                        len(history), *effect))
        seqs += [step.seq for step in history]
    compacted = [record[0] for record in records]
    conn.executemany("INSERT INTO compacted (event_id, enqueued_at, claims, redrives, steps, "
                     "category, amount_cents) VALUES (?, ?, ?, ?, ?, ?, ?)", records)
    conn.executemany("UPDATE messages SET payload = NULL WHERE event_id = ? AND state = 'done' "
                     "AND payload IS NOT NULL", [(event_id,) for event_id in compacted])
    crash_point("prune.after_compact")
    for start in range(0, len(seqs), _CHUNK):
        chunk = seqs[start:start + _CHUNK]
        conn.execute(f"DELETE FROM transitions WHERE seq IN ({', '.join('?' * len(chunk))})",
                     chunk)
    return len(compacted), refused, len(seqs)


def _messages(conn: Any, ids: list[str]) -> Iterable[Message]:
    return (Message.from_row(row) for row in _rows(
        conn, f"SELECT {audit._MESSAGE_COLUMNS} FROM messages WHERE event_id IN ({{}})", ids))


def _rows(conn: Any, template: str, ids: list[str]) -> list[tuple[Any, ...]]:
    found: list[tuple[Any, ...]] = []
    for start in range(0, len(ids), _CHUNK):
        chunk = ids[start:start + _CHUNK]
        found += conn.execute(template.format(", ".join("?" * len(chunk))), chunk).fetchall()
    return found


def _journal_of(conn: Any, ids: set[str]) -> dict[str, list[Transition]]:
    """The journal rows of ``ids``, from one walk of the journal from its oldest row,
    which stops once each has its ``done`` row (its last: done is final). The
    oldest done messages are pruned first, so their rows are near the head."""
    steps: dict[str, list[Transition]] = {}
    waiting, after = set(ids), 0
    while waiting:
        rows = conn.execute(_JOURNAL, (after, _CHUNK)).fetchall()
        if not rows:
            break  # a history without its done row: the audit's findings keep it whole
        for seq, at, event_id, src, dst, gen, att, why in rows:
            if event_id in ids:
                steps.setdefault(event_id, []).append(Transition(
                    seq, at, event_id, State(src) if src else None, State(dst), gen, att, why))
                if dst == State.DONE:
                    waiting.discard(event_id)
        after = rows[-1][0]
    return steps


def _file_bytes(queue: "Queue") -> int:
    """The SQLite file's size in pages (what a checkpoint leaves on disk); 0 on PostgreSQL."""
    if queue.store.name != "sqlite":
        return 0
    return int(queue._read(lambda conn: conn.execute("PRAGMA page_count").fetchone()[0]
                           * conn.execute("PRAGMA page_size").fetchone()[0]))


def _give_back(queue: "Queue") -> None:
    """Give the freed pages back to the file system, a few at a time (SQLite with
    incremental auto-vacuum: each ``incremental_vacuum`` is its own short write
    transaction), then copy the WAL into the file, which truncates it."""
    if queue.store.name != "sqlite":
        return  # PostgreSQL reuses the space once (auto)vacuum has run
    conn = queue.store.connect()
    try:
        if conn.execute("PRAGMA auto_vacuum").fetchone()[0] != 2:  # 2: INCREMENTAL
            return
        while conn.execute("PRAGMA freelist_count").fetchone()[0]:
            conn.execute(f"PRAGMA incremental_vacuum({VACUUM_PAGES})").fetchall()
        conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
    finally:
        conn.close()
