"""A stream of orders on a real Redis server, and what its consumers left there.

Redis Streams with a consumer group are a broker as most learners meet one.
A producer appends each order to a stream (``XADD``); each consumer of the
group is handed entries no one has had (``XREADGROUP ... >``), and the server
keeps every handed-out entry in the group's *pending entries list* (PEL),
with its owner, its idle time and how often it was delivered, until some
client acknowledges it (``XACK``). An entry left unacknowledged longer than
an idle time can be taken over by another consumer (``XAUTOCLAIM``), which
counts a new delivery. ``XACK`` names no consumer: the broker does not fence
a consumer that was overtaken.

``Broker`` is one stream and its group on a server; ``open_broker(url)``
makes a fresh one (unique names, so a shared server never mixes two runs)
and ``drop`` removes it. Besides the stream it holds three keys of its own:

``<stream>:dead``   the dead-letter stream: entries no consumer can ever use
                    (invalid input, a conflicting event id), moved there with
                    their code and acknowledged in one Redis transaction;
``<stream>:log``    what each consumer did, one entry per step (received,
                    resumed, committed, acked, dead_lettered, exited, failed), in the
                    order the server saw the steps: the course's figures are
                    drawn from it, and from the queue file the consumers wrote;
``<stream>:gate:*`` lists a stalled consumer waits on (``BLPOP``) until
                    ``release``.

Nothing here imports ``redis`` at import time (see ``servers.redis_server``).
Consumers live in ``consumer``; the course's scenarios in ``play``.
"""

from __future__ import annotations

import itertools
import json
import os
import secrets
import time
from contextlib import closing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping

from ..servers.redis_server import connect

if TYPE_CHECKING:
    import redis

GROUP = "shop"
MIN_IDLE_MS = 100       # the idle time after which another consumer may take an entry over
FIELD = "event"         # an entry's one field: one JSONL line, as in a batch file
WAIT_TIMEOUT_SECONDS = 30.0
LOG_STEPS = ("received", "resumed", "committed", "acked", "dead_lettered", "exited", "failed")
_counter = itertools.count(1)
_HOW = {"new": "XREADGROUP: new", "idle": "XAUTOCLAIM: idle too long"}


@dataclass(frozen=True, slots=True)
class LogStep:
    """One line of the consumers' log: who did what to which entry.

    ``entry`` is the entry's place in the stream (1 for the first published),
    ``delivery`` how often the broker had delivered it when it was received
    (its delivery counter), ``detail`` what the step found (``XACK -> 0``, a
    code, what the database step did).
    """

    n: int
    consumer: str
    step: str
    entry: int
    event_id: str
    delivery: int
    detail: str

    def __str__(self) -> str:
        if not self.entry:  # a step of the consumer, not of an entry (an exit)
            return f"{self.consumer} {self.step}: {self.detail}"
        what = f"{self.consumer} {self.step} {self.event_id or f'entry {self.entry}'}"
        if self.step == "received":
            return f"{what} (delivery {self.delivery}, {_HOW.get(self.detail, self.detail)})"
        return f"{what}: {self.detail}" if self.detail else what


@dataclass(frozen=True, slots=True)
class Pending:
    """One entry of the pending entries list: handed out, not yet acknowledged."""

    entry: int
    event_id: str
    consumer: str
    delivery: int

    def __str__(self) -> str:
        return f"{self.event_id} held by {self.consumer}, delivered {self.delivery}x"


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """An entry moved to the dead-letter stream: what it held, and why."""

    entry: int
    event: str
    code: str
    reason: str
    consumer: str
    delivery: int

    def __str__(self) -> str:
        return f"entry {self.entry}: {self.code}: {self.reason}"


