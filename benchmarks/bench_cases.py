"""The measured cases of ``bench.py`` and its exactly-once check.

Our worker processes are ``bench_worker.py``'s; the peers' are ``peers.py``'s.
"""

from __future__ import annotations

import json
import sqlite3
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout: the package sits next to us
    sys.path.insert(0, str(ROOT))

from bench_worker import Worker  # noqa: E402

from queue_core import Queue  # noqa: E402
from queue_core import audit  # noqa: E402
from queue_core.lab.servers.pgcases import Schemas  # noqa: E402
from queue_core.sqlite import connect, is_connection_string, transaction  # noqa: E402
from queue_core.ingest import payload_digest  # noqa: E402

CATEGORIES = ("book", "pen", "bag")
IDS_PER_FILE = 10_000  # E0000..E9999: the event id shape allows no more


def amount_of(i: int) -> int:
    """The payload amount of the i-th generated event (known, so money can be checked)."""
    return 100 + i % 900


def payload_of(i: int) -> str:
    return json.dumps({"amount_cents": amount_of(i), "category": CATEGORIES[i % 3]})


# -- checks -------------------------------------------------------------------

class CheckFailed(Exception):
    """The database does not show exactly one effect per done event."""


class Keeper:
    """A connection held open on a queue file for the whole run, and used to check it.

    When the last connection to a WAL database closes, SQLite checkpoints
    and deletes the ``-wal`` file, and the next writer grows a new one, which
    costs the file system extra work on every commit. The raw-commit
    connection stays open all run; so, for a fair comparison, does this one,
    as a long-running service's connections would.
    """

    def __init__(self, db: Path | str) -> None:
        self.db = db
        # A PostgreSQL server keeps no per-file state between connections: nothing to hold.
        self.conn = (None if is_connection_string(db)
                     else sqlite3.connect(db, isolation_level=None))
        if self.conn is not None:  # a connection counts once it has read: before, it has no WAL
            self.conn.execute("SELECT count(*) FROM sqlite_master").fetchone()

    def check_exactly_once(self, done: int, money: int, ready: int = 0,
                           priorities: dict[int, int] | None = None) -> None:
        """Raise ``CheckFailed`` unless the shared audit finds nothing and the
        states, effects and money are exactly what the slices produced; with
        ``priorities``, also the done messages of each priority."""
        snap = audit.snapshot(self.db)
        problems = [str(finding) for finding in audit.check(snap)[:3]]
        states = snap.status.states
        found = (states["done"], states["ready"], states["leased"] + states["dead"],
                 snap.status.effects, snap.money)
        wanted = (done, ready, 0, done, money)
        if priorities is not None:
            found += ({p: counts["done"] for p, counts in snap.status.priorities.items()},)
            wanted += (priorities,)
        if problems or found != wanted:
            raise CheckFailed(f"{self.db}: (done, ready, leased or dead, effects, money"
                              f"{', done per priority' if priorities is not None else ''}) = "
                              f"{found}, expected {wanted}; audit: {problems or 'clean'}")

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()


# -- cases --------------------------------------------------------------------

@dataclass(frozen=True)
class Slice:
    """One measured slice: messages, seconds to claim and complete them, and
    seconds including their enqueue (equal when nothing is enqueued)."""

    messages: int
    consume_s: float
    total_s: float
    flushes: int | None = None  # fsync + fdatasync calls of the consumer, where the shim counts


@dataclass
class Case:
    """One measured configuration and its slices.

    ``relative`` holds each slice's consume rate divided by the raw commit
    rate measured just before and just after it, which cancels most of the
    drift of the disk between slices of different cases; ``relative_total``
    the same for the rate including the enqueue (end to end).
    """

    name: str
    label: str
    baseline: str = field(default="raw", kw_only=True)  # the raw commits it is divided by
    slices: list[Slice] = field(default_factory=list)
    relative: list[float] = field(default_factory=list)
    relative_total: list[float] = field(default_factory=list)
    # Each slice's consume rate over the mean of the base case's slices just before
    # and just after it (``bench.interleave``'s pairs): for the cases compared with
    # one worker on the same work, where no other case's rate stands in between.
    paired: list[float] = field(default_factory=list)

    def slice(self) -> Slice:
        raise NotImplementedError

    def rate(self) -> float:
        return statistics.median(s.messages / s.consume_s for s in self.slices)

    def end_to_end(self) -> float:
        return statistics.median(s.messages / s.total_s for s in self.slices)

    def vs_raw(self) -> float:
        return statistics.median(self.relative)

    def end_to_end_vs_raw(self) -> float:
        return statistics.median(self.relative_total)

    def close(self) -> None:
        """Release what the case holds open."""


