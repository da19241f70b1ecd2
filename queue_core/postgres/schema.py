"""The queue's schema on PostgreSQL: the SQLite schema's meaning in PostgreSQL's words.

Tables, constraints, indexes and the mark of the current schema version
(``SCHEMA_VERSION``), as ``PostgresStore.prepare`` creates them; the texts
of earlier versions' indexes stay here because a migration step
(``migrations``) builds them. The worker's step, a function of the schema,
is ``step``.
"""

from __future__ import annotations

from ..ids import COURSE, sql_check
from ..marks import APPLICATION_ID
from ..priority import CLAIM_ORDER, HIGHEST, LOWEST
from ..transitions import EXPIRED, LIVE

# The schema version a PostgreSQL queue has: 2 as SQLite's, the worker's step as
# a function of the schema (3), and that step holding the stored payload to the
# digest kept from enqueue on (4), and the rule its event ids follow recorded in
# the meta row (5, as SQLite's 3), and a message's priority with the live index in
# the claim's order (6, as SQLite's 4), and the step claiming its next message
# with a constant LIMIT, so the server plans it once per session, and the journal
# indexed by event for prune (7: ``step.NEXT_ONLY``, ``JOURNAL_INDEX``). Each store
# counts its own versions: a SQLite file has no use for a server-side function,
# and is not rewritten for one.
# ``migrations`` upgrades a schema of every earlier version to it.
SCHEMA_VERSION = 7

META_TABLE = "queue_core_meta"

# The index and the table that schema version 2 added (``migrations`` adds them
# to a version-1 schema), as in the SQLite schema.
LIVE_INDEX = ("CREATE INDEX messages_live ON messages "
              "(state, available_at, event_id, lease_until, finished_at) "
              "WHERE payload IS NOT NULL")
# Schema 3's two indexes in its place. An UPDATE here writes a new version of the
# row and new index entries; the entries of the old version stay until VACUUM, or
# until an index scan that reaches them finds the version dead and marks them.
# In ``messages_live`` the leased entries sat in due order, so the claim's read
# of expired leases walked every leased entry since the last VACUUM, the dead
# ones of every finished message included, and visited the heap for each whose
# deadline had passed: a claim grew slower with every message done. Leases now
# have an index of their own, in deadline order, and that read starts at the
# earliest deadline still held (``EXPIRED_READ``): the dead entries before it are
# marked once and passed over after, the live ones after now never reached.
# ``messages_live`` keeps the ready
# rows in due order and the done rows for retention; a claim writes an entry into
# ``messages_leased`` instead, so a message still writes two index entries per
# change of state.
LIVE_INDEX_3 = ("CREATE INDEX messages_live ON messages (state, available_at, event_id, "
                "finished_at) WHERE payload IS NOT NULL AND state <> 'leased'")
# Schema 6's in its place: the ready rows in the claim's order (``priority``:
# the due time less the priority's head start), then by event id, with
# ``available_at`` for the claim's "is it due" and ``finished_at`` for prune.
# The claim visits each candidate's row anyway, to lock it, but ``available_at``
# is kept here for the planner: where it was read from the row alone, a table
# not analyzed yet (a new queue; a VACUUM alone) with few ready rows got a plan
# that fetched every ready row and sorted them for a claim of one (bitmap heap
# scan and sort), on a generic plan too; with it, both bounds of the due read
# are the index's, and the claim walks it in order on every plan
# (``tests/test_postgres_plans.py``). 8 bytes more per entry.
LIVE_INDEX_6 = (f"CREATE INDEX messages_live ON messages (state, ({CLAIM_ORDER}), event_id, "
                "available_at, finished_at) WHERE payload IS NOT NULL AND state <> 'leased'")
LEASED_INDEX = ("CREATE INDEX messages_leased ON messages (lease_until) "
                "WHERE state = 'leased' AND payload IS NOT NULL")
