"""The queue over its lifetime, for ``bench.py``: what ``prune`` keeps and gives
back, what it costs the workers beside it, and what ``migrate`` costs.

- ``steady_load``: the same load (events with 2 KB payloads, enqueued and
  processed window by window on a model clock) on three files: never pruned;
  pruned after every window, keeping the last ``LIVE_WINDOWS`` windows' done
  messages whole; and pruned the same way by connections that also set
  ``PRAGMA journal_size_limit`` (not the engine's setting: it shows what that
  pragma does to the ``-wal`` file's high-water mark). After each window the
  sizes are read with ``dbstat``: the payload text, the journal's pages, and
  everything else the file keeps (keys, digests, effects, compacted records).
  At the end each file is audited (states, effects and money exact), and on the
  pruned file a replay of a pruned event is answered as a duplicate (another
  payload: ``batch_conflict``), the money unchanged.
- ``prune_hold``: the write lock's longest hold by a prune, as another writer
  meets it: a process beside ``prune(0)`` of done messages of 2 KB takes and
  releases the lock in a loop and times each spell it could not take it.
- ``PrunedEndToEnd``: our single-message case with a process beside the
  workers that calls ``prune(0)`` every 20 ms (``bench_worker.Pruner``); it runs
  in ``bench.py``'s interleaved rounds next to the same case without it.
- ``pg_space``: a PostgreSQL schema's table and index sizes before a prune,
  after it and a ``VACUUM``, and after as much load again.
- ``migrations``: a schema-1 queue of ``MIGRATE_ENGINE``'s writing (the
  previous engine, exported from git history and run in child processes),
  migrated while a worker of that engine runs on it: the step's seconds and the
  longest step of that worker across the migration.

Every commit here is our default: ``synchronous=FULL``, each acknowledged
commit fsynced (claims commit without an fsync of their own).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import select
import sqlite3
import statistics
import subprocess
import sys
import tarfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from bench_cases import (CATEGORIES, IDS_PER_FILE, ROOT, CheckFailed, EndToEnd,
                         amount_of)
from bench_worker import PRUNE_EVERY_S, Worker

from queue_core import BatchConflict, Handler, ModelClock, Queue, audit, drain, migrate
from queue_core import retention
from queue_core import sqlite
from queue_core.sqlite import migrations as sqlite_migrations, store as sqlite_store

PAYLOAD_BYTES = 2048        # each steady-load payload's canonical JSON
WINDOW_SECONDS = 10         # model time between two windows of the steady load
LIVE_WINDOWS = 2            # done messages of the last two windows stay whole
ENQUEUE_LINES = 100         # events per enqueue commit of the steady load
LOAD_BATCH = 50             # the steady load's claim + ACK batches (one ACK commit per 50)
WAL_LIMIT = 256 * 1024      # journal_size_limit of the third file's connections
KEPT = ("messages", "sqlite_autoindex_messages_1", "effects", "compacted")
MIGRATE_ENGINE = "265c64c"  # schema 1, 1 KB pages: the release before schema 2


def payload_2k(i: int) -> dict[str, Any]:
    """The i-th steady-load payload: the bench's order, padded to 2 KB of canonical JSON."""
    base = {"amount_cents": amount_of(i), "category": CATEGORIES[i % 3], "note": ""}
    room = PAYLOAD_BYTES - len(json.dumps(base, sort_keys=True, separators=(",", ":")))
    # distinct hashes, so that neither store's compression makes the payload small
    filler = "".join(hashlib.sha256(f"{i}.{k}".encode()).hexdigest() for k in range(room // 64 + 1))
    return dict(base, note=filler[:room])


def jsonl(ids: range, payload: Callable[[int], Any], per_batch: int = 1000) -> list[str]:
    """The events ``ids`` as JSONL batches of at most ``per_batch`` lines."""
    lines = [json.dumps({"event_id": f"E{i:04d}", "payload": payload(i)}) for i in ids]
    return ["\n".join(lines[start:start + per_batch])
            for start in range(0, len(lines), per_batch)]


# -- the steady load ------------------------------------------------------------

@contextmanager
def journal_size_limit(paths: set[str], limit: int) -> Iterator[None]:
    """Every connection the engine opens to one of ``paths`` also sets
    ``PRAGMA journal_size_limit`` (a bench variant, not the engine's setting)."""
    original = sqlite_store.connect

    def connect(path: Any, **options: Any) -> sqlite3.Connection:
        conn = original(path, **options)
        if os.fspath(path) in paths:
            conn.execute(f"PRAGMA journal_size_limit = {limit}").fetchall()
        return conn
    sqlite_store.connect = connect  # type: ignore[assignment]
    try:
        yield
    finally:
        sqlite_store.connect = original  # type: ignore[assignment]


class LoadedFile:
    """One file of the steady load, with a connection held open all along (as a
    running service holds one: the last connection to close would checkpoint
    and delete the ``-wal``)."""

    def __init__(self, name: str, db: Path, prune: bool) -> None:
        self.name, self.db, self.prune = name, db, prune
        self.clock = ModelClock(1_000_000)
        self.queue = Queue(db, clock=self.clock)
        self.keeper = sqlite3.connect(db, isolation_level=None)
        self.keeper.execute("SELECT count(*) FROM sqlite_master").fetchone()
        self.samples: list[dict[str, int]] = []
        self.rest: list[int] = []  # the -wal after each window's first commit
        self.pruned = self.batches = 0
        self.longest = 0.0
        self.per_call: list[float] = []  # each prune call's longest batch
        self.money = 0
        self.checkpointed = 0  # the file after a checkpoint(TRUNCATE) at the end

    def window(self, ids: range, handler: Handler) -> None:
        with self.queue.session():
            for number, text in enumerate(jsonl(ids, payload_2k, ENQUEUE_LINES)):
                self.queue.enqueue_jsonl(text)
                if number == 0:  # the first commit since the last window's checkpoint
                    self.rest.append(self.wal_bytes())
            kinds = [outcome.kind for outcome in drain(self.queue, handler,
                                                       batch_size=LOAD_BATCH)]
            if kinds != ["done"] * len(ids):
                raise CheckFailed(f"steady load {self.name}: {len(ids)} events, outcomes "
                                  f"{sorted(set(kinds))}")
            self.money += sum(amount_of(i) for i in ids)
            self.clock.advance(WINDOW_SECONDS)
            if self.prune:
                # window w finished at t_w; now t_w + 10: older than 25 s leaves w and w - 1
                done = self.queue.prune(WINDOW_SECONDS * LIVE_WINDOWS + WINDOW_SECONDS // 2)
                self.pruned, self.batches = self.pruned + done.messages, self.batches + done.batches
                self.longest = max(self.longest, done.longest_batch_seconds)
                if done.batches:
                    self.per_call.append(done.longest_batch_seconds)
                if done.kept:
                    raise CheckFailed(f"steady load {self.name}: prune kept {done.kept} whole")
        self.samples.append(dict(self.sizes(), events=ids.stop))

    def sizes(self) -> dict[str, int]:
        """The file, its ``-wal``, and from ``dbstat``: payload text, journal pages,
        and the pages of what every event keeps less the payload text on them."""
        pages = dict(self.keeper.execute("SELECT name, sum(pgsize) FROM dbstat GROUP BY name"))
        payload, live = self.keeper.execute(
            "SELECT coalesce(sum(length(CAST(payload AS BLOB))), 0), count(payload) "
            "FROM messages").fetchone()
        kept = sum(pages.get(name, 0) for name in KEPT)
        return {"file": self.db.stat().st_size, "wal": self.wal_bytes(),
                "payload": int(payload), "live": int(live),
                "journal": int(pages.get("transitions", 0)), "kept": int(kept - payload),
                "index": int(pages.get("messages_live", 0))}

    def wal_bytes(self) -> int:
        wal = Path(f"{self.db}-wal")
        return wal.stat().st_size if wal.exists() else 0

    def check(self, events: int) -> None:
        """The audit finds nothing; every event done once, its effect exact."""
        snap = audit.snapshot(self.db)
        problems = [str(finding) for finding in audit.check(snap)[:3]]
        states = snap.status.states
        found = (states["done"], states["ready"] + states["leased"] + states["dead"],
                 snap.status.effects, snap.money)
        if problems or found != (events, 0, events, self.money):
            raise CheckFailed(f"steady load {self.name}: (done, other, effects, money) = {found}, "
                              f"expected {(events, 0, events, self.money)}; audit: "
                              f"{problems or 'clean'}")

    def close(self) -> None:
        self.keeper.close()


def steady_load(workdir: Path, events: int, window: int,
                say: Callable[[str], None] = lambda text: None) -> dict[str, Any]:
    """The steady load on the three files, window by window, round-robin; the
    figures and the checks (``CheckFailed``)."""
    if events > IDS_PER_FILE or events % window:
        raise ValueError(f"{events} events in windows of {window}: at most {IDS_PER_FILE}, "
                         "a whole number of windows")
    say(f"steady load: {events:,} events of {PAYLOAD_BYTES} bytes in windows of {window}, "
        "never pruned, pruned, and pruned with journal_size_limit")
    files = {name: LoadedFile(name, workdir / f"steady-{name}.sqlite3", prune)
             for name, prune in (("unpruned", False), ("pruned", True), ("limited", True))}
    handler = Handler()
    try:
        with journal_size_limit({str(files["limited"].db)}, WAL_LIMIT):
            for start in range(0, events, window):
                for loaded in files.values():
                    loaded.window(range(start, start + window), handler)
            for loaded in files.values():
                loaded.check(events)
            live = files["pruned"].samples[-1]["live"]
            if live != LIVE_WINDOWS * window:
                raise CheckFailed(f"steady load: {live} messages keep their payload after the "
                                  f"last prune, expected the {LIVE_WINDOWS * window} of the "
                                  "live window")
            for loaded in files.values():  # the data alone: the -wal copied in and emptied
                loaded.keeper.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
                loaded.checkpointed = loaded.db.stat().st_size
            kept = kept_per_pruned_event(files["pruned"], events)
            replay = replay_of_a_pruned_event(files["pruned"], events)
        return {"events": events, "window": window, "live_windows": LIVE_WINDOWS,
                "payload_bytes": PAYLOAD_BYTES, "wal_limit": WAL_LIMIT,
                "checkpoint_pages": sqlite.CHECKPOINT_PAGES, "page_size": sqlite.PAGE_SIZE,
                "files": {name: dict(loaded.samples[-1], wal_peak=max(
                    s["wal"] for s in loaded.samples), wal_rest=loaded.rest[-1],
                    checkpointed=loaded.checkpointed)
                    for name, loaded in files.items()},
                "samples": files["pruned"].samples,
                "flat": flatness(files["pruned"].samples, LIVE_WINDOWS),
                "slope": slope(files["pruned"].samples, LIVE_WINDOWS),
                "kept": kept, "replay": replay,
                "prune": {"messages": files["pruned"].pruned, "batches": files["pruned"].batches,
                          "longest_s": max(files["pruned"].longest, files["limited"].longest),
                          "median_call_s": statistics.median(
                              files["pruned"].per_call + files["limited"].per_call)}}
    finally:
        for loaded in files.values():
            loaded.close()


def flatness(samples: list[dict[str, int]], rolled_after: int) -> dict[str, Any]:
    """The payload and journal bytes once the windows roll: their least and largest."""
    rolled = samples[rolled_after - 1:]
    return {key: (min(s[key] for s in rolled), max(s[key] for s in rolled))
            for key in ("payload", "journal", "index")}


def slope(samples: list[dict[str, int]], rolled_after: int) -> float | None:
    """Bytes the pruned file keeps per event once the windows roll: the least-squares
    slope of ``kept`` against events (keys, digests, effects, records, on pages)."""
    rolled = samples[rolled_after - 1:]
    if len(rolled) < 2:
        return None
    xs, ys = [s["events"] for s in rolled], [s["kept"] for s in rolled]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


# The process that meets the write lock as another writer would (``prune_hold``): on
# ``g`` it answers ``go``, then takes the lock (``BEGIN IMMEDIATE``, never waiting)
# and releases it (``ROLLBACK``) again and again, timing each spell from its first
# try that found the lock taken to the next one that got it. ``m`` and ``s`` each
# close a phase: the probe takes the lock once more (the phase's last hold has then
# ended), and on ``m`` answers ``ok`` and starts the next phase, on ``s`` answers
# each phase's longest spell, in seconds. Any error but SQLITE_BUSY ends it.
_LOCK_PROBE = """
import os, select, sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], timeout=0, isolation_level=None)
conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
while os.read(0, 1) == b"g":
    phases, longest, since, closing = [], 0.0, None, b""
    print("go", flush=True)
    while closing != b"s":
        if not closing and select.select([0], [], [], 0)[0]:
            closing = os.read(0, 1)
            if closing not in (b"m", b"s"):
                sys.exit(f"unknown command {closing!r}")
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            if exc.sqlite_errorcode & 0xFF != 5:  # SQLITE_BUSY
                raise
            since = time.perf_counter() if since is None else since
            continue
        now = time.perf_counter()
        conn.execute("ROLLBACK")
        if since is not None:
            longest, since = max(longest, now - since), None
        if closing:
            phases, longest = phases + [longest], 0.0
            if closing == b"m":
                closing = b""
                print("ok", flush=True)
    print(" ".join(str(spell) for spell in phases), flush=True)
"""
PROBE_ANSWER_SECONDS = 60.0  # a probe that does not answer within this has failed


def prune_hold(workdir: Path, messages: int) -> dict[str, Any]:
    """How long a prune keeps another writer from the write lock.

    ``messages`` events of ``PAYLOAD_BYTES`` are enqueued and processed, then
    ``prune(0)`` prunes them with no writer beside it but ``_LOCK_PROBE``, which
    only takes and releases the lock: its longest spell without the lock is the
    hold as a worker beside the prune would meet it, first over the batches of
    ``PRUNE_BATCH`` messages, then over the giving back of freed pages that
    follows them (the probe is told when ``retention._give_back`` begins, and
    answers once the batches' last hold has ended, so no spell of the first
    phase outlasts the batches: ``held_s`` is below ``seconds``, the whole
    prune's). SQLite's
    automatic checkpoint, which a commit call runs after releasing the lock, is
    in neither; the batches' own ``longest_batch_seconds`` (to the end of the
    commit call, a wait for the probe's brief hold included) is given beside.
    The probe never commits, so the prune counts as a quiet one: where the
    ``-wal`` has reached ``retention.WAL_TRUNCATE_BYTES`` and the probe is not in
    the lock at that moment, the prune ends by truncating it, a hold of a whole
    checkpoint, in the second phase (a worker that commits during the prune
    prevents that truncation). A probe that fails raises ``RuntimeError``, not
    ``CheckFailed``: no exactly-once check failed.
    """
    clock = ModelClock(1_000_000)
    queue = Queue(workdir / "hold.sqlite3", clock=clock)
    with queue.session():
        for text in jsonl(range(messages), payload_2k, ENQUEUE_LINES):
            queue.enqueue_jsonl(text)
        kinds = [outcome.kind for outcome in drain(queue, Handler(), batch_size=LOAD_BATCH)]
    if kinds != ["done"] * messages:
        raise CheckFailed(f"prune hold: {messages} events, outcomes {sorted(set(kinds))}")
    clock.advance(WINDOW_SECONDS)
    give_back = retention._give_back
    with subprocess.Popen([sys.executable, "-c", _LOCK_PROBE, str(queue.store.target)],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as probe:

        def tell(command: str) -> str:
            assert probe.stdin is not None and probe.stdout is not None
            probe.stdin.write(command)
            probe.stdin.flush()
            if not select.select([probe.stdout], [], [], PROBE_ANSWER_SECONDS)[0]:
                raise RuntimeError(f"prune hold: the lock probe did not answer {command!r}")
            return probe.stdout.readline().strip()

        def expect(command: str, answer: str) -> None:
            if (got := tell(command)) != answer:
                raise RuntimeError(f"prune hold: the lock probe answered {got!r} to "
                                   f"{command!r}, not {answer!r}")

        def marked(*args: Any, **kwargs: Any) -> None:
            expect("m", "ok")
            give_back(*args, **kwargs)
        try:
            expect("g", "go")  # it loops from there on
            started = time.perf_counter()
            retention._give_back = marked
            try:
                done = queue.prune(0)
            finally:
                retention._give_back = give_back
            spells = [float(spell) for spell in tell("s").split()]
        finally:
            probe.kill()
    if done.messages != messages - 1 or done.kept:  # the journal's last row's owner waits
        raise CheckFailed(f"prune hold: pruned {done.messages} of {messages}, kept {done.kept}")
    if len(spells) != 2:
        raise RuntimeError(f"prune hold: the lock probe answered {spells}, not two phases")
    return {"messages": done.messages, "batches": done.batches, "held_s": spells[0],
            "give_back_held_s": spells[1], "longest_call_s": done.longest_batch_seconds,
            "seconds": time.perf_counter() - started}


def kept_per_pruned_event(loaded: LoadedFile, events: int) -> dict[str, Any]:
    """Prune every done message of the pruned file; the pages (``dbstat``) of what
    they keep, per pruned message, and the bytes of the cells on them."""
    done = loaded.queue.prune(0)
    loaded.pruned += done.messages
    pruned = loaded.keeper.execute("SELECT count(*) FROM messages WHERE payload IS NULL"
                                   ).fetchone()[0]
    per = {name: (pages, cells) for name, pages, cells in loaded.keeper.execute(
        "SELECT name, sum(pgsize), sum(payload) FROM dbstat GROUP BY name")}
    if pruned < events - 1:  # the message owning the journal's last row waits (seq reuse)
        raise CheckFailed(f"steady load: prune(0) left {events - pruned} messages whole")
    return {"pruned": int(pruned),
            "pages": {name: per.get(name, (0, 0))[0] for name in KEPT},
            "cells": {name: per.get(name, (0, 0))[1] for name in KEPT},
            "per_event": sum(per.get(name, (0, 0))[0] for name in KEPT) / pruned,
            "cells_per_event": sum(per.get(name, (0, 0))[1] for name in KEPT) / pruned}


def replay_of_a_pruned_event(loaded: LoadedFile, events: int) -> dict[str, Any]:
    """A replay of E0000 (pruned): the same payload is a duplicate, another one a
    ``batch_conflict``; nothing changes, the money least of all."""
    queue, first = loaded.queue, jsonl(range(1), payload_2k)[0]
    same = queue.enqueue_jsonl(first)
    try:
        queue.enqueue_jsonl(first.replace('"amount_cents": 100', '"amount_cents": 101'))
        conflict = "accepted"
    except BatchConflict as exc:
        conflict = exc.code
    loaded.check(events)
    if (same.inserted, same.duplicates, conflict) != (0, 1, "batch_conflict"):
        raise CheckFailed(f"steady load: a replay of pruned E0000 gave {same} and, with another "
                          f"payload, {conflict}")
    return {"same": "duplicate", "other": conflict}


# -- worker throughput with a prune beside it ------------------------------------

class PrunedEndToEnd(EndToEnd):
    """Our single-message case (``single``), with a pruning process beside the
    workers: ``prune(0)`` every 20 ms while they consume (``bench_worker.Pruner``).

    After each slice: how many messages the pruner had pruned when the workers
    finished, the done messages it had not yet reached (the backlog), its
    longest batch transaction (waits for the lock included); then it prunes
    what is left, and the shared audit checks the file, pruned, again.
    """

    def __init__(self, workdir: Path, n: int, workers: list[Worker], pruner: Worker) -> None:
        self.pruner = pruner
        self.pruning: list[dict[str, Any]] = []
        self._backlog = self._during = 0
        super().__init__("single_pruned", "ours, single message, prune beside", workdir, n,
                         op="drain", workers=workers, producer="single")

    def slice(self) -> Any:
        if self.next_id + self.n > IDS_PER_FILE:
            self._new_file()
        self.pruner.call(op="prune_start", db=str(self.db))
        try:
            measured = super().slice()
        finally:
            stats = self.pruner.call(op="prune_stop")
        assert self.keeper is not None and self.keeper.conn is not None
        whole = self.keeper.conn.execute("SELECT count(*) FROM messages WHERE state = 'done' "
                                         "AND payload IS NOT NULL").fetchone()[0]
        if stats["kept"] or whole > 1:  # one may own the journal's last row
            raise CheckFailed(f"{self.name}: after the last prune {whole} done messages keep "
                              f"their payload, {stats['kept']} kept whole")
        self.keeper.check_exactly_once(self.next_id, self.money)
        # kept up: never further behind than the messages the worker finishes in three
        # of the pruner's pauses
        bound = measured.messages / measured.consume_s * 3 * PRUNE_EVERY_S
        self.pruning.append(dict(stats, during=self._during, backlog=self._backlog,
                                 consumed=measured.messages, bound=bound))
        return measured

    def after_consume(self) -> None:
        assert self.keeper is not None and self.keeper.conn is not None
        self._during = self.pruner.call(op="prune_count")["messages"]
        self._backlog = self.keeper.conn.execute(
            "SELECT count(*) FROM messages WHERE state = 'done' AND payload IS NOT NULL"
        ).fetchone()[0]

    def summary(self) -> dict[str, Any]:
        if not self.pruning:
            return {}
        during = sum(s["during"] for s in self.pruning)
        return {"slices": len(self.pruning),
                "during": during,
                "kept_up": all(s["backlog"] <= s["bound"] for s in self.pruning),
                "bound_min": min(s["bound"] for s in self.pruning),
                "pruned": sum(s["messages"] for s in self.pruning),
                "consumed": sum(s["consumed"] for s in self.pruning),
                "backlog_max": max(s["backlog"] for s in self.pruning),
                "backlog_median": statistics.median(s["backlog"] for s in self.pruning),
                "longest_s": max(s["longest_s"] for s in self.pruning)}


# -- the pages of the worker loop's ACK --------------------------------------------

def ack_pages() -> dict[str, list[int]]:
    """The WAL pages of each commit of the worker loop consuming three orders on a
    fresh file (``lab.speed.commits``): each ACK that claims the next message, and
    the last ACK. Schema 2's finish time is written in the row the ACK rewrites
    anyway; this shows whether it cost a page."""
    from queue_core.lab.speed.commits import consume_transactions

    loop = consume_transactions()["the worker loop (drain)"]
    return {"fused": [t.pages for t in loop if t.acked and t.claimed],
            "last": [t.pages for t in loop if t.acked and not t.claimed],
            "fsynced": [t.fsynced for t in loop if t.acked]}


# -- PostgreSQL: space after prune and VACUUM ------------------------------------

PG_TABLES = ("messages", "transitions", "effects", "compacted")


def pg_sizes(dsn: str) -> dict[str, dict[str, int]]:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        return {table: dict(zip(("heap", "indexes", "total"), conn.execute(
            "SELECT pg_relation_size(%s::regclass), pg_indexes_size(%s::regclass), "
            "pg_total_relation_size(%s::regclass)", (table, table, table)).fetchone()))
            for table in PG_TABLES}


def pg_vacuum(dsn: str) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        for table in PG_TABLES:
            conn.execute(f"VACUUM {table}")


def pg_space(dsn: str, events: int, say: Callable[[str], None] = lambda text: None
             ) -> dict[str, Any]:
    """``events`` of 2 KB processed; sizes; prune(0) and VACUUM; sizes; as many
    events again, processed, pruned and vacuumed; sizes. Checked by the audit."""
    say(f"PostgreSQL space: {events:,} events of {PAYLOAD_BYTES} bytes, prune, VACUUM, again")
    queue, handler, money, stages = Queue(dsn), Handler(), 0, {}
    for round_no, stage in enumerate(("after", "again")):
        ids = range(round_no * events, (round_no + 1) * events)
        with queue.session():
            for text in jsonl(ids, payload_2k, ENQUEUE_LINES):
                queue.enqueue_jsonl(text)
            kinds = {outcome.kind for outcome in drain(queue, handler, batch_size=LOAD_BATCH)}
        money += sum(amount_of(i) for i in ids)
        if kinds != {"done"}:
            raise CheckFailed(f"PostgreSQL space: outcomes {kinds}")
        if round_no == 0:
            stages["before"] = pg_sizes(dsn)
        done = queue.prune(0)
        if done.kept:
            raise CheckFailed(f"PostgreSQL space: prune kept {done.kept} whole")
        pg_vacuum(dsn)
        stages[stage] = pg_sizes(dsn)
    snap = audit.snapshot(dsn)
    problems = [str(finding) for finding in audit.check(snap)[:3]]
    found = (snap.status.states["done"], snap.status.effects, snap.money)
    if problems or found != (2 * events, 2 * events, money):
        raise CheckFailed(f"PostgreSQL space: (done, effects, money) = {found}, expected "
                          f"{(2 * events, 2 * events, money)}; audit: {problems or 'clean'}")
    return {"events": events, **stages}


# -- migrate, beside a running worker of the previous engine ----------------------

BUILD_SCRIPT = r"""
import json, sys
from queue_core import Handler, Queue, drain
target, done, ready = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def line(i):
    return json.dumps({"event_id": f"E{i:04d}", "payload": {
        "amount_cents": 100 + i % 900, "category": ("book", "pen", "bag")[i % 3]}})
queue = Queue(target)
def put(ids):
    ids = list(ids)
    for start in range(0, len(ids), 1000):
        queue.enqueue_jsonl("\n".join(line(i) for i in ids[start:start + 1000]))
put(range(done))
drain(queue, Handler(), batch_size=100)
put(range(done, done + ready))
print(json.dumps(queue.status().states))
"""

# One claim and one ACK per step, each step's start and end on the monotonic clock
# (system-wide: comparable with the parent's); the first refusal ends it.
WORKER_SCRIPT = r"""
import json, sys, time
from queue_core import Handler, Queue
queue, handler = Queue(sys.argv[1], lease_seconds=3), Handler()
with queue.session():
    while True:
        start = time.monotonic()
        try:
            lease = queue.claim()
            if lease is None:
                print(json.dumps({"start": start, "end": time.monotonic(), "step": "empty"}))
                break
            queue.complete(lease, handler)
        except Exception as exc:
            print(json.dumps({"start": start, "end": time.monotonic(), "step": "refused",
                              "error": type(exc).__name__, "text": str(exc)[:160]}))
            break
        print(json.dumps({"start": start, "end": time.monotonic(), "step": "done"}), flush=True)
"""


def export_engine(folder: Path, commit: str = MIGRATE_ENGINE) -> Path:
    """``queue_core`` as it was at ``commit`` (from git history) in ``folder``;
    raises ``LookupError`` with the reason where the history is not here."""
    try:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", commit,
                                  "queue_core"], check=True, capture_output=True,
                                 timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise LookupError(f"the previous engine ({commit}) comes from git history, and "
                          f"{ROOT} is not a git checkout that holds it ({exc})") from None
    target = folder / commit
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(target, filter="data")
    return target


@contextmanager
def step_times() -> Iterator[dict[str, float]]:
    """The monotonic time at which this process's migration passed each of its crash
    points (``migrate.after_begin``: the step holds its transaction, on SQLite the
    write lock; ``migrate.after_commit``: released). Measurement only: each point
    still does what it does (nothing, unless armed)."""
    from queue_core.postgres import store as postgres

    seen: dict[str, float] = {}
    originals = (sqlite_migrations.crash_point, postgres.crash_point)

    def record(name: str) -> None:
        seen.setdefault(name, time.monotonic())
        originals[0](name)
    sqlite_migrations.crash_point = postgres.crash_point = record  # type: ignore[assignment]
    try:
        yield seen
    finally:
        sqlite_migrations.crash_point, postgres.crash_point = originals  # type: ignore[assignment]


def _engine_env(engine: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(engine), "PYTHONDONTWRITEBYTECODE": "1"}


def migrate_beside_a_worker(engine: Path, target: str, messages: int, ready: int,
                            say: Callable[[str], None] = lambda text: None) -> dict[str, Any]:
    """Write ``messages`` (``ready`` of them left ready) with the previous engine,
    start its worker, migrate while it runs; finish with this engine and check."""
    build = subprocess.run([sys.executable, "-c", BUILD_SCRIPT, target, str(messages - ready),
                            str(ready)], env=_engine_env(engine), cwd=engine,
                           capture_output=True, text=True, timeout=600)
    if build.returncode != 0:
        raise CheckFailed(f"the previous engine could not write {target}: {build.stderr[-400:]}")
    worker = subprocess.Popen([sys.executable, "-c", WORKER_SCRIPT, target],
                              env=_engine_env(engine), cwd=engine, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    assert worker.stdout is not None
    steps = []
    try:
        for _ in range(20):  # it is working
            line = worker.stdout.readline()
            if not line:
                raise CheckFailed(f"the previous engine's worker on {target} ended early: "
                                  f"{worker.communicate(timeout=60)[1][-400:]}")
            steps.append(json.loads(line))
        started = time.monotonic()
        with step_times() as seen:
            done = migrate(target)
        ended = time.monotonic()
        out, err = worker.communicate(timeout=300)
    finally:
        worker.kill()
        worker.wait()
    steps += [json.loads(line) for line in out.splitlines()]
    # 1 -> 2 rewrites every message; PostgreSQL's 2 -> 3 adds a function, rewriting none
    if done.steps[0] != (1, messages) or any(rows for _, rows in done.steps[1:]):
        raise CheckFailed(f"migrate of {messages} messages did {done.steps}")
    held = (seen["migrate.after_begin"], seen["migrate.after_commit"])
    across = [s["end"] - s["start"] for s in steps if s["start"] < held[1] and s["end"] > held[0]]
    usual = [s["end"] - s["start"] for s in steps if s["step"] == "done"
             and not (s["start"] < ended and s["end"] > started)]
    last = steps[-1]
    finish(target, messages)
    return {"messages": messages, "seconds": ended - started,
            "waited_s": held[0] - started, "held_s": held[1] - held[0],
            "blocked_s": max(across) if across else None,
            "usual_step_s": statistics.median(usual) if usual else None,
            "worker_end": last["step"] if last["step"] != "refused"
            else f"refused ({last['error']}: {last['text'].splitlines()[0][:90]})",
            "worker_steps": sum(s["step"] == "done" for s in steps)}


def finish(target: str, messages: int) -> None:
    """This engine finishes every message (the refused ACK's 3 s lease expires first);
    the audit finds nothing, every message done once, the money exact."""
    queue, handler = Queue(target), Handler()
    deadline = time.monotonic() + 30
    while queue.status().states["done"] < messages and time.monotonic() < deadline:
        drain(queue, handler)
        time.sleep(0.2)
    snap = audit.snapshot(target)
    problems = [str(finding) for finding in audit.check(snap)[:3]]
    money = sum(amount_of(i) for i in range(messages))
    found = (snap.version, snap.status.states["done"], snap.status.effects, snap.money)
    wanted = (queue.store.schema_version, messages, messages, money)
    if problems or found != wanted:
        raise CheckFailed(f"after migrate: (version, done, effects, money) = {found}, expected "
                          f"{wanted}; audit: {problems or 'clean'}")


def migrations(workdir: Path, messages: int, ready: int, dsn: str | None,
               say: Callable[[str], None] = lambda text: None) -> dict[str, Any]:
    """The migration figures on SQLite and, given ``dsn``, PostgreSQL."""
    try:
        engine = export_engine(workdir)
    except LookupError as exc:
        return {"skipped": str(exc)}
    found: dict[str, Any] = {"engine": MIGRATE_ENGINE}
    say(f"migrate: {messages:,} messages written by {MIGRATE_ENGINE}, its worker running")
    found["sqlite"] = migrate_beside_a_worker(engine, str(workdir / "migrate.sqlite3"),
                                              messages, ready, say)
    if dsn is not None:
        found["postgres"] = migrate_beside_a_worker(engine, dsn, messages, ready, say)
    return found

