"""Schema 3 -> 4: the step's function replaced by one that holds the payload to the
digest kept from enqueue on (schema 3's compared the effect's payload with the
stored one only, so a payload edited before the claim was counted); no row or
index changes. A worker of the earlier engine running when it commits calls
the new function from its next step on, with the same arguments and rows.
"""

from __future__ import annotations

from ..step import _step_function

REWRITES_MESSAGES = False
STATEMENTS = (_step_function(4).replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1),)