# The claim's read of expired leases (``transitions.EXPIRED``), from the earliest
# deadline of a lease still held. ``min`` is read by an ordered scan of
# ``messages_leased`` from its first entry, which marks each dead entry it passes
# (a finished message's old lease) so that no later scan visits that version
# again, and stops at the first live one; the read itself then covers only the
# deadlines from there to now, which is no entry at all while every lease held
# is still running.
EXPIRED_READ = (f"{EXPIRED} AND lease_until >= (SELECT min(lease_until) FROM messages "
                f"WHERE state = 'leased' AND {LIVE})")
# The journal by event (schema 7): prune reads the rows of the messages it prunes
# by it. Without it, prune walked the journal from its oldest row and passed every
# row of every message still queued: behind the backlog of a million-event queue,
# each prune of 500 messages read a few hundred thousand rows, and prune took about
# as much of the server's and its own CPU as the workers' steps did (make scale). Two
# index entries more per worker step (its ACK's row and its claim's): within the
# step's noise here. SQLite has none (``SqliteStore.journal_by_event``).
JOURNAL_INDEX = "CREATE INDEX transitions_event ON transitions (event_id)"
COMPACTED_TABLE = """CREATE TABLE compacted (
    event_id     text PRIMARY KEY REFERENCES messages (event_id),
    enqueued_at  bigint NOT NULL,
    claims       bigint NOT NULL CONSTRAINT claimed_at_least_once CHECK (claims >= 1),
    redrives     bigint NOT NULL CONSTRAINT redrives_counted CHECK (redrives >= 0),
    steps        bigint NOT NULL CONSTRAINT steps_counted CHECK (steps >= claims + 2),
    category     text NOT NULL,
    amount_cents bigint NOT NULL
)"""

# The meta row's column that says which rule a queue's event ids follow (``ids``),
# chosen when it is created; schema 5 adds it, every earlier queue a course queue.
# A constant default: adding the column rewrites no row (PostgreSQL 11 and later).
# Schema 6's column: a message's priority (``priority``), 0 for every message
# stored before; a constant default, so adding it rewrites no row.
PRIORITY_COLUMN = ("priority integer NOT NULL DEFAULT 0 CONSTRAINT priority_range "
                   f"CHECK (priority BETWEEN {LOWEST} AND {HIGHEST})")
ID_RULE_COLUMN = ("id_rule text NOT NULL DEFAULT 'course' CONSTRAINT id_rule_known "
                  "CHECK (id_rule IN ('course', 'general'))")

# How autovacuum treats ``messages``: storage parameters of the table itself.
# No UPDATE of a message is HOT (each changes an indexed column or the partial
# indexes' condition), so every claim leaves its old version's entry at the head
# of ``messages_live``'s ready range, where the next claim's read starts; an index
# scan marks such an entry dead but still reads its page, and only a vacuum
# removes it. By default autovacuum waits until a fifth of a table is dead, and
# this table keeps every message's key for ever (prune drops only the payload and
# the journal), so that wait, and the claim's read with it, would grow with every
# message ever processed. Here:
# - a vacuum once 1,000 row versions are dead (a few hundred messages done: its
#   claim, its ACK and its prune each leave one), whatever the table's size;
# - no cost-based pauses: the claims read what is left until the vacuum ends;
# - the index pass always: PostgreSQL 14 and later skip it when fewer than 2 % of
#   the heap's pages hold dead items (``vacuum_index_cleanup = auto``), which a
#   small threshold on a large table meets, and would leave exactly the entries
#   the claim reads.
# Inserts alone leave no dead entry, so the insert-triggered vacuum keeps the
# server's defaults. How often autovacuum looks at any table is the server's
# ``autovacuum_naptime`` (a minute by default), which no table can shorten:
# between two rounds the claim's read still grows with the messages processed
# (README, "Where the guarantee ends"). Other PostgreSQL queues offer the same
# tuning as an option, on tables that delete finished jobs: PgQueuer's
# ``pgq autovac`` (threshold 1,000, scale factor 0.01, no cost delay), the pgmq
# Ruby client's ``tune_autovacuum`` (threshold 50, scale factor 0.01); this
# table keeps its rows, so no scale factor at all. The failure it holds off:
# Brandur Leach, "Postgres Job Queues & Failure By MVCC" (brandur.org/postgres-queues).
MESSAGES_VACUUM = ("autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000, "
                   "autovacuum_vacuum_cost_delay = 0, vacuum_index_cleanup = on")

