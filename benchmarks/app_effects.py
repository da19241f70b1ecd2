"""The application's own database, where a peer's consumer commits each message's effect.

A peer queue hands out a message; what the message means (a paid order:
its category and amount) is the application's business, written to the
application's own database by the consumer, as that library's users
would: an ``effects`` table keyed by the event id, one INSERT per message
in its own commit, ``ON CONFLICT (event_id) DO NOTHING`` so that a message
delivered again adds nothing (idempotence by the effect's key). The effect
is computed by the course's ``Handler`` from the payload the queue handed
out, as ours computes it from the payload it stored.

``SqliteEffects`` is a SQLite file of the application's own, in WAL mode
at ``synchronous=FULL``: every effect's commit waits for its fsync, as
every commit of ours that a caller relies on does. ``PgEffects`` is a
table in the same PostgreSQL database as the peer's queue (its schema, on
the benchmark's server), written by the consumer on a connection of its
own, each INSERT its own transaction, at ``synchronous_commit = on``.

``rows`` reads a store back, and ``check`` compares it with what the
slices put: one effect per event, its category and amount exact.
"""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if str(ROOT) not in sys.path:  # run from a checkout: the package sits next to us
    sys.path.insert(0, str(ROOT))

from bench_cases import CATEGORIES, amount_of  # noqa: E402

from queue_core import Handler  # noqa: E402
from queue_core.sqlite import is_connection_string  # noqa: E402
from queue_core.values import Effect  # noqa: E402

SYNCHRONOUS = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}
INSERT = ("INSERT INTO effects (event_id, category, amount_cents) VALUES ({0}, {0}, {0}) "
          "ON CONFLICT (event_id) DO NOTHING")
HANDLER = Handler()


def effect_of_item(item: str | bytes) -> tuple[str, Effect]:
    """The event id of an item as it was put, and its effect by the course's handler."""
    event = json.loads(item)
    return str(event["event_id"]), HANDLER.effect_of(event["payload"])


class SqliteEffects:
    """The application's own SQLite file: WAL, ``synchronous=FULL``, one commit per effect."""

    def __init__(self, path: Path | str) -> None:
        self.path = str(path)
        self.conn = sqlite3.connect(self.path, isolation_level=None, timeout=30)
        self.conn.execute("PRAGMA journal_mode = WAL")
        self.conn.execute("PRAGMA synchronous = FULL")
        self.conn.execute("CREATE TABLE IF NOT EXISTS effects (event_id TEXT PRIMARY KEY, "
                          "category TEXT NOT NULL, amount_cents INTEGER NOT NULL) "
                          "STRICT, WITHOUT ROWID")
        self.sql = INSERT.format("?")

    def commit(self, event_id: str, effect: Effect) -> bool:
        """Write the effect in its own commit (autocommit: one statement, one
        transaction); ``False`` where the event's effect was already there."""
        cursor = self.conn.execute(self.sql, (event_id, effect.category, effect.amount_cents))
        return cursor.rowcount == 1

    def pragmas(self) -> dict[str, str]:
        mode = self.conn.execute("PRAGMA journal_mode").fetchone()[0]
        sync = self.conn.execute("PRAGMA synchronous").fetchone()[0]
        return {"journal_mode": str(mode).upper(), "synchronous": SYNCHRONOUS.get(sync, str(sync))}

    def close(self) -> None:
        self.conn.close()


class PgEffects:
    """An effects table in the peer's PostgreSQL schema, on a connection of the
    consumer's own (asyncio, as the peers are); each INSERT its own commit."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.conn: Any = None
        self.sql = INSERT.format("%s")

    async def open(self) -> None:
        import psycopg

        self.conn = await psycopg.AsyncConnection.connect(self.dsn, autocommit=True)
        await self.conn.execute("SET synchronous_commit = on")
        await self.conn.execute("CREATE TABLE IF NOT EXISTS effects (event_id text PRIMARY KEY, "
                                "category text NOT NULL, amount_cents integer NOT NULL)")

    async def commit(self, event_id: str, effect: Effect) -> bool:
        cursor = await self.conn.execute(self.sql, (event_id, effect.category,
                                                    effect.amount_cents))
        return bool(cursor.rowcount == 1)

    async def pragmas(self) -> dict[str, str]:
        cursor = await self.conn.execute(
            "SELECT c.relpersistence, current_setting('synchronous_commit') FROM pg_class c "
            "WHERE c.relname = 'effects' AND c.relnamespace = current_schema()::regnamespace")
        persistence, sync = await cursor.fetchone()
        kinds = {"p": "LOGGED", "u": "UNLOGGED", "t": "TEMP"}
        return {"journal_mode": kinds.get(persistence, persistence), "synchronous": str(sync)}

    async def close(self) -> None:
        await self.conn.close()


def rows(where: str) -> list[tuple[str, str, int]]:
    """Every effect of a store (a SQLite path or a ``postgresql://`` string), by event id,
    read on a connection of its own."""
    sql = "SELECT event_id, category, amount_cents FROM effects ORDER BY event_id"
    if is_connection_string(where):
        import psycopg

        with psycopg.connect(where) as conn:
            return [tuple(row) for row in conn.execute(sql).fetchall()]  # type: ignore[misc]
    conn = sqlite3.connect(f"file:{where}?mode=ro", uri=True)
    try:
        return [tuple(row) for row in conn.execute(sql).fetchall()]
    finally:
        conn.close()


def expected(n: int) -> list[tuple[str, str, int]]:
    """The effects of items 0 .. n - 1 (``peer_base.item_of``), by event id."""
    return [(f"E{i:04d}", CATEGORIES[i % 3], amount_of(i)) for i in range(n)]


def check(found: list[tuple[str, str, int]], n: int) -> str | None:
    """``None`` if ``found`` is one effect per item put, each exact; else what is wrong."""
    wanted = expected(n)
    if found == wanted:
        return None
    ids = [row[0] for row in found]
    money = sum(row[2] for row in found)
    wrong = sorted(set(found) - set(wanted))[:3]
    return (f"{len(found)} effects ({len(set(ids))} distinct events, {money} cents) where "
            f"{n} items put ask {n} ({sum(row[2] for row in wanted)} cents)"
            + (f"; not as put: {wrong}" if wrong else ""))
