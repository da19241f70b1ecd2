"""The SQLite queues a Python user would pick instead, as cases of ``bench.py``.

Why not use a library? This file runs the libraries in the same interleaved
slices as our own cases, each with its own defaults, and reads back the
pragmas each one leaves on its connection (``journal_mode``,
``synchronous``), because that is what its speed buys and costs.

Every peer does, per message, what our ``single`` case does: put (our
enqueue, one item per commit on both sides), get (our claim) and ack (our
ACK); the consumer side (get + ack against claim + ACK) is timed apart from
the puts. Each runs on its own defaults and, where the library lets a
caller set it, at ``synchronous=FULL`` too (litequeue exposes its
connection; persist-queue and huey already run at FULL). What "ack" means
differs:

``persist-queue`` (``persistqueue.SQLiteAckQueue``)
    ``get`` reads the next row whose status is below ``unack`` and then, in a
    second statement, marks it ``unack``; ``ack`` marks it ``acked``. Each
    is its own commit. A queue opened later (``auto_resume``, the default)
    puts every ``unack`` row back to ``ready``: that is how a crashed
    consumer's item comes back, and it also hands out items that a live
    consumer is still working on.
``litequeue`` (``litequeue.LiteQueue``)
    ``pop`` locks the next row with one ``UPDATE ... RETURNING`` in a
    ``BEGIN IMMEDIATE`` transaction; ``done(message_id)`` marks it done. A
    locked row stays locked if its consumer dies: ``list_locked`` and
    ``retry`` exist, but nothing calls them for you.
``huey`` (``huey.storage.SqliteStorage``, the storage of ``SqliteHuey``)
    ``dequeue`` selects and DELETEs the row in one ``BEGIN EXCLUSIVE``
    transaction; there is no ack and no lease, so getting an item is its
    acknowledgement (at most once). ``enqueue``/``dequeue`` are the
    storage's methods for task data.

None of them writes an effect in the ack's transaction, as our ACK does:
in the bare comparison they are measured doing less work per message, on
their own pragmas. On the same work (``SameWorkCase``) each consumer also
does what that library's users do with a message: it commits the effect in
the application's own database (``app_effects.py``), in a commit of its
own, idempotent by the event id, between its get and its ack; every commit
on both sides then waits for a flush. What that buys depends on where the
library's get leaves the message: persist-queue and litequeue, and on
PostgreSQL pgqueuer and procrastinate, keep it until the ack, so a
consumer that dies after the effect's commit has it delivered again
(persist-queue and pgqueuer by themselves, litequeue and procrastinate once
someone retries it) and the effect's key keeps the second run from adding
anything: at least once, with idempotent effects. huey's dequeue has
already deleted it: a consumer that dies before the effect's commit loses
it, at most once.

The PostgreSQL peers (pgqueuer, procrastinate) live in ``pgpeers.py`` and
run through this file's worker process and case, on the benchmark's server.

Run as a script with ``--worker``, this file is the peers' worker process:
like ``bench_cases.Worker``, it takes commands on stdin so that a slice
measures the queue, not Python start-up.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # the cases live next to this file
    sys.path.insert(0, str(HERE))

import app_effects  # noqa: E402
from bench_cases import ROOT, Case, CheckFailed, Slice, Worker  # noqa: E402
from peer_base import Adapter, item_of  # noqa: E402
from pgpeers import PG_PEERS  # noqa: E402

from queue_core.lab.servers.pgcases import Schemas  # noqa: E402
from queue_core.lab.speed.slowdisk import flush_calls  # noqa: E402


class PersistQueue(Adapter):
    name, dist, module = "persist-queue", "persist-queue", "persistqueue"
    ack_means = "ack marks the row acked (get had marked it unack in a second statement)"
    guarantee = "at least once, deduped"
    guarantee_why = ("the effect commits before the ack: a consumer that dies between them "
                     "leaves the row unack, the next queue opened puts it back (auto_resume), "
                     "and the effect's key makes the second run add nothing; the key also "
                     "absorbs the items a reopened queue hands out while a live consumer "
                     "still holds them")

    def __init__(self, path: Path | str, variant: str = "defaults") -> None:
        super().__init__(path, variant)
        import persistqueue
        self.empty = persistqueue.Empty
        self.queue = persistqueue.SQLiteAckQueue(str(path))  # a folder holding data.db

    def put(self, items: list[str]) -> None:
        for item in items:
            self.queue.put(item)

    def take(self) -> tuple[Any, str | bytes] | None:
        try:
            got = self.queue.get(block=False, raw=True)
        except self.empty:
            return None
        return got["pqid"], got["data"]

    def ack(self, handle: Any) -> None:
        self.queue.ack(id=handle)

    def connection(self) -> Any:
        return self.queue._conn  # the library's only connection (multithreading=False)


class LiteQueue(Adapter):
    name, dist, module = "litequeue", "litequeue", "litequeue"
    variants = ("FULL", "defaults")  # its default is synchronous=NORMAL
    ack_means = "done(message_id) marks the locked row done; a dead consumer's row stays locked"
    guarantee = "at least once after a retry, deduped"
    guarantee_why = ("the effect commits before done(): a consumer that dies between them "
                     "leaves the row locked until someone calls retry (nothing does by "
                     "itself); the redelivery then finds the effect's key and adds nothing")

    def __init__(self, path: Path | str, variant: str = "defaults") -> None:
        super().__init__(path, variant)
        import litequeue
        self.queue = litequeue.LiteQueue(str(path))
        if variant == "FULL":  # its connection is public: the same durability as ours
            self.queue.conn.execute("PRAGMA synchronous = FULL")

    def put(self, items: list[str]) -> None:
        for item in items:
            self.queue.put(item)

    def take(self) -> tuple[Any, str | bytes] | None:
        message = self.queue.pop()
        return None if message is None else (message.message_id, message.data)

    def ack(self, handle: Any) -> None:
        self.queue.done(handle)

    def connection(self) -> Any:
        return self.queue.conn


class Huey(Adapter):
    name, dist, module = "huey", "huey", "huey"
    ack_means = "none: dequeue deletes the row, so getting an item acknowledges it"
    guarantee = "at most once"
    guarantee_why = ("dequeue deletes the task before the work runs: a consumer that dies "
                     "after the get and before the effect's commit loses the message; the "
                     "effect's key only keeps an event enqueued twice from counting twice")

    def __init__(self, path: Path | str, variant: str = "defaults") -> None:
        super().__init__(path, variant)
        from huey.storage import SqliteStorage
        self.storage = SqliteStorage(name="bench", filename=str(path))

    def put(self, items: list[str]) -> None:
        for item in items:
            self.storage.enqueue(item.encode())

    def take(self) -> tuple[Any, str | bytes] | None:
        data = self.storage.dequeue()
        return None if data is None else (None, bytes(data))

    def ack(self, handle: Any) -> None:
        """Nothing to do: ``dequeue`` already deleted the task."""

    def connection(self) -> Any:
        return self.storage.conn

    def close(self) -> None:
        self.close_effects()
        self.storage.close()


class QueueCore(Adapter):
    """Ours, through the same calls, for the safety probe: claim is the get,
    complete (effect and ACK in one transaction) is the ack."""

    name, dist, module = "queue_core", "queue-core", "queue_core"
    ack_means = "complete writes the effect and the ACK in one transaction, fenced by the lease"
    lease_seconds = 30.0

    def __init__(self, path: Path | str, variant: str = "defaults") -> None:
        super().__init__(path, variant)
        if str(ROOT) not in sys.path:
            sys.path.insert(0, str(ROOT))
        from queue_core import Handler, Queue
        self.queue = Queue(path, lease_seconds=int(self.lease_seconds or 30))
        self.handler = Handler()
        self._conn: Any = None

    def put(self, items: list[str]) -> None:
        self.queue.enqueue_jsonl("\n".join(items))

    def get(self) -> tuple[Any, str] | None:
        lease = self.queue.claim()
        return None if lease is None else (lease, lease.event_id)

    def ack(self, handle: Any) -> None:
        self.queue.complete(handle, self.handler)

    def settled(self) -> tuple[int, int] | None:
        from queue_core import audit
        states = audit.snapshot(self.queue.path).status.states
        return states["done"], states["ready"] + states["leased"]

    def connection(self) -> Any:
        """A connection opened as the queue opens its own (same pragmas)."""
        if self._conn is None:
            from queue_core.sqlite import connect
            self._conn = connect(self.queue.path, synchronous=self.queue.synchronous)
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()


class QueueCorePg(QueueCore):
    """Ours on PostgreSQL, for the PostgreSQL peers' safety probe."""

    name, store = "queue_core_pg", "postgres"

    def pragmas(self) -> dict[str, str]:
        with self.queue.session():
            conn = self.queue.connection
            assert conn is not None
            sync = conn.execute("SHOW synchronous_commit").fetchone()[0]
        return {"journal_mode": "LOGGED", "synchronous": str(sync)}

    def still_stored(self, event_id: str) -> bool:
        from queue_core import audit
        return audit.snapshot(self.queue.path).states().get(event_id) not in (None, "done")

    def close(self) -> None:
        """Nothing held open: each call opened and closed its own connection."""


