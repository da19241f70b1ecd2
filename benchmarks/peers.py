"""The SQLite queues a Python user would pick instead, as cases of ``bench.py``.

Why not use a library? This file runs the libraries in the same interleaved
slices as our own cases, each with its own defaults, and reads back the
pragmas each one leaves on its connection (``journal_mode``,
``synchronous``), because that is what its speed buys and costs.

Every peer does, per message, what our ``single`` case does end to end: put
(our enqueue), get (our claim) and ack (our ACK). What "ack" means differs:

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
they are measured doing less work per message, on their own pragmas.

Batched variants, where the library offers one: ``litequeue`` puts a whole
slice inside its ``transaction()`` (its get and ack have no batched form).
``persist-queue``'s ack queue refuses ``auto_commit=False``, and huey's
storage has no batch call, so they run single-message only.

Run as a script with ``--worker``, this file is the peers' worker process:
like ``bench_cases.Worker``, it takes commands on stdin so that a slice
measures the queue, not Python start-up.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # the cases live next to this file
    sys.path.insert(0, str(HERE))

from bench_cases import ROOT, Case, CheckFailed, Slice, Worker, payload_of  # noqa: E402

SYNCHRONOUS = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}


def item_of(i: int) -> str:
    """The i-th item: an event as our JSONL carries it, as one string."""
    return json.dumps({"event_id": f"E{i:04d}", "payload": json.loads(payload_of(i))})


def id_of(item: str | bytes) -> str:
    return str(json.loads(item)["event_id"])


# -- adapters: put, get, ack and the pragmas, the same for every queue ----------

class Adapter:
    """One queue library behind put / get / ack.

    ``get`` returns ``(handle, event_id)`` or ``None`` when nothing is
    ready; ``ack(handle)`` acknowledges it. ``pragmas`` reads back
    ``journal_mode`` and ``synchronous`` from the library's own connection.
    """

    name = ""
    dist = ""  # the distribution on the package index
    module = ""
    variants: tuple[str, ...] = ("single",)
    ack_means = ""

    def __init__(self, path: Path, variant: str = "single") -> None:
        self.path, self.variant = path, variant

    @classmethod
    def installed(cls) -> bool:
        return importlib.util.find_spec(cls.module) is not None

    @classmethod
    def version(cls) -> str:
        return importlib.metadata.version(cls.dist)

    def put(self, items: list[str]) -> None:
        raise NotImplementedError

    def get(self) -> tuple[Any, str] | None:
        raise NotImplementedError

    def ack(self, handle: Any) -> None:
        raise NotImplementedError

    def connection(self) -> Any:
        raise NotImplementedError

    def pragmas(self) -> dict[str, str]:
        conn = self.connection()
        mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
        sync = conn.execute("PRAGMA synchronous").fetchone()[0]
        return {"journal_mode": str(mode).upper(), "synchronous": SYNCHRONOUS.get(sync, str(sync))}

    def close(self) -> None:
        self.connection().close()


class PersistQueue(Adapter):
    name, dist, module = "persist-queue", "persist-queue", "persistqueue"
    ack_means = "ack marks the row acked (get had marked it unack in a second statement)"

    def __init__(self, path: Path, variant: str = "single") -> None:
        super().__init__(path, variant)
        import persistqueue
        self.empty = persistqueue.Empty
        self.queue = persistqueue.SQLiteAckQueue(str(path))  # a folder holding data.db

    def put(self, items: list[str]) -> None:
        for item in items:
            self.queue.put(item)

    def get(self) -> tuple[Any, str] | None:
        try:
            got = self.queue.get(block=False, raw=True)
        except self.empty:
            return None
        return got["pqid"], id_of(got["data"])

    def ack(self, handle: Any) -> None:
        self.queue.ack(id=handle)

    def connection(self) -> Any:
        return self.queue._conn  # the library's only connection (multithreading=False)


class LiteQueue(Adapter):
    name, dist, module = "litequeue", "litequeue", "litequeue"
    variants = ("single", "batched")
    ack_means = "done(message_id) marks the locked row done; a dead consumer's row stays locked"

    def __init__(self, path: Path, variant: str = "single") -> None:
        super().__init__(path, variant)
        import litequeue
        self.queue = litequeue.LiteQueue(str(path))

    def put(self, items: list[str]) -> None:
        if self.variant == "batched":
            with self.queue.transaction():
                for item in items:
                    self.queue.put(item)
        else:
            for item in items:
                self.queue.put(item)

    def get(self) -> tuple[Any, str] | None:
        message = self.queue.pop()
        return None if message is None else (message.message_id, id_of(message.data))

    def ack(self, handle: Any) -> None:
        self.queue.done(handle)

    def connection(self) -> Any:
        return self.queue.conn


class Huey(Adapter):
    name, dist, module = "huey", "huey", "huey"
    ack_means = "none: dequeue deletes the row, so getting an item acknowledges it"

    def __init__(self, path: Path, variant: str = "single") -> None:
        super().__init__(path, variant)
        from huey.storage import SqliteStorage
        self.storage = SqliteStorage(name="bench", filename=str(path))

    def put(self, items: list[str]) -> None:
        for item in items:
            self.storage.enqueue(item.encode())

    def get(self) -> tuple[Any, str] | None:
        data = self.storage.dequeue()
        return None if data is None else (None, id_of(bytes(data)))

    def ack(self, handle: Any) -> None:
        """Nothing to do: ``dequeue`` already deleted the task."""

    def connection(self) -> Any:
        return self.storage.conn

    def close(self) -> None:
        self.storage.close()


class QueueCore(Adapter):
    """Ours, through the same calls, for the safety probe: claim is the get,
    complete (effect and ACK in one transaction) is the ack."""

    name, dist, module = "queue_core", "queue-core", "queue_core"
    ack_means = "complete writes the effect and the ACK in one transaction, fenced by the lease"
    lease_seconds = 30

    def __init__(self, path: Path, variant: str = "single") -> None:
        super().__init__(path, variant)
        if str(ROOT) not in sys.path:
            sys.path.insert(0, str(ROOT))
        from queue_core import Handler, Queue
        self.queue = Queue(path, lease_seconds=self.lease_seconds)
        self.handler = Handler()
        self._conn: Any = None

    def put(self, items: list[str]) -> None:
        self.queue.enqueue_jsonl("\n".join(items))

    def get(self) -> tuple[Any, str] | None:
        lease = self.queue.claim()
        return None if lease is None else (lease, lease.event_id)

    def ack(self, handle: Any) -> None:
        self.queue.complete(handle, self.handler)

    def connection(self) -> Any:
        """A connection opened as the queue opens its own (same pragmas)."""
        if self._conn is None:
            from queue_core.storage import connect
            self._conn = connect(self.queue.path, synchronous=self.queue.synchronous)
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()


PEERS: dict[str, type[Adapter]] = {a.name: a for a in (PersistQueue, LiteQueue, Huey)}
ADAPTERS: dict[str, type[Adapter]] = {**PEERS, QueueCore.name: QueueCore}


def installed_peers() -> list[type[Adapter]]:
    return [adapter for adapter in PEERS.values() if adapter.installed()]


def missing_peers() -> list[str]:
    return [adapter.dist for adapter in PEERS.values() if not adapter.installed()]


def store_path(workdir: Path, name: str, variant: str) -> Path:
    return workdir / f"peer-{name}-{variant}.sqlite3"


# -- the worker process -------------------------------------------------------

def worker_main() -> None:
    """Serve commands from stdin, one JSON object a line, one reply a line.

    ``open``: open a peer's queue; ``put``: put items ``first`` ..
    ``first + n - 1``; ``consume``: get and ack until ``n`` items came or
    nothing is ready, and reply the event ids in the order they came.
    """
    queues: dict[str, Adapter] = {}
    for line in sys.stdin:
        cmd = json.loads(line)
        key = f"{cmd['peer']}/{cmd['variant']}"
        reply: dict[str, Any] = {}
        if cmd["op"] == "open":
            queues[key] = ADAPTERS[cmd["peer"]](Path(cmd["path"]), cmd["variant"])
            reply = queues[key].pragmas()
        elif cmd["op"] == "put":
            queues[key].put([item_of(i) for i in range(cmd["first"], cmd["first"] + cmd["n"])])
        elif cmd["op"] == "consume":
            queue, got = queues[key], []
            while len(got) < cmd["n"] and (taken := queue.get()) is not None:
                queue.ack(taken[0])
                got.append(taken[1])
            reply = {"got": got}
        print(json.dumps(reply), flush=True)
    for queue in queues.values():
        queue.close()


class PeerWorker(Worker):
    """The peers' worker process: this file, run with ``--worker``."""

    def __init__(self) -> None:
        super().__init__(__file__)


