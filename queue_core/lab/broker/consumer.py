"""A consumer of the broker's stream: in a real OS process, or in this one.

Each round the consumer takes one entry: first one that another consumer has
left unacknowledged for the broker's idle time (``XAUTOCLAIM``, which counts
a new delivery), else one nobody has had (``XREADGROUP ... >``). Then:

1. it logs ``received``, with the delivery counter the broker keeps;
2. if told to ``stall``, it waits at its gate (the first entry only);
3. it reads the entry's one JSONL line and validates it as ``ingest`` would
   validate a line of a batch file, with the same codes;
4. it runs its *step* on the database, which commits (``committed``);
5. only then it acknowledges the entry (``XACK``; ``acked``).

Two steps: ``naive_step`` adds the order to a ledger and records nothing
else, so a second delivery adds it again; ``inbox_step`` hands the event to
this course's queue, whose ``messages`` table is the inbox (``enqueue``
counts an exact repeat as a duplicate and refuses a conflicting payload),
and lets the queue's protocol make the effect.

A poison entry, which no retry can ever make usable, is moved to the
dead-letter stream with its code and acknowledged, in ONE Redis transaction:
an entry that fails validation, and an event the step refuses for good (a
conflicting payload, ``batch_conflict``; a payload the handler refuses,
``invalid_payload``). Codes besides those of ``ingest``:

``missing_key``     the entry has no ``event`` field
``unexpected_key``  the entry has a field other than ``event``
``not_one_line``    the event's text is empty or holds a line break: an
                    entry carries exactly one JSONL line

Crash points (a real ``os._exit(86)``): ``before_commit`` (the step's first
write transaction has written, not committed), ``after_commit`` (the step
committed, no ``XACK`` yet), ``after_ack`` (with ``ack_first``, the teaching
contrast that acknowledges BEFORE its step: ``XACK`` done, step not run).

    python -m queue_core.lab.broker.consumer '{"broker": {...}, "db": "...", "name": "A", ...}'
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

from ...audit import CONTRAST_LEDGER
from ...clock import ModelClock
from ...crashpoints import CRASH_EXIT_CODE
from ...errors import BatchRejected, InvalidPayload, QueueError
from ...handler import Handler
from ...ingest import parse_batch
from ...queue import Queue
from ...worker import drain
from .streams import FIELD, Broker, event_id_of
from ..story.contrasts import create_ledger
from ..story.scenario import LEASE_SECONDS, START

if TYPE_CHECKING:
    import sqlite3

CRASH_POINTS = ("before_commit", "after_commit", "after_ack")
KEEPS = ("naive", "inbox")
_FIELD = FIELD.encode()
_BOM = b"\xef\xbb\xbf"
_PACKAGE_PARENT = str(Path(__file__).resolve().parents[3])  # the folder that holds queue_core

StepFunction = Callable[[Queue, str], Any]


# -- the two database steps ------------------------------------------------------------

def naive_step(queue: Queue, line: str) -> str:
    """No inbox: add the order's amount to the ledger, and record nothing else.

    Nothing stored says this event was seen, so a second delivery of it is
    added again. Raises ``InvalidPayload`` for a payload the handler refuses.
    """
    event = json.loads(line)
    effect = Handler().effect_of(event["payload"])
    with queue.transaction() as conn:
        conn.execute(f"INSERT INTO {CONTRAST_LEDGER} (event_id, category, amount_cents) "
                     "VALUES (?, ?, ?)", (event["event_id"], effect.category, effect.amount_cents))
    return f"{effect.category} +{effect.amount_cents}"


def inbox_step(queue: Queue, line: str) -> str:
    """The inbox: hand the event to the queue, then let the queue's protocol finish it.

    ``enqueue`` stores a new event id and counts an exact repeat, in one
    transaction, so a redelivered entry is recognised whoever receives it;
    a conflicting payload raises ``BatchConflict`` (``batch_conflict``).
    ``drain`` then claims and completes what is due: effect and ACK in one
    transaction, fenced by the generation.
    """
    accepted = queue.enqueue_jsonl(line)
    drain(queue, Handler())
    return "stored" if accepted.inserted else "repeat: counted, not stored"


STEPS: dict[str, StepFunction] = {"naive": naive_step, "inbox": inbox_step}


def prepare_db(path: str | os.PathLike[str], keep: str) -> Queue:
    """A new queue file for consumers of kind ``keep`` (``naive`` also gets the ledger)."""
    if keep not in KEEPS:
        raise ValueError(f"keep must be one of {KEEPS}, got {keep!r}")
    queue = Queue(path, clock=ModelClock(START), lease_seconds=LEASE_SECONDS)
    if keep == "naive":
        create_ledger(queue)
    return queue


# -- reading an entry ----------------------------------------------------------------------

def read_event(fields: dict[bytes, bytes]) -> str:
    """The one JSONL line an entry carries, validated as a line of a batch file.

    Raises ``BatchRejected`` with ``ingest``'s codes (line 1), or
    ``missing_key``, ``unexpected_key``, ``not_one_line`` for the entry's shape.
    """
    if _FIELD not in fields:
        raise BatchRejected("missing_key", f"the entry has no {FIELD!r} field", line=1)
    extra = sorted(name for name in fields if name != _FIELD)
    if extra:
        raise BatchRejected("unexpected_key", f"an entry has only the field {FIELD!r}, "
                            f"found {extra[0].decode('utf-8', 'replace')[:30]!r}", line=1)
    raw = fields[_FIELD]
    if not raw.strip(b" \t\r\n"):
        raise BatchRejected("not_one_line", "the event is empty; an entry carries one JSONL "
                            "line", line=1)
    if b"\n" in raw.strip(b" \t\r\n"):
        raise BatchRejected("not_one_line", "the event holds a line break; an entry carries "
                            "exactly one JSONL line", line=1)
    parse_batch(raw)
    return raw.removeprefix(_BOM).decode("utf-8")


@dataclass(frozen=True, slots=True)
class Entry:
    """One entry as a consumer took it: its id, fields, delivery counter, and how
    it came (``new`` from XREADGROUP, ``idle`` taken over by XAUTOCLAIM)."""

    entry_id: bytes
    fields: dict[bytes, bytes]
    delivery: int
    how: str

    @property
    def event_id(self) -> str:
        return event_id_of(self.fields.get(_FIELD, b""))


# -- the consumer --------------------------------------------------------------------------

class Consumer:
    """One named consumer of the group: take an entry, run ``step``, acknowledge."""

    def __init__(self, broker: Broker, name: str, queue: Queue, step: StepFunction, *,
                 ack_first: bool = False, crash_at: str | None = None,
                 stall: bool = False, hold: bool = False) -> None:
        _check_crash(crash_at, ack_first)
        self.broker, self.name, self.queue, self.step = broker, name, queue, step
        self.ack_first, self.crash_at, self._stall, self._hold = ack_first, crash_at, stall, hold
        self.client = broker.client()

    def close(self) -> None:
        self.client.close()

    def run(self, limit: int | None = None) -> int:
        """Take and handle entries until none is left (or ``limit``); return how many.

        With ``hold``, first wait at the gate until released: the process
        starts early and takes nothing before the course says so.
        """
        if self._hold:
            self._hold = False
            self.broker.wait_released(self.name)
        handled = 0
        while limit is None or handled < limit:
            entry = self.take()
            if entry is None:
                break
            self.handle(entry)
            handled += 1
        return handled

    def take(self) -> Entry | None:
        """An entry idle past the broker's idle time, else a new one, else ``None``."""
        b = self.broker
        claimed = self.client.xautoclaim(b.stream, b.group, self.name, b.min_idle_ms,
                                         start_id="0-0", count=1)[1]
        how = "idle"
        if not claimed:
            read = self.client.xreadgroup(b.group, self.name, {b.stream: ">"}, count=1)
            claimed, how = (read[0][1] if read else []), "new"
        if not claimed:
            return None
        entry_id, fields = claimed[0]
        row = self.client.xpending_range(b.stream, b.group, min=entry_id, max=entry_id, count=1)
        return Entry(entry_id, dict(fields or {}), int(row[0]["times_delivered"]), how)

    def handle(self, entry: Entry) -> None:
        """Log the receipt, stall if told to, then ``finish``."""
        self.receive(entry)
        if self._stall:
            self._stall = False
            self.broker.wait_released(self.name)
            self.resume(entry)
        self.finish(entry)

    def receive(self, entry: Entry) -> None:
        self._log("received", entry, entry.how)

    def resume(self, entry: Entry) -> None:
        self._log("resumed", entry, "")

    def finish(self, entry: Entry) -> None:
        """Validate, run the step (it commits), then acknowledge; poison goes dead."""
        try:
            line = read_event(entry.fields)
        except BatchRejected as refusal:
            self._dead_letter(entry, refusal)
            return
        if self.ack_first:
            self._ack(entry)
            self._crash("after_ack")
        try:
            detail = self.step(self.queue, line)
        except (BatchRejected, InvalidPayload) as refusal:  # no retry can ever make it usable
            self._dead_letter(entry, refusal)
            return
        self._log("committed", entry, "" if detail is None else str(detail)[:80])
        self._crash("after_commit")
        if not self.ack_first:
            self._ack(entry)

    def _ack(self, entry: Entry) -> None:
        b = self.broker
        count = self.client.xack(b.stream, b.group, entry.entry_id)
        self._log("acked", entry, f"XACK -> {count}")

    def _dead_letter(self, entry: Entry, refusal: QueueError) -> None:
        """Move the entry to the dead-letter stream and acknowledge it, atomically."""
        b = self.broker
        held = entry.fields.get(_FIELD, json.dumps(sorted(k.decode("utf-8", "replace")
                                                          for k in entry.fields)).encode())
        with self.client.pipeline(transaction=True) as multi:  # MULTI ... EXEC
            multi.xadd(b.dead_stream, {"entry": entry.entry_id, "event": held,
                                       "code": refusal.code, "reason": refusal.message[:200],
                                       "consumer": self.name, "delivery": entry.delivery})
            multi.xack(b.stream, b.group, entry.entry_id)
            multi.execute()
        self._log("dead_lettered", entry, refusal.code)

    def _log(self, step: str, entry: Entry, detail: str) -> None:
        self.client.xadd(self.broker.log_stream, {
            "consumer": self.name, "step": step, "entry": entry.entry_id,
            "event_id": entry.event_id, "delivery": entry.delivery, "detail": detail})

    def _crash(self, point: str) -> None:
        if self.crash_at == point:
            os._exit(CRASH_EXIT_CODE)  # a real death: no finally, no XACK, no cleanup