# The SQLite schema's meaning, constraint for constraint, in PostgreSQL's words.
_SCHEMA = f"""
CREATE TABLE messages (
    event_id     text PRIMARY KEY
                 CONSTRAINT event_id_shape CHECK ({{id_check}}),
    payload      text CONSTRAINT payload_is_json
                 CHECK (payload IS NULL OR payload::json IS NOT NULL),
    payload_sha256 bytea NOT NULL
                 CONSTRAINT payload_sha256_shape CHECK (length(payload_sha256) = 32),
    state        text NOT NULL DEFAULT 'ready'
                 CONSTRAINT state_valid CHECK (state IN ('ready', 'leased', 'done', 'dead')),
    attempts     bigint NOT NULL DEFAULT 0 CONSTRAINT attempts_valid CHECK (attempts >= 0),
    generation   bigint NOT NULL DEFAULT 0
                 CONSTRAINT generation_counts_every_claim CHECK (generation >= attempts),
    available_at bigint NOT NULL,
    lease_until  bigint,
    last_error   text,
    finished_at  bigint,
    {PRIORITY_COLUMN},
    CONSTRAINT lease_until_iff_leased CHECK ((state = 'leased') = (lease_until IS NOT NULL)),
    CONSTRAINT leased_was_claimed CHECK (state <> 'leased' OR attempts >= 1),
    CONSTRAINT dead_has_reason CHECK (state <> 'dead' OR last_error IS NOT NULL),
    CONSTRAINT finished_at_iff_done CHECK ((state = 'done') = (finished_at IS NOT NULL)),
    CONSTRAINT pruned_only_when_done CHECK (payload IS NOT NULL OR state = 'done')
) WITH ({MESSAGES_VACUUM});
{LIVE_INDEX_6};
{LEASED_INDEX};
CREATE TABLE effects (
    event_id     text PRIMARY KEY REFERENCES messages (event_id),
    category     text NOT NULL CONSTRAINT category_named CHECK (length(category) > 0),
    amount_cents bigint NOT NULL
                 CONSTRAINT amount_in_range CHECK (amount_cents BETWEEN 1 AND 9999999)
);
CREATE TABLE transitions (
    seq        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at         bigint NOT NULL,
    event_id   text NOT NULL REFERENCES messages (event_id),
    from_state text CONSTRAINT from_valid
               CHECK (from_state IN ('ready', 'leased', 'done', 'dead')),
    to_state   text NOT NULL
               CONSTRAINT to_valid CHECK (to_state IN ('ready', 'leased', 'done', 'dead')),
    generation bigint NOT NULL,
    attempts   bigint NOT NULL,
    reason     text NOT NULL,
    CONSTRAINT legal_edge CHECK (CASE
        WHEN from_state IS NULL THEN to_state = 'ready'
        WHEN from_state = 'ready' THEN to_state = 'leased'
        WHEN from_state = 'leased' THEN to_state IN ('done', 'ready', 'dead')
        WHEN from_state = 'dead' THEN to_state = 'ready'
        ELSE FALSE END)
);
{JOURNAL_INDEX};
{COMPACTED_TABLE};
CREATE TABLE {META_TABLE} (
    application_id bigint NOT NULL,
    schema_version integer NOT NULL,
    {ID_RULE_COLUMN}
);
INSERT INTO {META_TABLE} (application_id, schema_version, id_rule)
    VALUES ({APPLICATION_ID}, {SCHEMA_VERSION}, '{{rule}}')
"""


def schema(ids: str = COURSE) -> str:
    """The schema text of a new queue whose event ids follow the rule ``ids``."""
    return _SCHEMA.format(id_check=sql_check(ids, "postgresql"), rule=ids)


SCHEMA = schema(COURSE)  # the course's, the default

_TABLES_HERE = ("SELECT tablename FROM pg_tables WHERE schemaname = current_schema() "
                "ORDER BY tablename")
