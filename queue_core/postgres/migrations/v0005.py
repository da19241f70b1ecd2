"""Schema 4 -> 5: the rule a queue's event ids follow, recorded in its meta row.

A queue now chooses, when it is created, the rule its event ids follow
(``ids``): the course's ``E`` and four digits, or the general rule of real
sources. A schema of version 4 was made when only the course's rule existed,
and its ``messages`` CHECK says so: it becomes a ``course`` queue. The meta
row gets the column that says so, with a constant default, which PostgreSQL
(11 and later) records in the catalogue instead of rewriting the row; no
message, effect or journal row is touched, and the CHECK and the step's
function stay as they are. A worker of the earlier engine running when it
commits goes on with the same statements.
"""

from __future__ import annotations

from ..schema import ID_RULE_COLUMN, META_TABLE

REWRITES_MESSAGES = False
STATEMENTS = (f"ALTER TABLE {META_TABLE} ADD COLUMN {ID_RULE_COLUMN}",)
