"""What every queue of the benchmark offers: put, get, ack, its durability, a fresh store.

``peers.py`` (SQLite) and ``pgpeers.py`` (PostgreSQL) implement it for the
libraries a Python user would pick; ``peer_safety.py`` and the peers'
worker process speak only to this interface. ``work`` is a peer on the
same work as ours: between its get and its ack the consumer commits the
message's effect in the application's own database (``app_effects.py``).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import sqlite3
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if str(ROOT) not in sys.path:  # run from a checkout: the package sits next to us
    sys.path.insert(0, str(ROOT))

from app_effects import SqliteEffects, effect_of_item  # noqa: E402
from bench_cases import payload_of  # noqa: E402

from queue_core.lab.servers.pgcases import Schemas  # noqa: E402

SYNCHRONOUS = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}


def item_of(i: int) -> str:
    """The i-th item: an event as our JSONL carries it, as one string."""
    return json.dumps({"event_id": f"E{i:04d}", "payload": json.loads(payload_of(i))})


def id_of(item: str | bytes) -> str:
    return str(json.loads(item)["event_id"])


class Adapter:
    """One queue library behind put / get / ack.

    ``take`` returns ``(handle, the item as put)`` or ``None`` when
    nothing is ready, ``get`` the same with the item's event id;
    ``ack(handle)`` acknowledges it; ``consume(n)`` gets and acks until
    ``n`` came or nothing is ready; ``work(n)`` does the same work as our
    worker loop: take, commit the effect in the application's database
    opened by ``open_effects``, ack. ``pragmas`` reads the durability
    back from the library's own connection: ``journal_mode`` and
    ``synchronous`` on SQLite; on PostgreSQL whether its tables are
    WAL-logged and ``synchronous_commit``. ``variant`` is ``"defaults"``
    (the library as installed) or ``"FULL"`` (``synchronous=FULL`` set by
    us on the connection the library exposes).
    """

    name = ""
    dist = ""  # the distribution on the package index
    module = ""
    store = "sqlite"  # or "postgres": where ``fresh`` makes its stores
    variants: tuple[str, ...] = ("defaults",)
    ack_means = ""
    lease_seconds: float | None = None  # the safety probe's crash sets it where the library has one
    reader_judges_lease = False  # True: staleness is the dequeuer's parameter, not the claim's
    # What a consumer on the same work (effect committed between get and ack,
    # idempotent by event id) is then promised: a few words for the table, and why.
    guarantee = ""
    guarantee_why = ""

    def __init__(self, path: Path | str, variant: str = "defaults") -> None:
        self.path, self.variant = path, variant
        self.effects: Any = None

    @classmethod
    def installed(cls) -> bool:
        return importlib.util.find_spec(cls.module) is not None

    @classmethod
    def version(cls) -> str:
        return importlib.metadata.version(cls.dist)

    @classmethod
    def fresh(cls, where: Path | Schemas, label: str) -> str:
        """A new, empty store: a path in the folder ``where``, or a schema of ``where``."""
        if isinstance(where, Schemas):
            return where.fresh(f"{cls.module}_{label}")
        path = where / f"store-{cls.module}-{label}.sqlite3"
        for leftover in where.glob(f"{path.name}*"):  # persist-queue keeps a folder there
            if leftover.is_dir():
                for inner in leftover.iterdir():
                    inner.unlink()
                leftover.rmdir()
            else:
                leftover.unlink()
        return str(path)

    def put(self, items: list[str]) -> None:
        raise NotImplementedError

    def take(self) -> tuple[Any, str | bytes] | None:
        raise NotImplementedError

    def get(self) -> tuple[Any, str] | None:
        taken = self.take()
        return None if taken is None else (taken[0], id_of(taken[1]))

    def ack(self, handle: Any) -> None:
        raise NotImplementedError

    def consume(self, n: int) -> list[str]:
        got: list[str] = []
        while len(got) < n and (taken := self.get()) is not None:
            self.ack(taken[0])
            got.append(taken[1])
        return got

    def open_effects(self, where: str) -> dict[str, str]:
        """Open the application's own database for ``work``; its durability, read back."""
        self.effects = SqliteEffects(where)
        return self.effects.pragmas()

    def work(self, n: int) -> list[str]:
        """Take, commit the effect (its own commit, idempotent by event id), ack;
        until ``n`` came or nothing is ready. The event ids in the order they came."""
        got: list[str] = []
        while len(got) < n and (taken := self.take()) is not None:
            event_id, effect = effect_of_item(taken[1])
            self.effects.commit(event_id, effect)
            self.ack(taken[0])
            got.append(event_id)
        return got

    def recover_stalled(self, seconds: float) -> None:
        """Hand out again what a consumer silent for ``seconds`` holds, where the
        library leaves that to its user (most recover on their own, in ``get``)."""

    def settled(self) -> tuple[int, int] | None:
        """(items acknowledged, items still stored unacknowledged), counted in the
        library's own tables; ``None`` where the benchmark does not count them."""
        return None

    def still_stored(self, event_id: str) -> bool:
        """Does the store still hold ``event_id`` anywhere (after a crash: held, not lost)?"""
        return sqlite_mentions(Path(self.path), event_id)

    def connection(self) -> Any:
        raise NotImplementedError

    def pragmas(self) -> dict[str, str]:
        conn = self.connection()
        mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
        sync = conn.execute("PRAGMA synchronous").fetchone()[0]
        return {"journal_mode": str(mode).upper(), "synchronous": SYNCHRONOUS.get(sync, str(sync))}

    def close(self) -> None:
        self.close_effects()
        self.connection().close()

    def close_effects(self) -> None:
        if self.effects is not None:
            self.effects.close()
            self.effects = None


def sqlite_mentions(path: Path, event_id: str) -> bool:
    """Does any row of any table of the SQLite file mention ``event_id``?
    (persist-queue keeps its file, ``data.db``, in a folder at ``path``.)"""
    db = path / "data.db" if path.is_dir() else path
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        tables = [row[0] for row in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")]
        for table in tables:
            columns = [row[1] for row in conn.execute(f'PRAGMA table_info("{table}")')]
            for column in columns:
                if conn.execute(f'SELECT count(*) FROM "{table}" '
                                f'WHERE CAST("{column}" AS TEXT) LIKE ?',
                                (f"%{event_id}%",)).fetchone()[0]:
                    return True
        return False
    finally:
        conn.close()