def _check_crash(crash_at: str | None, ack_first: bool) -> None:
    """A programmer error, refused before anything runs."""
    if crash_at is not None and crash_at not in CRASH_POINTS:
        raise ValueError(f"crash_at must be one of {CRASH_POINTS} or None, got {crash_at!r}")
    if crash_at == "after_ack" and not ack_first:
        raise ValueError("after_ack needs ack_first: only that order has an XACK before the step")


class _DyingQueue(Queue):
    """A queue whose first write transaction dies after its writes, before COMMIT."""

    def transaction(self, *, relaxed: bool = False) -> Any:
        return _dying(super().transaction(relaxed=relaxed))


@contextmanager
def _dying(inner: Any) -> Iterator["sqlite3.Connection"]:
    with inner as conn:
        yield conn
        os._exit(CRASH_EXIT_CODE)  # SQLite rolls the open transaction back


# -- in a real process -----------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class ConsumerResult:
    """How a consumer process ended."""

    name: str
    exit_code: int

    @property
    def crashed(self) -> bool:
        return self.exit_code == CRASH_EXIT_CODE


def run_consumer(broker: Broker, db: str | os.PathLike[str], name: str, *,
                 keep: str = "inbox", ack_first: bool = False, crash_at: str | None = None,
                 stall: bool = False, hold: bool = False, limit: int | None = None,
                 wait: bool = True) -> ConsumerResult | subprocess.Popen[str]:
    """Start consumer ``name`` of ``broker`` in a new OS process on the queue file ``db``.

    ``keep`` is ``naive`` or ``inbox`` (its step); ``stall`` makes it wait at
    its gate after receiving its first entry, until ``broker.release(name)``;
    ``hold`` makes it wait there before it takes anything (each wait takes
    one release); ``limit`` ends it after that many entries. With ``wait=False`` the
    running ``Popen`` is returned: pass it to ``collect_consumer``.
    """
    if keep not in KEEPS:
        raise ValueError(f"keep must be one of {KEEPS}, got {keep!r}")
    _check_crash(crash_at, ack_first)
    spec = {"broker": broker.spec(), "db": os.fspath(db), "name": name, "keep": keep,
            "ack_first": ack_first, "crash_at": crash_at, "stall": stall, "hold": hold,
            "limit": limit}
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [_PACKAGE_PARENT, *filter(None, [os.environ.get("PYTHONPATH")])]))
    proc = subprocess.Popen([sys.executable, "-m", "queue_core.lab.broker.consumer",
                             json.dumps(spec)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    return collect_consumer(proc, name) if wait else proc


def collect_consumer(proc: subprocess.Popen[str], name: str) -> ConsumerResult:
    """Wait for a consumer process; raise if it failed other than by its crash point."""
    _, err = proc.communicate()
    if proc.returncode not in (0, CRASH_EXIT_CODE):
        raise RuntimeError(f"consumer {name} exited with {proc.returncode}: {err.strip()[-500:]}")
    return ConsumerResult(name, proc.returncode)


def main(argv: Sequence[str] | None = None) -> int:
    spec = json.loads((argv if argv is not None else sys.argv[1:])[0])
    broker = Broker(**spec["broker"])
    queue_class = _DyingQueue if spec["crash_at"] == "before_commit" else Queue
    queue = queue_class(spec["db"], clock=ModelClock(START), lease_seconds=LEASE_SECONDS)
    consumer = Consumer(broker, spec["name"], queue, STEPS[spec["keep"]],
                        ack_first=spec["ack_first"], crash_at=spec["crash_at"],
                        stall=spec["stall"], hold=spec["hold"])
    try:
        consumer.run(spec["limit"])
    finally:
        consumer.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
