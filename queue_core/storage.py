"""The SQLite file: one schema text that encodes the state machine, the
connection settings, and the single write-transaction helper.

Every request opens its own connection and closes it in ``finally`` (a
``with`` block on a ``sqlite3.Connection`` commits or rolls back but does
NOT close it). A request is one call, or a whole worker session (see
``Queue.session``), whose transactions then share one connection. Nothing
else in the package says ``BEGIN``.
"""

from __future__ import annotations

import os
import sqlite3
from types import TracebackType

SYNCHRONOUS_MODES = ("FULL", "NORMAL", "OFF")
BUSY_TIMEOUT_SECONDS = 30.0

# The state checks are written as OR chains, not ``IN ('ready', ...)``: for an
# IN list of more than two constants SQLite builds a temporary index each time
# a statement checks a row, which cost more than the rest of a journal INSERT.
SCHEMA = """
CREATE TABLE IF NOT EXISTS messages (
    event_id     TEXT PRIMARY KEY
                 CONSTRAINT event_id_shape
                 CHECK (length(event_id) = 5 AND event_id GLOB 'E[0-9][0-9][0-9][0-9]'),
    payload      TEXT NOT NULL CONSTRAINT payload_is_json CHECK (json_valid(payload)),
    state        TEXT NOT NULL DEFAULT 'ready'
                 CONSTRAINT state_valid CHECK (state = 'ready' OR state = 'leased'
                                               OR state = 'done' OR state = 'dead'),
    attempts     INTEGER NOT NULL DEFAULT 0 CONSTRAINT attempts_valid CHECK (attempts >= 0),
    generation   INTEGER NOT NULL DEFAULT 0
                 CONSTRAINT generation_counts_every_claim CHECK (generation >= attempts),
    available_at INTEGER NOT NULL,
    lease_until  INTEGER,
    last_error   TEXT,
    CONSTRAINT lease_until_iff_leased CHECK ((state = 'leased') = (lease_until IS NOT NULL)),
    CONSTRAINT leased_was_claimed CHECK (state <> 'leased' OR attempts >= 1),
    CONSTRAINT dead_has_reason CHECK (state <> 'dead' OR last_error IS NOT NULL)
) STRICT;

-- Claim reads only these rows, in this order: done rows never slow it down.
CREATE INDEX IF NOT EXISTS messages_ready
    ON messages (available_at, event_id) WHERE state = 'ready';
CREATE INDEX IF NOT EXISTS messages_leased
    ON messages (lease_until) WHERE state = 'leased';

CREATE TABLE IF NOT EXISTS effects (
    event_id     TEXT PRIMARY KEY REFERENCES messages (event_id),
    category     TEXT NOT NULL CONSTRAINT category_named CHECK (length(category) > 0),
    amount_cents INTEGER NOT NULL
                 CONSTRAINT amount_in_range CHECK (amount_cents BETWEEN 1 AND 9999999)
) STRICT, WITHOUT ROWID;  -- the event id IS the key: one b-tree, one page per ACK

-- Journal of state changes, written in the same transaction as each change.
-- Append-only and read whole (plots, audits); no second index, so each
-- commit writes one journal page, not two. One event's history is a scan.
CREATE TABLE IF NOT EXISTS transitions (
    seq        INTEGER PRIMARY KEY,
    at         INTEGER NOT NULL,
    event_id   TEXT NOT NULL REFERENCES messages (event_id),
    from_state TEXT CONSTRAINT from_valid
               CHECK (from_state IS NULL OR from_state = 'ready' OR from_state = 'leased'
                      OR from_state = 'done' OR from_state = 'dead'),
    to_state   TEXT NOT NULL
               CONSTRAINT to_valid CHECK (to_state = 'ready' OR to_state = 'leased'
                                          OR to_state = 'done' OR to_state = 'dead'),
    generation INTEGER NOT NULL,
    attempts   INTEGER NOT NULL,
    reason     TEXT NOT NULL
) STRICT;
"""


# The claim's two reads, named so that tests can EXPLAIN exactly the text that
# runs: each must walk its partial index (messages_ready, messages_leased) in
# order, so the cost of a claim does not grow with the done rows kept forever.
CLAIM_SELECT = ("SELECT event_id FROM messages WHERE state = 'ready' AND available_at <= ? "
                "ORDER BY available_at, event_id LIMIT ?")
EXPIRED_SELECT = ("SELECT event_id, attempts, generation FROM messages "
                  "WHERE state = 'leased' AND lease_until <= ?")


def connect(path: str | os.PathLike[str], *, synchronous: str = "FULL") -> sqlite3.Connection:
    """Open a connection in manual-transaction mode with the protocol's pragmas."""
    conn = sqlite3.connect(os.fspath(path), timeout=BUSY_TIMEOUT_SECONDS,
                           isolation_level=None)
    try:
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute(f"PRAGMA synchronous = {synchronous}")
    except BaseException:
        conn.close()
        raise
    return conn


class transaction:  # noqa: N801 - used like a function: ``with transaction(conn):``
    """Run the body inside ``BEGIN IMMEDIATE``: commit on success, roll back on
    any exception (``BaseException`` included, so an interrupt or an encoding
    error never leaves the transaction open).

    ``IMMEDIATE`` takes the write lock before the first read, so choosing a
    row and changing it cannot interleave with another writer.

    A class rather than a ``@contextmanager`` generator: a worker enters it
    twice per message, and the generator machinery cost more CPU than the
    statements it wraps.
    """

    __slots__ = ("conn",)

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def __enter__(self) -> sqlite3.Connection:
        self.conn.execute("BEGIN IMMEDIATE")
        return self.conn

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        if exc_type is None:
            self.conn.commit()
        else:
            self.conn.rollback()  # the exception propagates: __exit__ returns None


def create_schema(path: str | os.PathLike[str]) -> None:
    """Create the tables and indexes if absent, and switch the file to WAL."""
    conn = connect(path)
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.executescript(f"BEGIN IMMEDIATE;\n{SCHEMA}\nCOMMIT;")
    except BaseException:
        if conn.in_transaction:
            conn.rollback()
        raise
    finally:
        conn.close()
