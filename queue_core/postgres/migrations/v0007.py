"""Schema 6 -> 7: the step's function claims the worker's next message with a constant
LIMIT, and the journal gets an index by event.

The function is replaced by one that claims at most one message, the next,
with ``LIMIT 1`` instead of ``LIMIT p_claim`` (``step.NEXT_ONLY`` says why: the
server re-planned the claim at every call). Its arguments and rows are the
same, so a worker of the earlier engine running when it commits goes on: its
step calls the new function from its next step on, and asks for one message,
as it always did. The journal's index by event (``JOURNAL_INDEX``), which prune
reads the rows of the messages it prunes by, is built in the same transaction:
one pass over ``transitions``, which holds back the journal's writes (every
worker's next step) until the commit, as every step's lock does
(``MIGRATION_LOCK_TIMEOUT`` bounds the wait for it). No row is rewritten.
"""

from __future__ import annotations

from ..schema import JOURNAL_INDEX
from ..step import _step_function

REWRITES_MESSAGES = False
STATEMENTS = (JOURNAL_INDEX,
              _step_function(7).replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1))
