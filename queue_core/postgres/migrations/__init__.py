"""The steps that upgrade a PostgreSQL queue's schema, one module per version.

``vNNNN`` takes a schema of version NNNN - 1 to NNNN: its ``STATEMENTS``, in
order, and whether they rewrite every message (``REWRITES_MESSAGES``, so the
runner counts them). The runner, ``PostgresStore.migrate_step``, runs one
module's statements in ONE transaction, under the advisory lock and the meta
row's lock, after it has read the version again inside that transaction;
``STEPS`` is the only list of them. A new schema version is a new module
here, added to ``STEPS``, and the new text in ``schema`` (or ``step``).
"""

from __future__ import annotations

from . import v0002, v0003, v0004, v0005, v0006, v0007

# version -> the statements that upgrade a schema of that version to the next
STEPS: dict[int, tuple[str, ...]] = {1: v0002.STATEMENTS, 2: v0003.STATEMENTS,
                                     3: v0004.STATEMENTS, 4: v0005.STATEMENTS,
                                     5: v0006.STATEMENTS, 6: v0007.STATEMENTS}
# the steps that rewrite every message (the others none)
REWRITES_MESSAGES = frozenset(version for version, module in
                              ((1, v0002), (2, v0003), (3, v0004),
                                                       (4, v0005), (5, v0006), (6, v0007))
                              if module.REWRITES_MESSAGES)