PEERS: dict[str, type[Adapter]] = {a.name: a for a in (PersistQueue, LiteQueue, Huey)}
OURS: dict[str, type[Adapter]] = {QueueCore.name: QueueCore, QueueCorePg.name: QueueCorePg}
ADAPTERS: dict[str, type[Adapter]] = {**PEERS, **PG_PEERS, **OURS}


def installed_peers(store: str = "sqlite") -> list[type[Adapter]]:
    every = PEERS if store == "sqlite" else PG_PEERS
    return [adapter for adapter in every.values() if adapter.installed()]


def missing_peers() -> list[str]:
    return [adapter.dist for adapter in (*PEERS.values(), *PG_PEERS.values())
            if not adapter.installed()]


# -- the worker process -------------------------------------------------------

def worker_main() -> None:
    """Serve commands from stdin, one JSON object a line, one reply a line.

    Each command names a peer, a variant and its ``work`` (``bare``, the
    default, or ``same``): one queue is open per three. ``open``: open a
    peer's queue, and with ``effects`` the application's database the
    ``same`` work writes to; reply the durability read back from each.
    ``put``: put items ``first`` .. ``first + n - 1``; ``consume``: get and
    ack (``same``: get, commit the effect, ack) until ``n`` items came or
    nothing is ready, and reply the event ids in the order they came, with
    the flushes the slow-disk shim counted meanwhile (``None`` without it);
    ``settled``: the library's own count of acknowledged and pending items.
    """
    queues: dict[str, Adapter] = {}
    for line in sys.stdin:
        cmd = json.loads(line)
        key = f"{cmd['peer']}/{cmd['variant']}/{cmd.get('work', 'bare')}"
        reply: dict[str, Any] = {}
        if cmd["op"] == "open":
            queues[key] = ADAPTERS[cmd["peer"]](cmd["path"], cmd["variant"])
            reply = queues[key].pragmas()
            if cmd.get("effects"):
                reply["effects"] = queues[key].open_effects(cmd["effects"])
        elif cmd["op"] == "put":
            queues[key].put([item_of(i) for i in range(cmd["first"], cmd["first"] + cmd["n"])])
        elif cmd["op"] == "consume":
            queue = queues[key]
            before = flush_calls()
            got = queue.work(cmd["n"]) if cmd.get("work") == "same" else queue.consume(cmd["n"])
            after = flush_calls()
            reply = {"got": got, "flushes": None if before is None or after is None
                     else after - before}
        elif cmd["op"] == "settled":
            reply = {"settled": queues[key].settled()}
        print(json.dumps(reply), flush=True)
    for queue in queues.values():
        queue.close()


