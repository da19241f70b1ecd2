"""queue_core: a reliable queue in one SQLite file, built for a course.

Delivery with a time-limited lease, a fencing ``generation`` checked at the
ACK, the business effect and the ACK in one transaction, retries with
backoff, a dead-letter state and redrive.

    >>> from queue_core import Queue, ModelClock, Handler
    >>> clock = ModelClock(1000)
    >>> queue = Queue("course.sqlite3", clock=clock, lease_seconds=2)

The engine is this package; the course's apparatus (worker processes that
crash on purpose, broken contrasts, sweeps, exercises, plots) is the
subpackage ``queue_core.lab``, which importing this package does not load.
Importing either does not import pandas or matplotlib.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .lazy import exports as _exports

__version__ = "1.1.0"

# Each public name, and the module that defines it. A name is imported on its first
# use, so ``import queue_core`` loads nothing yet and the command line answers
# ``--help`` without the engine; ``from queue_core import Queue`` loads what a
# queue needs (the store of its kind, the protocol), and the audit, retention,
# migrations and PostgreSQL load when they are first used.
_HOME = {
    "Batch": "ingest",
    "BatchConflict": "errors",
    "BatchRejected": "errors",
    "CRASH_EXIT_CODE": "crashpoints",
    "Clock": "clock",
    "ConnectionLost": "errors",
    "DEFAULT_CATEGORIES": "handler",
    "Effect": "values",
    "EnqueueResult": "values",
    "Event": "ingest",
    "Finding": "audit",
    "Handler": "handler",
    "IntegrityViolation": "errors",
    "InvalidPayload": "errors",
    "Lease": "values",
    "LeaseLost": "errors",
    "LockTimeout": "errors",
    "Message": "values",
    "Metrics": "values",
    "Migration": "migrations",
    "ModelClock": "clock",
    "NotRedrivable": "errors",
    "Outcome": "values",
    "PayloadDiffers": "errors",
    "IdRuleDiffers": "errors",
    "PriorityFigures": "values",
    "Pruned": "retention",
    "Queue": "queue",
    "QueueError": "errors",
    "Snapshot": "audit",
    "State": "values",
    "Status": "values",
    "SystemClock": "clock",
    "TransientError": "errors",
    "Transition": "values",
    "UnknownEvent": "errors",
    "UnusableFile": "errors",
    "backoff_seconds": "queue",
    "canonical_json": "ingest",
    "drain": "worker",
    "finish": "worker",
    "migrate": "migrations",
    "parse_batch": "ingest",
    "process_one": "worker",
    "read_batch": "ingest",
}
_MODULES = ("acks", "audit", "cli", "cli_text", "clock", "crashpoints", "errors", "handler",
            "ids", "ingest", "lab", "lazy", "ledger", "marks", "migrations", "postgres",
            "priority", "queue", "retention", "sqlite", "stores", "transitions", "values",
            "views", "worker")

if TYPE_CHECKING:
    from .audit import Finding, Snapshot
    from .clock import Clock, ModelClock, SystemClock
    from .crashpoints import CRASH_EXIT_CODE
    from .errors import BatchConflict, BatchRejected, ConnectionLost, IdRuleDiffers, IntegrityViolation, InvalidPayload, LeaseLost, LockTimeout, NotRedrivable, PayloadDiffers, QueueError, TransientError, UnknownEvent, UnusableFile
    from .handler import DEFAULT_CATEGORIES, Handler
    from .ingest import Batch, Event, canonical_json, parse_batch, read_batch
    from .migrations import Migration, migrate
    from .queue import Queue, backoff_seconds
    from .retention import Pruned
    from .values import (Effect, EnqueueResult, Lease, Message, Metrics, Outcome, PriorityFigures,
                         State, Status, Transition)
    from .worker import drain, finish, process_one


__getattr__, __dir__ = _exports(__name__, _HOME, _MODULES)


__all__ = [
    "Finding", "Snapshot", "UnusableFile",
    "Batch", "BatchConflict", "BatchRejected", "CRASH_EXIT_CODE", "Clock", "ConnectionLost",
    "DEFAULT_CATEGORIES", "Effect", "EnqueueResult", "Event", "Handler", "IntegrityViolation",
    "InvalidPayload", "Lease", "LeaseLost", "LockTimeout", "Message", "Metrics", "Migration",
    "ModelClock", "NotRedrivable", "Outcome", "PayloadDiffers", "IdRuleDiffers",
    "PriorityFigures", "Pruned", "Queue", "QueueError", "State",
    "Status", "SystemClock", "TransientError", "Transition", "UnknownEvent", "backoff_seconds",
    "canonical_json", "drain", "finish", "migrate", "parse_batch", "process_one", "read_batch",
]
