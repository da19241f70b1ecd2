"""Schema 1 -> 2 on PostgreSQL: the same meaning as SQLite's rebuild, in place
(DDL is transactional here). One UPDATE rewrites each row once; the finish
time of a done message is its last journalled ``done`` step (or, for a row
edited by hand that has none, the time it became available).
"""

from __future__ import annotations

from ..schema import COMPACTED_TABLE, LIVE_INDEX

REWRITES_MESSAGES = True  # one UPDATE rewrites every message
STATEMENTS = (
    "ALTER TABLE messages ADD COLUMN payload_sha256 bytea, ADD COLUMN finished_at bigint, "
    "ALTER COLUMN payload DROP NOT NULL, DROP CONSTRAINT payload_is_json",
    "UPDATE messages AS m SET payload_sha256 = sha256(convert_to(m.payload, 'UTF8')), "
    "finished_at = CASE WHEN m.state = 'done' THEN coalesce(f.at, m.available_at) END "
    "FROM messages AS o LEFT JOIN (SELECT event_id, max(at) AS at FROM transitions "
    "WHERE to_state = 'done' GROUP BY event_id) AS f ON f.event_id = o.event_id "
    "WHERE o.event_id = m.event_id",
    "ALTER TABLE messages ALTER COLUMN payload_sha256 SET NOT NULL, "
    "ADD CONSTRAINT payload_is_json CHECK (payload IS NULL OR payload::json IS NOT NULL), "
    "ADD CONSTRAINT payload_sha256_shape CHECK (length(payload_sha256) = 32), "
    "ADD CONSTRAINT finished_at_iff_done CHECK ((state = 'done') = (finished_at IS NOT NULL)), "
    "ADD CONSTRAINT pruned_only_when_done CHECK (payload IS NOT NULL OR state = 'done')",
    "DROP INDEX messages_ready",
    "DROP INDEX messages_leased",
    LIVE_INDEX,
    COMPACTED_TABLE,
)
