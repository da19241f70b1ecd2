"""Schema 6 -> 7: the step's function claims the worker's next message with a constant LIMIT.

The function is replaced by one that claims at most one message, the next,
with ``LIMIT 1`` instead of ``LIMIT p_claim`` (``step.NEXT_ONLY`` says why: the
server re-planned the claim at every call). Its arguments and rows are the
same, so a worker of the earlier engine running when it commits goes on: its
step calls the new function from its next step on, and asks for one message,
as it always did. No table, index or row is touched.
"""

from __future__ import annotations

from ..step import _step_function

REWRITES_MESSAGES = False
STATEMENTS = (_step_function(7).replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1),)
