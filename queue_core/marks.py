"""What marks a queue as this package's on every store, and the refusals of its version.

A queue carries the application id ``APPLICATION_ID`` ("QCUE"): a SQLite
file in its header's bytes 68-71 (``PRAGMA application_id``), a PostgreSQL
schema in its table ``queue_core_meta``. Beside it stands the schema version,
which each store counts on its own (``sqlite``'s ``SCHEMA_VERSION``,
``postgres.schema.SCHEMA_VERSION``): versions start at 1, an engine writes
only its own version, reads an earlier one as it is and upgrades it with
``migrations``, and refuses a later one. Both stores use these words for it.
"""

from __future__ import annotations

from .errors import UnusableFile

APPLICATION_ID = 0x51435545  # "QCUE" in a SQLite header's bytes 68-71: this is a queue


def too_old(where: str, version: int, current: int) -> UnusableFile:
    """The refusal of a write to a queue of an earlier schema version than
    ``current``, the one this engine writes on that store."""
    return UnusableFile("schema_too_old", f"{where} has queue schema version {version}; this "
                        f"version of queue_core writes version {current}: run "
                        "`queue-core migrate` first (reading commands read it as it is)")


def too_new(where: str, version: int, current: int) -> UnusableFile:
    """The refusal of a queue of a later schema version than ``current``: a
    later version of this package made it, and this one must not write it."""
    return UnusableFile("schema_too_new", f"{where} has queue schema version {version}; "
                        f"this version of queue_core knows {current} (upgrade it)")


def no_such_version(where: str, version: int) -> UnusableFile:
    """The refusal of a queue's mark with a version no release writes (they start at 1)."""
    return UnusableFile("not_a_queue", f"{where} carries the queue's mark with schema version "
                        f"{version}, which no version of queue_core writes (versions start "
                        "at 1): it was not made by queue_core, or its mark was edited")


def refuse_other_version(where: str, version: int, current: int) -> None:
    """Raise ``schema_too_old`` or ``schema_too_new`` unless ``version`` is ``current``."""
    if version < current:
        raise too_old(where, version, current)
    if version > current:
        raise too_new(where, version, current)