@dataclass(frozen=True)
class Broker:
    """One stream and its consumer group on the Redis server at ``url``."""

    url: str
    stream: str
    group: str = GROUP
    min_idle_ms: int = MIN_IDLE_MS

    def __repr__(self) -> str:  # the URL and stream hold a temporary path and a process id
        return f"Broker(group={self.group!r}, min_idle_ms={self.min_idle_ms})"

    @property
    def dead_stream(self) -> str:
        return f"{self.stream}:dead"

    @property
    def log_stream(self) -> str:
        return f"{self.stream}:log"

    def gate(self, consumer: str) -> str:
        return f"{self.stream}:gate:{consumer}"

    def client(self) -> "redis.Redis":
        return connect(self.url)

    def spec(self) -> dict[str, Any]:
        """What a consumer process needs to find this broker."""
        return {"url": self.url, "stream": self.stream, "group": self.group,
                "min_idle_ms": self.min_idle_ms}

    # -- the producer's side -------------------------------------------------------

    def publish(self, text: str) -> int:
        """Append each non-empty line of JSONL ``text`` as one entry; return how many."""
        lines = [line for line in text.splitlines() if line.strip()]
        with closing(self.client()) as client:
            for line in lines:
                client.xadd(self.stream, {FIELD: line.encode("utf-8", "surrogatepass")})
        return len(lines)

    def publish_entry(self, fields: Mapping[str, str | bytes]) -> None:
        """Append one entry with exactly ``fields``, as a faulty producer might."""
        with closing(self.client()) as client:
            client.xadd(self.stream, dict(fields))

    # -- reading what is stored ------------------------------------------------------

    def pending(self) -> list[Pending]:
        """The pending entries list, oldest entry first."""
        with closing(self.client()) as client:
            rows = client.xpending_range(self.stream, self.group, min="-", max="+", count=1000)
            places = _places(client, self.stream)
            return [Pending(places[row["message_id"]], event_id_of(_entry_text(client, self.stream,
                                                                                 row["message_id"])),
                            _text(row["consumer"]), int(row["times_delivered"])) for row in rows]

    def log(self) -> list[LogStep]:
        """Every step the consumers logged, in the order the server saw them."""
        with closing(self.client()) as client:
            places = _places(client, self.stream)
            rows = client.xrange(self.log_stream)
        return [LogStep(n, _text(f[b"consumer"]), _text(f[b"step"]), places.get(f[b"entry"], 0),
                     _text(f[b"event_id"]), int(f[b"delivery"]), _text(f[b"detail"]))
                for n, (_, f) in enumerate(rows, start=1)]

    def dead_letters(self) -> list[DeadLetter]:
        """The dead-letter stream's entries, in the order they were moved there."""
        with closing(self.client()) as client:
            places = _places(client, self.stream)
            rows = client.xrange(self.dead_stream)
        return [DeadLetter(places.get(f[b"entry"], 0), _text(f[b"event"]), _text(f[b"code"]),
                           _text(f[b"reason"]), _text(f[b"consumer"]), int(f[b"delivery"]))
                for _, f in rows]

    # -- the course's hands on the consumers -------------------------------------------

    def note(self, consumer: str, step: str, detail: str, *, entry: bytes = b"",
             event_id: str = "", delivery: int = 0) -> None:
        """Add one step to the log (consumers log their own; the course notes an exit)."""
        if step not in LOG_STEPS:
            raise ValueError(f"unknown step {step!r}; known: {', '.join(LOG_STEPS)}")
        with closing(self.client()) as client:
            client.xadd(self.log_stream, {"consumer": consumer, "step": step, "entry": entry,
                                          "event_id": event_id, "delivery": delivery,
                                          "detail": detail})

    def release(self, consumer: str) -> None:
        """Let a consumer stalled at its gate go on."""
        with closing(self.client()) as client:
            client.lpush(self.gate(consumer), b"go")

    def wait_released(self, consumer: str) -> None:
        """Block (in the consumer) until ``release``; ``TimeoutError`` after 30 s."""
        with closing(self.client()) as client:
            if client.blpop([self.gate(consumer)], timeout=WAIT_TIMEOUT_SECONDS) is None:
                raise TimeoutError(f"{consumer} waited {WAIT_TIMEOUT_SECONDS:.0f} s for release")

    def wait_logged(self, consumer: str, step: str,
                    alive: Callable[[], bool] = lambda: True) -> None:
        """Wait until ``consumer`` has logged ``step`` (while ``alive()`` says it runs)."""
        wanted = {b"consumer": consumer.encode(), b"step": step.encode()}
        with closing(self.client()) as client:
            def logged() -> bool:
                rows = client.xrange(self.log_stream)
                if any(all(f.get(k) == v for k, v in wanted.items()) for _, f in rows):
                    return True
                if not alive():
                    raise RuntimeError(f"{consumer} ended before it logged {step}")
                return False
            _wait(logged, f"{consumer} to log {step}")

    def wait_idle(self) -> None:
        """Wait until some pending entry has been idle ``min_idle_ms`` (real milliseconds).

        Waiting for the broker to say so, not sleeping for a guess, makes the
        next ``XAUTOCLAIM`` find it on any machine, however busy.
        """
        with closing(self.client()) as client:
            def idle() -> bool:
                rows = client.xpending_range(self.stream, self.group, min="-", max="+",
                                             count=1000)
                return any(row["time_since_delivered"] >= self.min_idle_ms for row in rows)
            _wait(idle, f"an entry idle for {self.min_idle_ms} ms")

    def drop(self) -> None:
        """Remove the stream, its group and every key of its own from the server."""
        with closing(self.client()) as client:
            keys = [self.stream, *client.scan_iter(match=f"{self.stream}:*", count=1000)]
            client.delete(*keys)


def open_broker(url: str, *, min_idle_ms: int = MIN_IDLE_MS, prefix: str = "orders") -> Broker:
    """A new, empty stream with its consumer group on the server at ``url``.

    The name holds ``prefix``, this process's id, a counter and a random part,
    so a re-run (or another user of a shared server) never meets the entries
    of an earlier one.
    """
    if isinstance(min_idle_ms, bool) or not isinstance(min_idle_ms, int) or min_idle_ms < 1:
        raise ValueError(f"min_idle_ms must be a positive integer, got {min_idle_ms!r}")
    name = f"{prefix}:{os.getpid()}:{next(_counter)}:{secrets.token_hex(3)}"
    broker = Broker(url, name, GROUP, min_idle_ms)
    with closing(broker.client()) as client:
        client.xgroup_create(name, GROUP, id="0", mkstream=True)
    return broker


# -- helpers ------------------------------------------------------------------------------

def _places(client: "redis.Redis", stream: str) -> dict[bytes, int]:
    """Each entry id of ``stream`` -> its place (1, 2, ...): ids hold a wall-clock time."""
    return {entry_id: n for n, (entry_id, _) in enumerate(client.xrange(stream), start=1)}


def _entry_text(client: "redis.Redis", stream: str, entry_id: bytes) -> bytes:
    rows = client.xrange(stream, min=entry_id, max=entry_id)
    return rows[0][1].get(FIELD.encode(), b"") if rows else b""


def event_id_of(raw: bytes) -> str:
    """The event id an entry's text names, if it names a string one; else ``""``."""
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        return ""
    event_id = value.get("event_id") if isinstance(value, dict) else None
    return event_id[:20] if isinstance(event_id, str) else ""


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _wait(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_TIMEOUT_SECONDS
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {WAIT_TIMEOUT_SECONDS:.0f} s for {what}")
        time.sleep(0.002)
