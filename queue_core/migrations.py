"""Upgrading a queue to the engine's schema version, one step per version.

A queue's schema version is ``PRAGMA user_version`` in a SQLite file, the
``schema_version`` of ``queue_core_meta`` on PostgreSQL. Each store counts
its own (``sqlite.SCHEMA_VERSION``, 4; ``postgres.SCHEMA_VERSION``, 7), and
each step is one numbered module with a docstring saying what it changes and
why (``sqlite/migrations/v0002.py`` ... ``postgres/migrations/v0007.py``):

- SQLite 2, PostgreSQL 2: the same tables on both (the payload's digest, the
  finish time, one live index, ``compacted``);
- PostgreSQL 3: the worker step as a function of the schema, which a SQLite
  file has no use for and is not rewritten for;
- PostgreSQL 4: that function holds the payload to the digest kept from
  enqueue on, as the client's ACK does in Python;
- SQLite 3, PostgreSQL 5: the rule the queue's event ids follow, recorded
  (an existing queue becomes a ``course`` queue; no row is rewritten);
- SQLite 4, PostgreSQL 6: each message's priority, added in place with its
  default, 0, for every message a queue holds (no row is rewritten), and the
  live index built again in the claim's order; on PostgreSQL the step's
  function is replaced by one that claims in that order;
- PostgreSQL 7: that function claims its one next message with a constant
  LIMIT, so the server keeps one plan for the claim instead of planning it at
  every step; and the journal gets an index by event, by which prune reads
  the rows of the messages it prunes (no row is rewritten).

Each store's runner knows its list of steps and runs each in ONE transaction
that reads the version again inside it:

- a crash (or a power loss) leaves the old version intact or the new one
  complete, never a mixture;
- two migrators started at once cannot both apply a step: the second finds
  the new version once it holds the lock, and does nothing;
- a second run changes nothing and says the queue is already current.

Before it is migrated, a queue of an earlier version is read as it is by
every reading command, and refused by every writing one (``schema_too_old``).
An engine of an earlier version refuses a migrated queue when it opens it
(``schema_too_new``). A worker of that engine that is still running when the
step commits keeps sending its own statements, which schema 2 either still
accepts unchanged (claims, recoveries, failures, releases, redrives: none of
them touches what schema 2 added) or refuses loudly, changing nothing (an
ACK without its finish time, and an enqueue without its payload's digest,
fail the schema's CHECK and NOT NULL constraints). So no row is ever written
that schema 2 misreads; the refused ACK's lease expires, and a worker of
this engine finishes the message. This engine reads a SQLite file's version
as its last commit left it (through the ``-wal``, ``sqlite.inspect``) and
again inside each write transaction (``sqlite.transaction``): a queue opened
before the step writes at once after it, and a later engine's step is
refused at the next transaction: a running SQLite worker of the release
before the id rule stops with ``schema_too_new`` at its next transaction
after the step to 3, and one of the release before priorities after the
step to 4. PostgreSQL's steps from 2 to 3 and from 4 to 5 change no row a
worker writes, and the steps from 3 to 4, from 5 to 6 and from 6 to 7
replace the function a worker calls: a worker of the release before goes
on across each, calling the new function from its next step. Across the step to 6 its
own statements stay sound: its enqueue leaves a new message at priority 0,
and its own claim takes due messages in ``available_at`` order (a priority
it ignores, never misreads), while its step, the new function, claims by
priority.

What a step does not change: the page size and the auto-vacuum mode of an
existing SQLite file (only ``VACUUM`` can, rewriting the whole file). A file
made before either stays as it is and keeps working; its freed pages are
reused by the file rather than given back (see README, "Retention").
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from .stores import open_store

__all__ = ["Migration", "migrate"]


@dataclass(frozen=True, slots=True)
class Migration:
    """What ``migrate`` did: the versions before and after, and the steps applied.

    Each step is ``(from_version, messages rewritten)``; none if it was current.
    """

    target: str
    from_version: int
    to_version: int
    steps: tuple[tuple[int, int], ...]

    @property
    def rows(self) -> int:
        """Messages rewritten, over every step."""
        return sum(rows for _, rows in self.steps)

    def lines(self) -> list[str]:
        """What ``queue-core migrate`` prints."""
        if not self.steps:
            return [f"{self.target} is already at schema version {self.to_version}: "
                    "nothing to do"]
        said = [f"schema {version} -> {version + 1}: {rows} messages rewritten"
                for version, rows in self.steps]
        return [*said, f"{self.target} migrated from schema version {self.from_version} "
                       f"to {self.to_version}"]


def migrate(target: str | os.PathLike[str]) -> Migration:
    """Upgrade the queue at ``target`` to this version's schema, and say what was done.

    ``target`` is a file or a ``postgresql://`` string; each step from its
    version to the store's (``schema_version``) runs in one transaction.

    Refuses what ``Queue`` refuses (``no_queue_file``, ``not_a_queue``,
    ``schema_too_new``, ...) without writing a byte. On PostgreSQL a step
    waits at most ``postgres.MIGRATION_LOCK_TIMEOUT`` for the locks it
    needs, then gives up (``migration_blocked``), having changed nothing.
    """
    store = open_store(target)
    start = store.prepare(create=False)
    version, steps = start, []
    while version < store.schema_version:
        rows = store.migrate_step(version)
        if rows is not None:  # None: another migrator applied this step first
            steps.append((version, rows))
        version += 1
    return Migration(store.describe(), start, version, tuple(steps))
