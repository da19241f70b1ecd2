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

from .clock import Clock, ModelClock, SystemClock
from .crashpoints import CRASH_EXIT_CODE
from .audit import Finding, Snapshot
from .errors import (BatchConflict, BatchRejected, ConnectionLost, IntegrityViolation,
                     InvalidPayload, LeaseLost, LockTimeout, NotRedrivable, PayloadDiffers,
                     QueueError, TransientError, UnknownEvent, UnusableFile)
from .handler import DEFAULT_CATEGORIES, Handler
from .ingest import Batch, Event, canonical_json, parse_batch, read_batch
from .migrations import Migration, migrate
from .queue import Queue, backoff_seconds
from .retention import Pruned
from .values import (Effect, EnqueueResult, Lease, Message, Metrics, Outcome, State, Status,
                     Transition)
from .worker import drain, finish, process_one

__version__ = "1.1.0"

__all__ = [
    "Finding", "Snapshot", "UnusableFile",
    "Batch", "BatchConflict", "BatchRejected", "CRASH_EXIT_CODE", "Clock", "ConnectionLost",
    "DEFAULT_CATEGORIES", "Effect", "EnqueueResult", "Event", "Handler", "IntegrityViolation",
    "InvalidPayload", "Lease", "LeaseLost", "LockTimeout", "Message", "Metrics", "Migration",
    "ModelClock", "NotRedrivable", "Outcome", "PayloadDiffers", "Pruned", "Queue", "QueueError", "State",
    "Status", "SystemClock", "TransientError", "Transition", "UnknownEvent", "backoff_seconds",
    "canonical_json", "drain", "finish", "migrate", "parse_batch", "process_one", "read_batch",
]
