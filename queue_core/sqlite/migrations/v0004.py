"""Schema 3 -> 4 of a SQLite queue file: a message's priority, and the live index in the
claim's order.

A message now has a priority (``priority``), a head start in the claim's
order. The column is added with its constant default, 0, which SQLite reads
for every row stored before it: no message, effect or journal row is
rewritten, and every stored message keeps the place in the order it had.
The live index is built again with the claim's order as its second column
(``schema.LIVE_INDEX``; the old one, ``LIVE_INDEX_2``, ordered by
``available_at`` alone): one pass over the rows that keep their payload.
"""

from __future__ import annotations

import sqlite3

from ..schema import LIVE_INDEX, PRIORITY_COLUMN

STATEMENTS = (f"ALTER TABLE messages ADD COLUMN {PRIORITY_COLUMN}",
              "DROP INDEX messages_live",
              LIVE_INDEX)


def step(conn: sqlite3.Connection) -> int:
    for statement in STATEMENTS:
        conn.execute(statement)
    return 0
