"""Schema 2 -> 3: the two indexes in place of one, and the step's function; no row
changes. Dropping and building the indexes holds the table's lock until the
commit (milliseconds for the at most 10,000 messages a queue holds: event ids
are E and four digits); a worker of the earlier engine still running when it
commits waits that long, then goes on unchanged (its statements read and
write the same columns).
"""

from __future__ import annotations

from ..schema import LEASED_INDEX, LIVE_INDEX_3
from ..step import _step_function

REWRITES_MESSAGES = False
STATEMENTS = ("DROP INDEX messages_live", LIVE_INDEX_3, LEASED_INDEX, _step_function(3))