class RawCommits(Case):
    """The limit: one single-row INSERT per ``BEGIN IMMEDIATE ... COMMIT``."""

    def __init__(self, workdir: Path, n: int) -> None:
        super().__init__("raw", "raw single-row commit (the limit)")
        self.conn = connect(workdir / "raw.sqlite3")  # the pragmas the queue uses
        self.conn.execute("PRAGMA journal_mode = WAL")
        self.conn.execute("CREATE TABLE raw (id INTEGER PRIMARY KEY, payload TEXT NOT NULL) STRICT")
        self.n = n

    def slice(self) -> Slice:
        conn, text = self.conn, payload_of(0)
        start = time.perf_counter()
        for _ in range(self.n):
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO raw (payload) VALUES (?)", (text,))
            conn.execute("COMMIT")
        elapsed = time.perf_counter() - start
        return Slice(self.n, elapsed, elapsed)

    def close(self) -> None:
        self.conn.close()


class PgRawCommits(Case):
    """PostgreSQL's limit: one single-row INSERT per ``BEGIN ... COMMIT``, the
    commit waiting for the server's WAL flush (``synchronous_commit = on``)."""

    def __init__(self, dsn: str, n: int) -> None:
        import psycopg

        super().__init__("pg_raw", "pg raw single-row commit (its limit)",
                         baseline="pg_raw")
        self.conn = psycopg.connect(dsn, autocommit=True)
        self.conn.execute("SET synchronous_commit = on")
        self.conn.execute("CREATE TABLE raw (id bigint GENERATED ALWAYS AS IDENTITY "
                          "PRIMARY KEY, payload text NOT NULL)")
        self.n = n

    def slice(self) -> Slice:
        conn, text = self.conn, payload_of(0)
        start = time.perf_counter()
        for _ in range(self.n):
            conn.execute("BEGIN")
            conn.execute("INSERT INTO raw (payload) VALUES (%s)", (text,))
            conn.execute("COMMIT")
        elapsed = time.perf_counter() - start
        return Slice(self.n, elapsed, elapsed)

    def close(self) -> None:
        self.conn.close()


