"""Schema 5 -> 6: a message's priority, the live index in the claim's order, and the step's
function claiming in that order.

A message now has a priority (``priority``), a head start in the claim's
order. The column is added with a constant default, 0, which PostgreSQL (11
and later) records in the catalogue instead of rewriting each row; its CHECK
is verified by one read of the table. ``messages_live`` is built again with
the claim's order as its second column (``LIVE_INDEX_6``, one pass over the
rows that keep their payload), and the step's function replaced by one that
claims in that order. ``messages`` gets the storage parameters a new queue's
table has (``MESSAGES_VACUUM``): autovacuum vacuums it once 1,000 row versions
are dead, not a fifth of the table, and always cleans its indexes, so that the
dead entries each claim leaves at the head of the ready range no longer wait
longer the more messages the queue has ever held (they are entries in the
catalogue: no row is read for them). The statements hold the table's lock
until the commit (``MIGRATION_LOCK_TIMEOUT`` bounds the wait for it). A worker
of the earlier engine running when it commits goes on: its own claim still
reads due messages in ``available_at`` order (the server now sorts the ready
rows for it, which costs more, and it ignores a priority, never misreads one),
and its step calls the new function from its next step on, with the same
arguments and rows.
"""

from __future__ import annotations

from ..schema import LIVE_INDEX_6, MESSAGES_VACUUM, PRIORITY_COLUMN
from ..step import _step_function

REWRITES_MESSAGES = False
STATEMENTS = (f"ALTER TABLE messages ADD COLUMN {PRIORITY_COLUMN}",
              "DROP INDEX messages_live",
              LIVE_INDEX_6,
              f"ALTER TABLE messages SET ({MESSAGES_VACUUM})",
              _step_function(6).replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1))
