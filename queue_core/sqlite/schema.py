"""The queue's SQLite schema: one text that encodes the state machine, and its settings."""

from __future__ import annotations

import sqlite3

from ..ids import COURSE, sql_check
from ..priority import CLAIM_ORDER, HIGHEST, LOWEST


SYNCHRONOUS_MODES = ("FULL", "NORMAL", "OFF")
# The queue's pages are small: a row is a few hundred bytes, and every commit
# appends each page it changed, whole, to the WAL before its fsync. An ACK that
# claims the next message changes four pages (its row and the next one's, the
# live index, the effect, the journal): 4 KB with 1 KB pages instead of 16 KB
# with SQLite's default 4 KB.
PAGE_SIZE = 1024
# SQLite checkpoints the WAL into the file once it holds 1000 pages: 4 MB of its
# default 4 KB pages, but only 1 MB of ours. A checkpoint costs two fsyncs and
# rewrites every page the WAL holds: keep the default's 4 MB between them.
CHECKPOINT_PAGES = 4 * 1024 * 1024 // PAGE_SIZE
BUSY_TIMEOUT_SECONDS = 30.0
# The endings of the files SQLite keeps beside a database file, after its name.
SIDE_FILES = ("-wal", "-shm", "-journal")
# A writer that finds the write lock taken asks again this often, and lets at most
# this many asks pass while the holder keeps committing (``connection.begin_immediate``).
LOCK_POLL_SECONDS = 0.001
LOCK_PATIENCE = 8
SCHEMA_VERSION = 4           # PRAGMA user_version of the schema below; ``migrations``
                             # upgrades a file of every earlier version to it
META_TABLE = "queue_meta"

# The state checks are written as OR chains, not ``IN ('ready', ...)``: for an
# IN list of more than two constants SQLite builds a temporary index each time
# a statement checks a row, which cost more than the rest of a journal INSERT.
_SCHEMA = """
CREATE TABLE messages (
    event_id     TEXT PRIMARY KEY
                 CONSTRAINT event_id_shape
                 CHECK ({id_check}),
    -- NULL once pruned (``retention``); its digest stays, and deduplicates forever.
    payload      TEXT CONSTRAINT payload_is_json CHECK (payload IS NULL OR json_valid(payload)),
    payload_sha256 BLOB NOT NULL
                 CONSTRAINT payload_sha256_shape CHECK (length(payload_sha256) = 32),
    state        TEXT NOT NULL DEFAULT 'ready'
                 CONSTRAINT state_valid CHECK (state = 'ready' OR state = 'leased'
                                               OR state = 'done' OR state = 'dead'),
    attempts     INTEGER NOT NULL DEFAULT 0 CONSTRAINT attempts_valid CHECK (attempts >= 0),
    generation   INTEGER NOT NULL DEFAULT 0
                 CONSTRAINT generation_counts_every_claim CHECK (generation >= attempts),
    available_at INTEGER NOT NULL,
    lease_until  INTEGER,
    last_error   TEXT,
    finished_at  INTEGER,
    {priority_column},
    CONSTRAINT lease_until_iff_leased CHECK ((state = 'leased') = (lease_until IS NOT NULL)),
    CONSTRAINT leased_was_claimed CHECK (state <> 'leased' OR attempts >= 1),
    CONSTRAINT dead_has_reason CHECK (state <> 'dead' OR last_error IS NOT NULL),
    CONSTRAINT finished_at_iff_done CHECK ((state = 'done') = (finished_at IS NOT NULL)),
    CONSTRAINT pruned_only_when_done CHECK (payload IS NOT NULL OR state = 'done')
) STRICT;

-- ONE index for every row the queue still moves or may prune: those that keep
-- their payload (a pruned row leaves it). Claims and recoveries read their
-- state's range of it (the ready rows in due order, the few leased rows), and
-- prune the oldest done rows; dead rows sit apart. A claim moves a row from the
-- head of the ready range to the end of the leased range just before it, an ACK
-- from there to the end of the done range just before that: the worker loop's
-- step changes one page of this index, where two indexes (ready, leased) changed
-- two. The queries name its condition (``payload IS NOT NULL``), so that the
-- database may use it.
-- The ready rows are in the claim's order (``priority.CLAIM_ORDER``: the due time
-- less the priority's head start), then by event id.
{live_index};

CREATE TABLE effects (
    event_id     TEXT PRIMARY KEY REFERENCES messages (event_id),
    category     TEXT NOT NULL CONSTRAINT category_named CHECK (length(category) > 0),
    amount_cents INTEGER NOT NULL
                 CONSTRAINT amount_in_range CHECK (amount_cents BETWEEN 1 AND 9999999)
) STRICT, WITHOUT ROWID;  -- the event id IS the key: one b-tree, one page per ACK

-- Journal of state changes, written in the same transaction as each change.
-- Append-only and read whole (plots, audits); no second index, so each
-- commit writes one journal page, not two. One event's history is a scan.
-- A sequence number is never reused: prune never deletes the journal's last
-- row (SQLite gives a new row the largest rowid plus one).
CREATE TABLE transitions (
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
    reason     TEXT NOT NULL,
    -- The state machine's edges, and no others, can be journalled. A CASE, not
    -- an OR of conditions: a comparison with NULL is NULL, and a CHECK that is
    -- NULL passes, so "from_state = 'ready' AND ..." would let NULL -> leased in.
    CONSTRAINT legal_edge CHECK (CASE
        WHEN from_state IS NULL THEN to_state = 'ready'                  -- enqueued
        WHEN from_state = 'ready' THEN to_state = 'leased'               -- claimed
        WHEN from_state = 'leased' THEN to_state = 'done' OR to_state = 'ready'
                                        OR to_state = 'dead'             -- ACK, fail, expiry
        WHEN from_state = 'dead' THEN to_state = 'ready'                 -- redrive
        ELSE FALSE END)
) STRICT;

-- What a pruned message's journal proved, kept in its place (``retention``):
-- enqueued once, claimed ``claims`` times (generations 1..claims, one by one),
-- redriven ``redrives`` times, completed once by its newest lease, with this
-- effect. The audit holds the message and its effect against it.
CREATE TABLE compacted (
    event_id     TEXT PRIMARY KEY REFERENCES messages (event_id),
    enqueued_at  INTEGER NOT NULL,
    claims       INTEGER NOT NULL CONSTRAINT claimed_at_least_once CHECK (claims >= 1),
    redrives     INTEGER NOT NULL CONSTRAINT redrives_counted CHECK (redrives >= 0),
    steps        INTEGER NOT NULL CONSTRAINT steps_counted CHECK (steps >= claims + 2),
    category     TEXT NOT NULL,
    amount_cents INTEGER NOT NULL
) STRICT, WITHOUT ROWID;

-- What the queue was created with, one row that nothing changes (``ids``): the
-- rule its event ids follow, which the CHECK on ``messages.event_id`` enforces.
CREATE TABLE {meta} (
    id_rule      TEXT NOT NULL
                 CONSTRAINT id_rule_known CHECK (id_rule = 'course' OR id_rule = 'general')
) STRICT;
INSERT INTO {meta} (id_rule) VALUES ('{rule}');
"""