class BareProtocol(Case):
    """For scale, not a target: two commits per message and nothing else.

    The claim is one transaction (one UPDATE ... RETURNING that takes the
    oldest due row through a partial index), committed without an fsync of
    its own as the queue's claims are; the ACK is another, fsynced (the effect
    INSERT and an UPDATE guarded by generation and deadline). No journal, no
    CHECK constraints, no foreign keys, no fence read before the handler,
    no handler object, no crash points; it runs in this process, like the
    raw commits. Between the raw limit and this case lies what two durable
    commits of a few pages cost on this disk; between this case and
    single-message mode, what the engine's checks and journal cost.
    """

    SCHEMA = """
        CREATE TABLE messages (event_id TEXT PRIMARY KEY, payload TEXT NOT NULL,
                               state TEXT NOT NULL, generation INTEGER NOT NULL,
                               available_at INTEGER NOT NULL, lease_until INTEGER);
        CREATE INDEX messages_ready ON messages (available_at, event_id) WHERE state = 'ready';
        CREATE TABLE effects (event_id TEXT PRIMARY KEY, category TEXT NOT NULL,
                              amount_cents INTEGER NOT NULL) WITHOUT ROWID;
    """

    def __init__(self, workdir: Path, n: int) -> None:
        super().__init__("bare", "bare two-commit protocol (reference)")
        self.conn = connect(workdir / "bare.sqlite3")  # the pragmas the queue uses
        self.conn.execute("PRAGMA journal_mode = WAL")
        self.conn.executescript(self.SCHEMA)
        self.n, self.next_id, self.money = n, 0, 0

    def slice(self) -> Slice:
        conn, ids = self.conn, range(self.next_id, self.next_id + self.n)
        conn.execute("BEGIN IMMEDIATE")  # the fill is not measured
        conn.executemany("INSERT INTO messages VALUES (?, ?, 'ready', 0, 0, NULL)",
                         ((f"E{i:06d}", payload_of(i)) for i in ids))
        conn.execute("COMMIT")
        start = time.perf_counter()
        for _ in range(self.n):
            with transaction(conn, relaxed=True):  # the claim: no fsync of its own, as ours
                event_id, generation, payload = conn.execute(
                    "UPDATE messages SET state = 'leased', generation = generation + 1, "
                    "lease_until = ? WHERE event_id = (SELECT event_id FROM messages "
                    "WHERE state = 'ready' AND available_at <= ? ORDER BY available_at, "
                    "event_id LIMIT 1) RETURNING event_id, generation, payload", (31, 1)).fetchone()
            order = json.loads(payload)
            with transaction(conn):  # the ACK, fsynced
                conn.execute("INSERT INTO effects VALUES (?, ?, ?)",
                             (event_id, order["category"], order["amount_cents"]))
                if conn.execute("UPDATE messages SET state = 'done', lease_until = NULL "
                                "WHERE event_id = ? AND state = 'leased' AND generation = ? "
                                "AND lease_until > 1", (event_id, generation)).rowcount != 1:
                    raise CheckFailed(f"bare: {event_id} lost its lease")
        elapsed = time.perf_counter() - start
        self.next_id += self.n
        self.money += sum(amount_of(i) for i in ids)
        found = conn.execute("SELECT (SELECT count(*) FROM messages WHERE state = 'done'), "
                             "(SELECT count(*) FROM messages), (SELECT count(*) FROM effects), "
                             "(SELECT coalesce(sum(amount_cents), 0) FROM effects)").fetchone()
        if found != (self.next_id, self.next_id, self.next_id, self.money):
            raise CheckFailed(f"bare: (done, messages, effects, money) = {found}, expected "
                              f"{(self.next_id, self.next_id, self.next_id, self.money)}")
        return Slice(self.n, elapsed, elapsed)

    def close(self) -> None:
        self.conn.close()


class EndToEnd(Case):
    """Enqueue a slice, then worker processes claim and complete it all.

    ``consume_s`` is the workers' claim + ACK (the consumer side);
    ``total_s`` adds the enqueue (end to end). The producer either enqueues
    each event in its own commit (``producer="single"``, as a peer's put
    does) or the slice as JSONL batches of up to 1,000 events per commit.
    """

    def __init__(self, name: str, label: str, workdir: Path, n: int, *, op: str,
                 workers: list[Worker], k: int = 1, sync: str = "FULL",
                 schemas: Schemas | None = None, producer: str = "batch") -> None:
        """``schemas``: each queue in a fresh PostgreSQL schema instead of a new file."""
        super().__init__(name, label, baseline="raw" if schemas is None else "pg_raw")
        self.workdir, self.n, self.op, self.k, self.sync = workdir, n, op, k, sync
        self.producer = producer
        self.schemas = schemas
        self.workers = workers
        self.files = 0
        self.keeper: Keeper | None = None
        self._new_file()

    def _new_file(self) -> None:
        self.files += 1
        self.db: Path | str = (self.workdir / f"{self.name}-{self.files}.sqlite3"
                               if self.schemas is None else self.schemas.fresh(self.name))
        self.queue = Queue(self.db, synchronous=self.sync)
        self.close()
        self.keeper = Keeper(self.db)
        self.next_id, self.money = 0, 0
        for worker in self.workers:
            worker.send(op="open", db=str(self.db), sync=self.sync)
            worker.reply()

    def slice(self) -> Slice:
        if self.next_id + self.n > IDS_PER_FILE:
            self._new_file()
        ids = range(self.next_id, self.next_id + self.n)
        per_commit = 1 if self.producer == "single" else 1000
        texts = ["\n".join(json.dumps({"event_id": f"E{i:04d}", "payload": json.loads(
            payload_of(i))}) for i in ids[start:start + per_commit])
            for start in range(0, self.n, per_commit)]
        start = time.perf_counter()
        with self.queue.session():
            for text in texts:
                self.queue.enqueue_jsonl(text)
        enqueued = time.perf_counter()
        for worker in self.workers:
            worker.send(op=self.op, db=str(self.db), sync=self.sync, k=self.k)
        answers = [worker.reply() for worker in self.workers]
        end = time.perf_counter()
        self.after_consume()
        replies = [answer["kinds"] for answer in answers]
        flushes = [answer["flushes"] for answer in answers]
        self.next_id += self.n
        self.money += sum(amount_of(i) for i in ids)
        done = sum(reply.get("done", 0) for reply in replies)
        if done != self.n or any(set(reply) - {"done"} for reply in replies):
            raise CheckFailed(f"{self.name}: workers reported {replies} for {self.n} messages")
        assert self.keeper is not None
        self.keeper.check_exactly_once(self.next_id, self.money)
        return Slice(self.n, end - enqueued, end - start,
                     None if None in flushes else sum(flushes))

    def after_consume(self) -> None:
        """Called the moment the workers answered, before the checks (a case with a
        process beside the workers looks at the file here)."""

    def close(self) -> None:
        if self.keeper is not None:
            self.keeper.close()