# -- the case -------------------------------------------------------------------

class PeerCase(Case):
    """Put a slice of items, then get and ack them one at a time, in the peer
    worker process. ``consume_s`` is get + ack; ``total_s`` adds the puts.

    After every slice: the items that came back are exactly the items put,
    each once (one consumer, so anything else is the library's fault).
    """

    def __init__(self, adapter: type[Adapter], variant: str, workdir: Path, n: int,
                 worker: PeerWorker) -> None:
        super().__init__(f"peer_{adapter.name}_{variant}",
                         f"{adapter.name} {variant}, put + get + ack")
        self.peer, self.variant, self.n, self.worker = adapter.name, variant, n, worker
        self.version = adapter.version()
        self.ack_means = adapter.ack_means
        self.next_id = 0
        self.pragmas = worker.call(op="open", peer=self.peer, variant=variant,
                                   path=str(store_path(workdir, self.peer, variant)))

    def slice(self) -> Slice:
        first, where = self.next_id, {"peer": self.peer, "variant": self.variant}
        start = time.perf_counter()
        self.worker.call(op="put", first=first, n=self.n, **where)
        put = time.perf_counter()
        got = self.worker.call(op="consume", n=self.n, **where)["got"]
        end = time.perf_counter()
        self.next_id += self.n
        wanted = [f"E{i:04d}" for i in range(first, self.next_id)]
        if sorted(got) != wanted:
            raise CheckFailed(f"{self.name}: got {len(got)} items ({len(set(got))} distinct) "
                              f"for the {self.n} put")
        return Slice(self.n, end - put, end - start)

    def info(self) -> dict[str, Any]:
        return {"peer": self.peer, "variant": self.variant, "version": self.version,
                "ack": self.ack_means, **self.pragmas}


def build_peer_cases(workdir: Path, n: int, worker: PeerWorker) -> list[PeerCase]:
    return [PeerCase(adapter, variant, workdir, n, worker)
            for adapter in installed_peers() for variant in adapter.variants]


if __name__ == "__main__" and sys.argv[1:] == ["--worker"]:
    worker_main()
