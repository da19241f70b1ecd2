"""Schema 1 -> 2 of a SQLite queue file: ``messages`` rebuilt with the digest and the finish time.

The digest of each payload (``payload_sha256``), which deduplicates forever
once a payload is pruned, and the time a done message finished
(``finished_at``), from which retention counts its age; the payload may be
NULL (pruned); the live index and the ``compacted`` table added.
"""

from __future__ import annotations

import hashlib
import sqlite3

from ..schema import LIVE_INDEX_2, PRIORITY_COLUMN, SCHEMA, statements

# Schema 1 -> 2: ``messages`` as schema 2 has it (the course's ids; the priority
# column came with schema 4, ``v0004``). SQLite cannot drop a column's NOT NULL
# or add a NOT NULL column without a default in place, so ``messages`` is
# rebuilt: a new table, filled from the old one, renamed into its place (the
# steps of "Making Other Kinds Of Table Schema Changes" in SQLite's ALTER TABLE
# page). The other tables keep their rows; their foreign keys name
# ``messages``, which they find again once the rename is done.
_MESSAGES_V2 = next(statement for statement in statements(SCHEMA)
                    if "CREATE TABLE messages (" in statement
                    ).replace(f"    {PRIORITY_COLUMN},\n", "", 1)
assert "priority" not in _MESSAGES_V2
_REBUILD_MESSAGES_V2 = (
    _MESSAGES_V2.replace("CREATE TABLE messages (", "CREATE TABLE messages_v2 (", 1),
    # A done message finished when its last ``done`` step was journalled; a
    # done message with no such step (a file edited by hand: the audit says
    # so) is given the time it became available, so the copy never fails.
    "INSERT INTO messages_v2 (event_id, payload, payload_sha256, state, attempts, generation, "
    "available_at, lease_until, last_error, finished_at) "
    "SELECT m.event_id, m.payload, queue_sha256(m.payload), m.state, m.attempts, m.generation, "
    "m.available_at, m.lease_until, m.last_error, "
    "CASE WHEN m.state = 'done' THEN coalesce(f.at, m.available_at) END "
    "FROM messages AS m LEFT JOIN (SELECT event_id, max(at) AS at FROM transitions "
    "WHERE to_state = 'done' GROUP BY event_id) AS f ON f.event_id = m.event_id",
    "DROP TABLE messages",
    "ALTER TABLE messages_v2 RENAME TO messages",
    LIVE_INDEX_2,
    *(statement for statement in statements(SCHEMA) if "CREATE TABLE compacted" in statement),
)


def step(conn: sqlite3.Connection) -> int:
    conn.create_function("queue_sha256", 1, _sha256_of_text, deterministic=True)
    rows = conn.execute("SELECT count(*) FROM messages").fetchone()[0]
    for statement in _REBUILD_MESSAGES_V2:
        conn.execute(statement)
    return int(rows)


def _sha256_of_text(text: str | None) -> bytes | None:
    return None if text is None else hashlib.sha256(text.encode("utf-8")).digest()
