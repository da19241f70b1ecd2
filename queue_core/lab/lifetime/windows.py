"""What five systems do with a late duplicate: their dedupe windows side by side.

Each row says how long the system remembers a message's key by default,
what a duplicate gets inside that time and after it, and where that is
written (documentation or source, as read for this course). This queue's
own row comes last: it keeps every key forever (``prune`` included).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True, slots=True)
class Window:
    """One system's dedupe window: how long, and what a duplicate gets in it and after."""

    system: str
    remembers: str
    inside: str
    after: str
    source: str


WINDOWS = (
    Window("SQS FIFO", "5 minutes per deduplication ID, even after the message was "
           "received and deleted", "accepted, not delivered", "accepted as new",
           "docs.aws.amazon.com/AWSSimpleQueueService/latest/SQSDeveloperGuide/"
           "FIFO-key-terms.html"),
    Window("NATS JetStream", "2 minutes (StreamDefaultDuplicatesWindow); never longer "
           "than the stream's max age", "PubAck with the original sequence, duplicate: true",
           "accepted as new", "nats-io/nats-server, server/stream.go"),
    Window("Azure Service Bus", "10 minutes by default (20 s to 7 days)",
           "reported as accepted, then dropped", "accepted as new",
           "learn.microsoft.com/azure/service-bus-messaging/duplicate-detection"),
    Window("River unique jobs", "while the job's row exists (completed jobs: 24 h, "
           "then the job cleaner deletes them)", "the existing job is returned",
           "inserted as a new job", "riverqueue/river, insert_opts.go"),
    Window("Oban unique jobs", "period 60 s by default; :infinity only as long as "
           "jobs are retained (the pruner's max_age: 60 s)", "{:ok, job} with conflict?: true",
           "inserted as a new job", "oban-bg/oban, guides/learning/unique_jobs.md; oban#731"),
    Window("this queue", "forever: prune drops payload and journal, keeps key, digest "
           "and effect", "counted as a duplicate, nothing stored",
           "(no after: the same answer forever)", "queue_core/retention.py"),
)


def windows_frame() -> "pd.DataFrame":
    """The windows as a table, one system per row."""
    import pandas as pd

    return pd.DataFrame([{"remembers a key": w.remembers, "a duplicate inside": w.inside,
                          "a duplicate after": w.after, "source": w.source}
                         for w in WINDOWS], index=[w.system for w in WINDOWS])
