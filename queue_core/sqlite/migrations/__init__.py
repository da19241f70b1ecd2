"""The steps that upgrade a SQLite queue file's schema, one module per version, and their runner.

``vNNNN.step(conn)`` takes a file of version NNNN - 1 to NNNN inside the
runner's transaction and returns how many messages it rewrote. ``STEPS`` is
the only list of them; ``migrate_step`` runs one in ONE transaction, the
version read again inside it under the write lock. A new schema version is
a new module here, added to ``STEPS``, and the new text in ``schema``.
"""

from __future__ import annotations

import os
import sqlite3
from typing import Callable

from ...crashpoints import crash_point
from ...errors import UnusableFile
from ..connection import connect, transaction
from . import v0002, v0003, v0004

# version -> the step that upgrades a file of that version to the next one
STEPS: dict[int, Callable[[sqlite3.Connection], int]] = {1: v0002.step, 2: v0003.step,
                                                          3: v0004.step}


def migrate_step(path: str | os.PathLike[str], version: int) -> int | None:
    """Upgrade the queue file ``path`` from schema ``version`` to the next, in ONE
    transaction; return how many messages it rewrote, or ``None`` if the file
    was no longer at ``version`` once the write lock was taken (another
    migrator was first: nothing is done twice).

    The version is read again inside the transaction, under the write lock;
    the step and the new ``user_version`` commit together, so a crash leaves
    the old version intact or the new one complete. Foreign keys are off for
    the step's connection, as a table rebuild needs (``DROP TABLE`` would
    otherwise check every effect and journal row against a table being
    replaced), and ``foreign_key_check`` must find nothing before the commit.
    """
    conn = connect(path)
    try:
        conn.execute("PRAGMA foreign_keys = OFF")  # only outside a transaction
        with transaction(conn):
            crash_point("migrate.after_begin")
            if conn.execute("PRAGMA user_version").fetchone()[0] != version:
                return None
            rows = STEPS[version](conn)
            crash_point("migrate.after_copy")
            broken = conn.execute("PRAGMA foreign_key_check").fetchall()
            if broken:
                raise UnusableFile("migration_failed", f"{os.fspath(path)}: after the step to "
                                   f"schema {version + 1}, {len(broken)} rows point at no "
                                   "message; nothing was changed")
            conn.execute(f"PRAGMA user_version = {version + 1}")
            crash_point("migrate.before_commit")
        crash_point("migrate.after_commit")
        return rows
    finally:
        conn.close()