class PeerWorker(Worker):
    """The peers' worker process: this file, run with ``--worker``."""

    def __init__(self) -> None:
        super().__init__(__file__)


# -- the cases ------------------------------------------------------------------

FSYNCING = ("FULL", "EXTRA", "on", "remote_apply")  # a commit waits for the disk's flush


class PeerCase(Case):
    """Put a slice of items (one per commit), then get and ack them one at a
    time, in the peer worker process. ``consume_s`` is get + ack (the
    consumer side); ``total_s`` adds the puts (end to end).

    After every slice: the items that came back are exactly the items put,
    each once (one consumer, so anything else is the library's fault), and
    where the library's tables can be counted (the PostgreSQL peers), they
    hold every item put so far acknowledged once and nothing pending.
    """

    work = "bare"  # get + ack; ``SameWorkCase``: the effect committed between them
    prefix, suffix = "peer", ""

    def __init__(self, adapter: type[Adapter], variant: str, where: Path | Schemas, n: int,
                 worker: PeerWorker) -> None:
        super().__init__(f"{self.prefix}_{adapter.name}_{variant}",
                         f"{adapter.name} {variant}{self.suffix}",
                         baseline="raw" if adapter.store == "sqlite" else "pg_raw")
        self.peer, self.variant, self.n, self.worker = adapter.name, variant, n, worker
        self.store, self.version, self.ack_means = adapter.store, adapter.version(), adapter.ack_means
        self.next_id = 0
        self.where = {"peer": self.peer, "variant": variant, "work": self.work}
        self.path = adapter.fresh(where, f"{self.prefix}_{variant}".lower())
        self.pragmas = worker.call(op="open", path=self.path, **self.where, **self.opening(where))

    def opening(self, where: Path | Schemas) -> dict[str, Any]:
        """What else ``open`` needs (nothing: the bare work has no database of its own)."""
        return {}

    def slice(self) -> Slice:
        first = self.next_id
        start = time.perf_counter()
        self.worker.call(op="put", first=first, n=self.n, **self.where)
        put = time.perf_counter()
        reply = self.worker.call(op="consume", n=self.n, **self.where)
        end = time.perf_counter()
        got = reply["got"]
        self.next_id += self.n
        wanted = [f"E{i:04d}" for i in range(first, self.next_id)]
        if sorted(got) != wanted:
            raise CheckFailed(f"{self.name}: got {len(got)} items ({len(set(got))} distinct) "
                              f"for the {self.n} put")
        settled = self.worker.call(op="settled", **self.where)["settled"]
        if settled is not None and tuple(settled) != (self.next_id, 0):
            raise CheckFailed(f"{self.name}: its tables count (acknowledged, pending) = "
                              f"{tuple(settled)}, expected {(self.next_id, 0)}")
        self.check_more()
        return Slice(self.n, end - put, end - start, reply["flushes"])

    def check_more(self) -> None:
        """The work's own check after a slice (none for the bare work)."""

    def durability(self) -> str:
        """Its journal and synchronous setting, and whose choice that is."""
        chosen = "its defaults" if self.variant == "defaults" else "set by bench"
        return f"{self.pragmas['journal_mode']}, {self.pragmas['synchronous']} ({chosen})"

    def fsyncs_every_commit(self) -> bool:
        return self.pragmas["synchronous"] in FSYNCING

    def info(self) -> dict[str, Any]:
        return {"peer": self.peer, "variant": self.variant, "version": self.version,
                "store": self.store, "ack": self.ack_means,
                **{k: v for k, v in self.pragmas.items() if k != "effects"}}