class QueueSize(Case):
    """Consume a fixed slice, one message per claim and ACK, from a queue kept at ``size``.

    ``size`` may exceed the 10,000 ids of a course queue, so the queue is a
    ``general`` one (``ids``), whose ids here are ``E`` and six digits; the
    fill (not measured) writes what ``enqueue`` writes (the row and its
    journal entry), every constraint checked. Claim and complete run as in
    every other case.
    """

    def __init__(self, workdir: Path, size: int, n: int, worker: Worker) -> None:
        super().__init__(f"size_{size}", f"ours, single message, {size:,} queued")
        self.db, self.size, self.n = workdir / f"size-{size}.sqlite3", size, n
        Queue(self.db, ids="general")
        self.keeper = Keeper(self.db)
        self.next_id = self.consumed = self.money = 0
        self._fill(size)
        self.worker = worker
        self.worker.send(op="open", db=str(self.db), sync="FULL")
        self.worker.reply()

    def _fill(self, count: int) -> None:
        ids = range(self.next_id, self.next_id + count)
        conn = connect(self.db)
        try:
            conn.execute("BEGIN IMMEDIATE")
            due = int(time.time()) - 1
            conn.executemany("INSERT INTO messages (event_id, payload, payload_sha256, "
                             "available_at) VALUES (?, ?, ?, ?)",
                             ((f"E{i:06d}", payload_of(i), payload_digest(payload_of(i)), due)
                              for i in ids))
            conn.executemany("INSERT INTO transitions (at, event_id, from_state, to_state, "
                             "generation, attempts, reason) VALUES (?, ?, NULL, 'ready', 0, 0, "
                             "'enqueued')", ((due, f"E{i:06d}") for i in ids))
            conn.execute("COMMIT")
        finally:
            conn.close()
        self.next_id += count

    def slice(self) -> Slice:
        if self.consumed:
            self._fill(self.n)  # back to ``size`` queued before each measured slice
        start = time.perf_counter()
        answer = self.worker.call(op="take", db=str(self.db), sync="FULL", n=self.n)
        kinds = answer["kinds"]
        elapsed = time.perf_counter() - start
        # FIFO by (available_at, event_id): the slice took the oldest ids
        first = self.consumed
        self.consumed += self.n
        self.money += sum(amount_of(i) for i in range(first, self.consumed))
        if kinds != {"done": self.n}:
            raise CheckFailed(f"{self.name}: worker reported {kinds} for {self.n} messages")
        self.keeper.check_exactly_once(self.consumed, self.money, ready=self.size - self.n)
        return Slice(self.n, elapsed, elapsed, answer["flushes"])

    def peak_rss_after_draining(self) -> tuple[int, float]:
        """Drain everything queued (K=100) in a new worker process; return the
        messages this queue has had and the peak RSS of that process."""
        self.worker = Worker()
        self.worker.send(op="open", db=str(self.db), sync="FULL")
        self.worker.reply()
        left = self.next_id - self.consumed
        self.worker.send(op="drain", db=str(self.db), sync="FULL", k=100)
        kinds = self.worker.reply()["kinds"]
        self.money += sum(amount_of(i) for i in range(self.consumed, self.next_id))
        self.consumed = self.next_id
        if kinds != {"done": left}:
            raise CheckFailed(f"{self.name}: drain reported {kinds} for {left} messages")
        self.keeper.check_exactly_once(self.consumed, self.money)
        self.worker.send(op="rss")
        rss = float(self.worker.reply()["rss_mb"])
        self.worker.close()
        return self.consumed, rss

    def close(self) -> None:
        self.keeper.close()