# Schema 4's column: the message's priority (``priority``), a head start in the
# claim's order; 0, the default, is every message's before priorities. Added to
# an earlier file by ``ALTER TABLE ... ADD COLUMN`` (migration step 4), which
# rewrites no row: SQLite reads the default for a row stored without it.
PRIORITY_COLUMN = ("priority     INTEGER NOT NULL DEFAULT 0 CONSTRAINT priority_range "
                   f"CHECK (priority BETWEEN {LOWEST} AND {HIGHEST})")
# Schema 2 and 3's live index, and schema 4's in its place, in the claim's order.
LIVE_INDEX_2 = ("CREATE INDEX messages_live ON messages (state, available_at, event_id, "
                "lease_until, finished_at) WHERE payload IS NOT NULL")
# The claim reads each candidate's row anyway (for its priority, and to change
# it), so ``available_at`` is not repeated here: an entry is as long as before.
LIVE_INDEX = (f"CREATE INDEX messages_live ON messages (state, {CLAIM_ORDER}, event_id, "
              "lease_until, finished_at) WHERE payload IS NOT NULL")


def schema(ids: str = COURSE) -> str:
    """The schema text of a new queue file whose event ids follow the rule ``ids``."""
    return _SCHEMA.format(id_check=sql_check(ids, "sqlite"), meta=META_TABLE, rule=ids,
                          priority_column=PRIORITY_COLUMN, live_index=LIVE_INDEX)


SCHEMA = schema(COURSE)  # the course's, the default




def statements(script: str) -> list[str]:
    """Split the schema into statements (``executescript`` would COMMIT first)."""
    statements, current = [], ""
    for line in script.splitlines(keepends=True):
        current += line
        if sqlite3.complete_statement(current):
            statements.append(current.strip())
            current = ""
    return statements