class SameWorkCase(PeerCase):
    """A peer on the same work as our worker loop: its consumer gets a message,
    commits the message's effect in the application's own database (its own
    commit, ``INSERT ... ON CONFLICT (event_id) DO NOTHING``), then acks.

    On SQLite the application's database is a file of its own beside the
    queue's, in WAL mode at ``synchronous=FULL``; on PostgreSQL an effects
    table in the queue's schema, written on the consumer's own connection at
    ``synchronous_commit = on``. Only variants whose every queue commit
    fsyncs run: both sides fsync every commit a caller relies on.

    After every slice, besides the items: the effects table holds one effect
    per item put so far, its category and amount exact (``app_effects.check``).
    """

    work, prefix, suffix = "same", "same", " + effect"

    def __init__(self, adapter: type[Adapter], variant: str, where: Path | Schemas, n: int,
                 worker: PeerWorker) -> None:
        self.guarantee, self.guarantee_why = adapter.guarantee, adapter.guarantee_why
        super().__init__(adapter, variant, where, n, worker)
        self.effects_pragmas: dict[str, str] = self.pragmas["effects"]
        if not (self.fsyncs_every_commit()
                and self.effects_pragmas["synchronous"] in FSYNCING):
            raise ValueError(f"{self.name}: not every commit fsyncs ({self.pragmas})")

    def opening(self, where: Path | Schemas) -> dict[str, Any]:
        self.effects_at = (self.path if isinstance(where, Schemas)
                           else str(where / f"app-{self.peer}-{self.variant}.sqlite3".lower()))
        return {"effects": self.effects_at}

    def check_more(self) -> None:
        wrong = app_effects.check(app_effects.rows(self.effects_at), self.next_id)
        if wrong is not None:
            raise CheckFailed(f"{self.name}: the application's effects table holds {wrong}")

    def durability(self) -> str:
        return (f"{super().durability()}; effects "
                f"{self.effects_pragmas['journal_mode']}, {self.effects_pragmas['synchronous']}")

    def info(self) -> dict[str, Any]:
        return {**super().info(), "guarantee": self.guarantee,
                "guarantee_why": self.guarantee_why,
                "effects_journal_mode": self.effects_pragmas["journal_mode"],
                "effects_synchronous": self.effects_pragmas["synchronous"]}


def build_peer_cases(where: Path | Schemas, n: int, worker: PeerWorker,
                     store: str = "sqlite", variants: tuple[str, ...] | None = None
                     ) -> list[PeerCase]:
    """A case per installed peer of ``store`` and per variant (all, or those named)."""
    return [PeerCase(adapter, variant, where, n, worker)
            for adapter in installed_peers(store) for variant in adapter.variants
            if variants is None or variant in variants]


def same_work_variant(adapter: type[Adapter]) -> str:
    """The variant at our durability: ``FULL`` where the bench sets it, else its defaults."""
    return "FULL" if "FULL" in adapter.variants else "defaults"


def build_same_work_cases(where: Path | Schemas, n: int, worker: PeerWorker,
                          store: str = "sqlite") -> list[SameWorkCase]:
    """A case on the same work per installed peer of ``store``, at our durability."""
    return [SameWorkCase(adapter, same_work_variant(adapter), where, n, worker)
            for adapter in installed_peers(store)]


if __name__ == "__main__" and sys.argv[1:] == ["--worker"]:
    worker_main()
