"""Schema 2 -> 3 of a SQLite queue file: the rule its event ids follow, recorded.

A queue now chooses, when it is created, the rule its event ids follow
(``ids``): the course's ``E`` and four digits, or the general rule of real
sources. A file of version 2 was made when only the course's rule existed,
and its ``messages`` CHECK says so: it becomes a ``course`` queue. The step
adds the one-row ``queue_meta`` table that says which rule a queue has, as
a new file gets it; no message, effect or journal row is rewritten, and the
CHECK is left as it is.
"""

from __future__ import annotations

import sqlite3

from ...ids import COURSE
from ..schema import META_TABLE, schema, statements

# The table and its row, as a new course queue gets them.
_META = [statement for statement in statements(schema(COURSE))
         if f"CREATE TABLE {META_TABLE} (" in statement or f"INSERT INTO {META_TABLE} " in statement]


def step(conn: sqlite3.Connection) -> int:
    for statement in _META:
        conn.execute(statement)
    return 0
