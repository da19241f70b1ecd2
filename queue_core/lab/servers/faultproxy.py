"""A TCP proxy that breaks a PostgreSQL connection at a chosen message (notebook 14).

It listens on 127.0.0.1 only and forwards to the server of a connection
string (its Unix socket, or a loopback address: never another host). It reads
both directions as PostgreSQL wire-protocol messages: the startup packet
(an int32 length, then a code, no type byte), then frames of a type byte and
an int32 length that counts itself. An SSL or GSS encryption request is
answered ``N`` (refused) by the proxy itself, so the client goes on in clear
text, as ``sslmode=prefer`` allows; ``dsn()`` also says ``sslmode=disable``.

A ``Fault`` names the moment and what happens there:

- ``statement="..."``: before the statement whose SQL contains that text
  reaches the server (at its Parse, or at its Bind when it is prepared); a
  tuple of texts matches a statement that contains any of them;
- ``reply="COMMIT"``: after the server has answered that command (its
  CommandComplete), before the answer reaches the client: the server has
  committed, and the client cannot know;
- ``occurrence``: which matching arrival, counted over every connection;
- ``after="..."``: count only from the statement containing that text (or
  any of a tuple of texts) on, that statement included: the COMMIT that
  follows the first ACK, say, or one sent in the same message as the ACK.

The actions: ``cut`` closes both sides (the client reads end of file);
``reset`` closes the client's side with a TCP reset; ``blackhole`` forwards
nothing more either way and closes nothing, for ``seconds``, then cuts (to
the server a stalled client, since the proxy's own kernel still answers);
``delay`` holds the message ``seconds`` (or until ``release()``), then goes on.

Every loop is bounded: each read waits at most ``POLL_SECONDS``, the proxy
ends every connection and stops by itself after ``lifetime`` seconds, takes
at most ``max_connections`` and forwards at most ``MAX_READS`` reads per
connection.

    with FaultProxy(server_dsn, Fault("cut", reply="COMMIT")) as proxy:
        queue = Queue(proxy.dsn(server_dsn))
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from dataclasses import dataclass
from typing import Callable
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

ACTIONS = ("cut", "reset", "blackhole", "delay")
POLL_SECONDS = 0.05
MAX_READS = 1_000_000
MAX_FRAME = 1 << 26  # larger than any message the queue sends or receives
SSL_REQUEST, GSS_REQUEST, CANCEL_REQUEST = 80877103, 80877104, 80877102
LOOPBACK = ("127.0.0.1", "localhost", "::1")


@dataclass(frozen=True)
class Fault:
    """What to break (``action``), where (``statement`` or ``reply``) and when (``occurrence``)."""

    action: str
    statement: str | tuple[str, ...] | None = None
    reply: str | None = None
    occurrence: int = 1
    seconds: float = 1.0
    after: str | tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ValueError(f"unknown action {self.action!r}; known: {', '.join(ACTIONS)}")
        if (self.statement is None) == (self.reply is None):
            raise ValueError("a fault names exactly one moment: statement=... or reply=...")
        if isinstance(self.occurrence, bool) or not isinstance(self.occurrence, int) \
                or self.occurrence < 1:
            raise ValueError(f"occurrence counts from 1, got {self.occurrence!r}")
        if not 0 <= self.seconds <= 60:
            raise ValueError(f"seconds must be from 0 to 60, got {self.seconds!r}")

    def __str__(self) -> str:
        where = (f"before {self.statement!r}" if self.statement is not None
                 else f"after the server answered {self.reply}")
        since = f" after {self.after!r}" if self.after is not None else ""
        return f"{self.action} {where} (#{self.occurrence}{since})"


class FaultProxy:
    """Forward 127.0.0.1:``port`` to the server of ``server_dsn``, breaking at ``fault``.

    ``fired`` is set when the fault acted (``fired_at``: ``time.monotonic()``
    then); ``statements`` counts the statements seen, by their first words.
    """

    def __init__(self, server_dsn: str, fault: Fault | None = None, *,
                 lifetime: float = 120.0, max_connections: int = 64) -> None:
        if not 0 < lifetime <= 600:
            raise ValueError(f"lifetime must be above 0 and at most 600 s, got {lifetime!r}")
        self.fault = fault
        self.upstream = _upstream(server_dsn)
        self.lifetime = lifetime
        self.max_connections = max_connections
        self.fired = threading.Event()
        self.fired_at: float | None = None
        self.statements: dict[str, int] = {}
        self._matches = 0
        self._armed = fault is None or fault.after is None
        self._released = threading.Event()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._links: list[_Link] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(POLL_SECONDS)
        self.port: int = self._listener.getsockname()[1]
        self._deadline = time.monotonic() + lifetime
        self._thread = threading.Thread(target=self._accept, name="fault-proxy", daemon=True)
        self._thread.start()

    def dsn(self, dsn: str) -> str:
        """``dsn`` (a ``postgresql://`` URL) through this proxy, in clear text."""
        parts = urlsplit(dsn)
        query = [(k, v) for k, v in parse_qsl(parts.query) if k not in ("host", "port",
                                                                         "sslmode")]
        user = parts.netloc.rpartition("@")[0]
        netloc = f"{user}@127.0.0.1:{self.port}" if user else f"127.0.0.1:{self.port}"
        return urlunsplit(parts._replace(netloc=netloc, query=urlencode(
            [*query, ("sslmode", "disable")], quote_via=quote)))

    def close(self) -> None:
        """End every connection and stop listening; waits for the proxy's threads."""
        self._stop.set()
        self._thread.join(timeout=5)
        for link in list(self._links):
            link.close()
            link.join()
        self._listener.close()

    def __enter__(self) -> "FaultProxy":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._stop.is_set() and time.monotonic() < self._deadline:
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if len(self._links) >= self.max_connections:
                client.close()
                continue
            link = _Link(self, client)
            self._links.append(link)
            link.start()
        for link in list(self._links):  # the lifetime is over: nothing outlives it
            link.close()

    def release(self) -> None:
        """End a ``delay`` now: the held message goes on."""
        self._released.set()

    def held(self) -> bool:
        """Whether a ``delay`` still holds its message."""
        return self.running() and not self._released.is_set()

    def running(self) -> bool:
        return not self._stop.is_set() and time.monotonic() < self._deadline

    def matches(self, kind: str, text: str) -> bool:
        """Count ``text`` (a statement's SQL, or a reply's command tag) and say
        whether the fault acts on it now."""
        if kind == "statement":
            words = " ".join(text.split()[:2])[:40]
            with self._lock:
                self.statements[words] = self.statements.get(words, 0) + 1
        fault = self.fault
        if fault is None or self.fired.is_set():
            return False
        if not self._armed:
            self._armed = kind == "statement" and _contains(text, fault.after)
            if not self._armed:
                return False
        wanted = fault.statement if kind == "statement" else fault.reply
        if wanted is None or (not _contains(text, wanted) if kind == "statement"
                              else text != wanted):
            return False
        with self._lock:
            self._matches += 1
            hit = self._matches == fault.occurrence
            if hit:
                self.fired_at = time.monotonic()
                self.fired.set()
        return hit


def _contains(text: str, wanted: str | tuple[str, ...] | None) -> bool:
    """Whether ``text`` holds ``wanted``, or one of a tuple of texts."""
    if wanted is None:
        return False
    return any(part in text for part in ((wanted,) if isinstance(wanted, str) else wanted))


class _Link:
    """One client's connection and its server side: a thread per direction."""

    def __init__(self, proxy: FaultProxy, client: socket.socket) -> None:
        self.proxy = proxy
        self.client = client
        self.server = _connect(proxy.upstream)
        for sock in (client, self.server):
            if sock.family != socket.AF_UNIX:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.state = "open"  # open, blackhole, closed
        self.prepared: dict[str, str] = {}  # statement name -> SQL, for a Bind without Parse
        self.parsed_last = False
        self._closed = threading.Lock()
        self._threads = [threading.Thread(target=self._pump, args=(self.client, self.server,
                                                                   True), daemon=True),
                         threading.Thread(target=self._pump, args=(self.server, self.client,
                                                                   False), daemon=True)]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def join(self) -> None:
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(timeout=5)

    def close(self, *, reset: bool = False) -> None:
        with self._closed:
            if self.state == "closed":
                return
            self.state = "closed"
        if reset:  # SO_LINGER with a zero timeout: close sends RST, not FIN
            self.client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        for sock in (self.client, self.server):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def _pump(self, source: socket.socket, sink: socket.socket, from_client: bool) -> None:
        frames = _Frames(startup=from_client)
        try:
            source.settimeout(POLL_SECONDS)
        except OSError:  # the other direction has closed the link already
            self.close()
            return
        forwarded = 0
        while self.state != "closed" and self.proxy.running() and forwarded < MAX_READS:
            try:
                data = source.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                break
            if not data:
                break
            if self.state == "blackhole":
                continue  # dropped, as a network that lost it
            try:
                if not self._forward_all(frames.feed(data), sink, source, from_client):
                    return
                forwarded += 1
            except (OSError, ValueError):
                break
        if self.state == "blackhole":
            self._wait_out_blackhole()
        self.close()

    def _forward_all(self, messages: list[bytes], sink: socket.socket, source: socket.socket,
                     from_client: bool) -> bool:
        """Send the messages of one read on, in one write (small writes one by
        one would wait on each other's acknowledgements), up to the one the
        fault acts on; ``False`` once the link is closed."""
        out = bytearray()
        for message in messages:
            if from_client and message == b"SSL-or-GSS":
                source.sendall(b"N")  # no encryption: the client goes on in clear text
                continue
            moment = _moment(message, from_client, self)
            if moment is not None and self.proxy.matches(*moment):
                sink.sendall(out)  # what came before the moment arrives
                if not self._act():
                    return False
                out = bytearray()  # a delay is over: this message and the rest go on
            out += message
        sink.sendall(out)
        return True

    def _act(self) -> bool:
        """Do what the fault says, at its moment; ``False`` once the link is closed."""
        fault = self.proxy.fault
        assert fault is not None
        if fault.action == "delay":
            _sleep_while(fault.seconds, self.proxy.held)
            return True
        if fault.action == "blackhole":
            self.state = "blackhole"
            self._wait_out_blackhole()
        self.close(reset=fault.action == "reset")
        return False

    def _wait_out_blackhole(self) -> None:
        fault = self.proxy.fault
        assert fault is not None and self.proxy.fired_at is not None
        left = self.proxy.fired_at + fault.seconds - time.monotonic()
        _sleep_while(left, lambda: self.proxy.running() and self.state == "blackhole")


def _moment(message: bytes, from_client: bool, link: _Link) -> tuple[str, str] | None:
    """``("statement", sql)`` as a statement reaches the server, ``("reply",
    tag)`` as a command's answer leaves it; ``None`` for any other message."""
    kind = message[:1]
    if from_client:
        if kind == b"P":
            name, _, rest = message[5:].partition(b"\0")
            sql = rest.partition(b"\0")[0].decode("utf-8", "replace")
            link.prepared[name.decode("utf-8", "replace")] = sql
            link.parsed_last = True
            return "statement", sql
        if kind == b"B":
            parsed, link.parsed_last = link.parsed_last, False
            if parsed:
                return None
            name = message[5:].split(b"\0", 2)[1].decode("utf-8", "replace")
            return "statement", link.prepared.get(name, "")
        if kind == b"Q":
            return "statement", message[5:].rstrip(b"\0").decode("utf-8", "replace")
        return None
    if kind == b"C":
        return "reply", message[5:].rstrip(b"\0").decode("utf-8", "replace")
    return None


class _Frames:
    """Whole messages out of a byte stream: the startup packet (and any SSL or
    GSS request before it) without a type byte, then type byte + int32 length."""

    def __init__(self, *, startup: bool) -> None:
        self.buffer = bytearray()
        self.startup = startup

    def feed(self, data: bytes) -> list[bytes]:
        self.buffer += data
        messages = []
        while True:
            message = self._next()
            if message is None:
                return messages
            messages.append(message)

    def _next(self) -> bytes | None:
        head = 4 if self.startup else 5
        if len(self.buffer) < head:
            return None
        length = struct.unpack("!I", self.buffer[head - 4:head])[0]
        if length < 4 or length > MAX_FRAME:
            raise ValueError(f"not a PostgreSQL message: length {length}")
        size = length if self.startup else length + 1
        if len(self.buffer) < size:
            return None
        message = bytes(self.buffer[:size])
        del self.buffer[:size]
        if self.startup:
            code = struct.unpack("!I", message[4:8])[0] if size >= 8 else 0
            if code in (SSL_REQUEST, GSS_REQUEST):
                return b"SSL-or-GSS"  # answered by the proxy; the real startup follows
            self.startup = code == CANCEL_REQUEST  # nothing typed follows a cancel
        return message


def _upstream(dsn: str) -> tuple[int, object]:
    """The server's address: a Unix socket, or a loopback TCP address."""
    parts = urlsplit(dsn)
    query = dict(parse_qsl(parts.query))
    host = query.get("host") or parts.hostname or "/tmp"
    port = int(query.get("port") or parts.port or 5432)
    if host.startswith("/"):
        return socket.AF_UNIX, f"{host}/.s.PGSQL.{port}"
    if host not in LOOPBACK:
        raise ValueError(f"the fault proxy forwards only to this host, not to {host!r}")
    return socket.AF_INET6 if ":" in host else socket.AF_INET, (host, port)


def _connect(upstream: tuple[int, object]) -> socket.socket:
    family, address = upstream
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.settimeout(5)
    sock.connect(address)  # type: ignore[arg-type]
    return sock


def _sleep_while(seconds: float, going_on: Callable[[], bool]) -> None:
    """Wait up to ``seconds``, in short steps, while ``going_on()``."""
    end = time.monotonic() + max(0.0, seconds)
    while going_on() and (left := end - time.monotonic()) > 0:
        time.sleep(min(POLL_SECONDS, left))
