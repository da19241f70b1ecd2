"""Where a queue's contents came from: each start signs its queue, each call on it is witnessed.

A check that judged a queue by its contents alone would accept a queue that
someone else built (a course helper, in another folder), or rows written by
hand in the engine's own shape. So every ``start_N`` records, beside the
queue file, a **witness**: a file of entries, each signed (HMAC-SHA256) with
a key that exists only in this kernel's memory. The first entry names the
exercise and a random nonce, and signs a digest of the file's whole content
(every row of every table). The queue that ``start_N`` hands out is a
``WitnessedQueue``: every write transaction it runs reads the content's
digest under the write lock before and after its statements, and signs the
pair, with the name of the package's call that opened it (``enqueue``,
``claim_batch``, ``complete``, ... ``ENGINE_CALLS``). A transaction opened
any other way, a bare ``with q.transaction() as c:`` of the learner's, is
signed as ``sql``, with the tables its statements changed: SQL of one's
own, even inside the queue's own transaction. A call whose handler is one
of the learner's own, whose ``apply`` or ``fault`` (the methods given the
ACK's connection) is not ``Handler``'s, is signed with that handler's name,
since what such a method writes cannot be told from the ACK's own rows. A
worker process that a start's runner starts (exercise 6's naive worker)
gets the key in its arguments and signs the same way, its steps as
``naive step``; the exercise 7 consumers run in the kernel. Each entry also
notes the journal's last sequence number before and after it, so that a
check can name a journal row that no call wrote (``journal_by_hand``: a
claim forged by hand), and an enqueue's entry the priority it was given.

A check then asks three things of the file it is given:

- was it handed out by ``start_N`` in this kernel (the registry below, and
  the witness's nonce)? A queue built elsewhere, by a helper, by the
  learner's own ``Queue(...)`` or in an earlier kernel, is not;
- does its content now have a digest that a witnessed call signed? A row
  written, changed or deleted with SQL of one's own has none;
- did any transaction run SQL of one's own (``sql``), or a handler of one's
  own that writes with the ACK's connection? Exercise 7's own ledger table
  is an exception (``OWN_TABLES``): its check judges that table itself; and
  exercise 6's naive steps are signed as its runner's (``signed_as``);
- did every witnessed call start from a signed state? A hand edit followed
  by a call (which would sign the edited content) is recorded as such.

Inside a witnessed call, a statement that writes and was run from code
outside the package (a clock of one's own, a handler's ``effect_of``, SQL
in a ``_calling`` block: code the call runs back, within its transaction)
is noted in the call's entry (``own_sql``), and the check refuses it.

What it cannot see: the key is in this kernel's memory, so code that reads
it (or that runs the engine's own calls on a ``WitnessedQueue`` to reach a
state, or runs statements inside ``_calling`` from code compiled under a
file name of the package's) can sign anything; the witness proves that a state was reached
through the package's calls on the queue the start handed out, not which
calls a learner meant to make. EXERCISES.md says so.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import os
import secrets
import sqlite3
import sys
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from ...audit import CONTRAST_LEDGER
from ...handler import Handler
from ...priority import DEFAULT_PRIORITY
from ...queue import Queue
from ...sqlite import connect_readonly, read_transaction

_KEY = secrets.token_bytes(32)  # this kernel's: a new kernel (or process) has another
_STARTED: dict[str, "Witness"] = {}  # queue file -> the witness of the start that built it last
SUFFIX = ".witness"
# The package's calls that write, each in write transactions of its own: a
# transaction opened in any other way runs its caller's SQL.
ENGINE_CALLS = ("enqueue", "claim_batch", "complete", "complete_and_claim", "complete_batch",
                "fail", "release", "redrive", "extend", "prune")
# The handler's methods that the ACK hands its connection to.
HANDLER_HOOKS = ("apply", "fault")
# The tables an exercise's own SQL may write (exercise 7's naive ledger, which
# its check judges itself); every other table is the queue's.
OWN_TABLES: dict[int, frozenset[str]] = {7: frozenset({CONTRAST_LEDGER})}


@dataclass(frozen=True)
class Witness:
    """The signed record of one start's queue file and of every witnessed call on it."""

    record: str
    exercise: int
    nonce: str
    key: bytes = field(repr=False, default=_KEY)

    def sign(self, kind: str, before: str, after: str, **details: Any) -> None:
        """Append one signed entry: ``start``, ``call`` (``what``: the package's call,
        ``events`` and ``priority``: an enqueue's event ids and the priority it was
        given, ``handler``: a handler of the caller's own), ``sql`` (``tables``: what
        SQL of the caller's own changed) or ``tampered``. ``journal`` is the journal's
        last sequence number before and after (the rows between are the entry's)."""
        entry = {"kind": kind, "exercise": self.exercise, "nonce": self.nonce,
                 "before": before, "after": after, **details}
        line = json.dumps({**entry, "mac": _mac(self.key, entry)}, sort_keys=True)
        with open(self.record, "a", encoding="utf-8") as out:
            out.write(line + "\n")

    def entries(self) -> list[dict[str, Any]] | None:
        """The record's entries; ``None`` if it is gone or cannot be read."""
        try:
            with open(self.record, encoding="utf-8") as record:
                return [json.loads(line) for line in record if line.strip()]
        except (OSError, ValueError):
            return None

    def genuine(self, entry: dict[str, Any]) -> bool:
        body = {k: v for k, v in entry.items() if k != "mac"}
        return (isinstance(entry.get("mac"), str) and entry.get("nonce") == self.nonce
                and hmac.compare_digest(entry["mac"], _mac(self.key, body)))

    def signed(self) -> set[str]:
        """The content digests that this start or a witnessed call left behind."""
        return {entry["after"] for entry in self.entries() or ()
                if entry.get("kind") in ("start", "call", "sql") and self.genuine(entry)}

    def spec(self) -> dict[str, Any]:
        """What a worker process needs to sign as this witness (JSON)."""
        return {"record": self.record, "exercise": self.exercise, "nonce": self.nonce,
                "key": self.key.hex()}

    @classmethod
    def from_spec(cls, spec: dict[str, Any]) -> "Witness":
        return cls(spec["record"], spec["exercise"], spec["nonce"], bytes.fromhex(spec["key"]))


def _mac(key: bytes, entry: dict[str, Any]) -> str:
    return hmac.new(key, json.dumps(entry, sort_keys=True).encode(), hashlib.sha256).hexdigest()


def content_digest(conn: sqlite3.Connection) -> str:
    """SHA-256 of the whole file's content in a fixed order: every object of its
    schema (tables, indexes, triggers, views, as their SQL) and every row of every
    table. A trigger of one's own is content too: it would make the engine's own
    statements write rows of one's own."""
    digest = hashlib.sha256()
    for name, part in sorted(table_digests(conn).items()):
        digest.update(f"{name}\n{part}\n".encode())
    return digest.hexdigest()


def table_digests(conn: sqlite3.Connection) -> dict[str, str]:
    """SHA-256 of each object of the schema, by name: a table's SQL and rows under
    the table's name, any other object's SQL under its kind and name
    (``trigger forge``)."""
    digests = {}
    for kind, name, sql in conn.execute(
            "SELECT type, name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%' "
            "ORDER BY type, name").fetchall():
        digest = hashlib.sha256(f"{sql}\n".encode())
        if kind == "table":
            for row in _rows(conn, name):
                digest.update(repr(row).encode() + b"\n")
            digests[name] = digest.hexdigest()
        else:
            digests[f"{kind} {name}"] = digest.hexdigest()
    return digests


def _rows(conn: sqlite3.Connection, table: str) -> Iterator[tuple[Any, ...]]:
    width = len(conn.execute(f'SELECT * FROM "{table}" LIMIT 0').description)
    order = ", ".join(str(i) for i in range(1, width + 1))
    return iter(conn.execute(f'SELECT * FROM "{table}" ORDER BY {order}'))


def journal_end(conn: sqlite3.Connection) -> int:
    """The journal's last sequence number (0 while it is empty)."""
    return conn.execute("SELECT coalesce(max(seq), 0) FROM transitions").fetchone()[0]


def file_digest(path: str | os.PathLike[str]) -> str:
    """``content_digest`` of the file at ``path``, read as the engine reads: one read
    transaction on a read-only connection."""
    return _file_state(path)[0]


def _file_state(path: str | os.PathLike[str]) -> tuple[str, int]:
    """``content_digest`` and ``journal_end`` of the file at ``path``, in one read."""
    conn = connect_readonly(path)
    try:
        with read_transaction(conn):
            return content_digest(conn), journal_end(conn)
    finally:
        conn.close()


class WitnessedQueue(Queue):
    """A ``Queue`` whose every write transaction signs the content it found and left,
    and who opened it: one of the package's calls (``ENGINE_CALLS``), or the caller's
    own SQL in a bare ``transaction()``."""

    def __init__(self, path: str | os.PathLike[str], *, witness: Witness, **options: Any) -> None:
        self.witness = witness
        self._call: dict[str, Any] | None = None
        super().__init__(path, **options)

    def transaction(self, *, relaxed: bool = False) -> Any:
        return self._witnessed(super().transaction(relaxed=relaxed), self._call)

    @contextmanager
    def _calling(self, what: str, **details: Any) -> Iterator[None]:
        """Sign the write transactions opened in the block as the call ``what`` (a call
        inside another one is signed as the outer one). The course's own runners use
        it for the steps they run (exercise 6's naive worker)."""
        if self._call is not None:
            yield
            return
        self._call = {"what": what, **details}
        try:
            yield
        finally:
            self._call = None

    def enqueue(self, batch: Any, **options: Any) -> Any:
        """``Queue.enqueue``, its transaction signed with the batch's event ids
        (exercise 8 asks which event a replay after the prune carried) and the
        priority it was given."""
        events = [getattr(event, "event_id", None) for event in getattr(batch, "events", ())]
        priority = options.get("priority", DEFAULT_PRIORITY)  # exercise 10 asks which was given
        with self._calling("enqueue", events=events, priority=priority):
            return super().enqueue(batch, **options)

    @contextmanager
    def _witnessed(self, inner: Any, call: dict[str, Any] | None) -> Iterator[sqlite3.Connection]:
        with inner as conn:
            before = content_digest(conn)  # under the write lock: nobody changes it meanwhile
            begun = journal_end(conn)
            if before not in self.witness.signed():
                self.witness.sign("tampered", before, before, journal=[begun, begun])
            tables = table_digests(conn) if call is None else {}
            own: list[str] = []
            if call is not None:  # code the call runs back (a clock, effect_of) is not the call
                conn.set_trace_callback(_statements_from_outside(own))
            try:
                yield conn
            finally:
                if call is not None:
                    conn.set_trace_callback(None)
            after, journal = content_digest(conn), [begun, journal_end(conn)]
            if call is not None:
                self.witness.sign("call", before, after, **call, journal=journal,
                                  **({"own_sql": sorted(set(own))} if own else {}))
                return
            now = table_digests(conn)
            changed = sorted(t for t in set(tables) | set(now) if tables.get(t) != now.get(t))
            self.witness.sign("sql", before, after, tables=changed, journal=journal)


_PACKAGE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__)))) + os.sep
_READS = ("SELECT", "EXPLAIN")


@functools.lru_cache(maxsize=256)
def _in_package(filename: str) -> bool:
    """Whether code of the file ``filename`` (a code object's) is the package's own."""
    return os.path.realpath(filename).startswith(_PACKAGE)


def _statements_from_outside(found: list[str]) -> Callable[[str], None]:
    """A trace callback that notes the first word of every statement that is no read
    and was run from code outside the package (``found``): inside a witnessed call,
    that is code the call ran back, a clock of one's own or a handler's
    ``effect_of``, writing with the queue's connection within the call's own
    transaction. The frame above the callback is the one that called ``execute``."""
    def traced(statement: str) -> None:
        first = _first_word(statement)
        if first in _READS:
            return
        if not _in_package(sys._getframe(1).f_code.co_filename):
            found.append(first)
    return traced


def _first_word(statement: str) -> str:
    """The first word of ``statement`` past its leading comments and blanks, in capitals
    (a trigger's own lines, ``-- TRIGGER ...``, give ``""``: only the engine's
    statements, in the package's code, fire the schema's triggers)."""
    text = statement.lstrip()
    while text.startswith(("--", "/*")):
        end = text.find("\n") if text.startswith("--") else text.find("*/")
        if end < 0:
            return ""
        text = text[end + (1 if text.startswith("--") else 2):].lstrip()
    words = text.split(None, 1)
    return words[0].upper() if words else ""


def _signed_as(name: str) -> Callable[..., Any]:
    """``Queue.<name>``, its write transactions signed as that call (with the handler's
    name where the handler is one of the caller's own)."""
    engine = getattr(Queue, name)
    acks = name.startswith("complete")  # (lease or leases, handler)

    def call(self: WitnessedQueue, *args: Any, **kwargs: Any) -> Any:
        handler = kwargs.get("handler", args[1] if len(args) > 1 else None) if acks else None
        with self._calling(name, **own_handler(handler)):
            return engine(self, *args, **kwargs)
    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"``Queue.{name}``, its write transactions signed as ``{name}``."
    return call


for _name in ENGINE_CALLS:
    if _name != "enqueue":
        setattr(WitnessedQueue, _name, _signed_as(_name))


def own_handler(handler: Any) -> dict[str, Any]:
    """What a call's entry says of a handler that is not the course's ``Handler``:
    its class's name, and which of ``HANDLER_HOOKS`` (the methods given the ACK's
    connection) it does not take from ``Handler`` (nothing for the course's own)."""
    if handler is None:
        return {}
    own = getattr(handler, "__dict__", {}).keys() & {*HANDLER_HOOKS, "effect_of"}  # set on it
    if type(handler) is Handler and not own:
        return {}
    hooks = [hook for hook in HANDLER_HOOKS
             if getattr(getattr(handler, hook, None), "__func__", None)
             is not getattr(Handler, hook)]
    return {"handler": type(handler).__name__, "hooks": hooks}


def queue_signing_as(witness: Witness | None, path: str | os.PathLike[str],
                     **options: Any) -> Queue:
    """A queue on ``path`` that signs as ``witness`` does (a plain one for ``None``)."""
    if witness is None:
        return Queue(path, **options)
    return WitnessedQueue(path, witness=witness, **options)


def signed_as(queue: Queue, what: str) -> AbstractContextManager[None]:
    """``queue._calling(what)`` on a ``WitnessedQueue``; nothing on another queue. For the
    course's own runners: the steps they run are the exercise's route, not SQL of the
    learner's own around it."""
    return queue._calling(what) if isinstance(queue, WitnessedQueue) else nullcontext()


def record_path(path: str | os.PathLike[str]) -> str:
    return os.fspath(path) + SUFFIX


def forget(path: str | os.PathLike[str]) -> None:
    """Remove the witness of the queue file at ``path`` (a start begins anew)."""
    Path(record_path(path)).unlink(missing_ok=True)


def hand_out(queue: Queue, exercise: int) -> WitnessedQueue:
    """Sign ``queue``'s file as ``start_{exercise}`` built it, and return the queue to
    hand out: a ``WitnessedQueue`` on the same file, clock and lease."""
    forget(queue.path)
    witness = Witness(os.path.abspath(record_path(queue.path)), exercise, secrets.token_hex(8))
    digest, end = _file_state(queue.path)
    witness.sign("start", digest, digest, journal=[end, end])
    _STARTED[_key(queue.path)] = witness
    return WitnessedQueue(queue.path, witness=witness, clock=queue.clock,
                          lease_seconds=queue.lease_seconds, max_attempts=queue.max_attempts)


def started(path: str | os.PathLike[str]) -> Witness | None:
    """The witness of the start that built the file at ``path`` last, in this kernel."""
    return _STARTED.get(_key(path))


def _key(path: str | os.PathLike[str]) -> str:
    return os.path.realpath(path)


@dataclass(frozen=True)
class Refused:
    """Why a check does not accept the file's contents as the learner's work."""

    kind: str       # foreign, rebuilt, record (a check stops there); sql, handler, tampered
    what: str
    next_step: str


def provenance(path: str | os.PathLike[str], exercise: int, queue: Any) -> Refused | None:
    """Whether the file at ``path`` holds only work done through the package's calls
    on the queue ``start_{exercise}`` handed out in this kernel (None: it does)."""
    mine = f"q{exercise}"
    start = f"`{mine} = exercises.start_{exercise}(workdir)`"
    again = (f"run `start_{exercise}` again ({start}) and change the queue only through "
             f"{mine}'s calls")
    witness = _STARTED.get(_key(path))
    if witness is None or witness.exercise != exercise:
        return Refused("foreign", f"that queue was not handed out by start_{exercise} in this "
                       "kernel (a course helper's, a copy of a start's file, one your own code "
                       "built, or one from before the kernel restarted), so its contents say "
                       "nothing about your cells",
                       f"run {start}, then your cells on that {mine}, and pass it here")
    held = getattr(queue, "witness", None)
    if isinstance(held, Witness) and held.nonce != witness.nonce:
        return Refused("rebuilt", f"start_{exercise} has built this file again since that "
                       f"{mine} was handed out: the file holds the newer start now, not the "
                       f"older {mine}'s work", f"run your cells on the {mine} that the last "
                       f"{start} returned (or run that start once more, then your cells)")
    entries = witness.entries()
    if entries is None or not entries:
        return Refused("record", f"{mine}'s witness (the file {os.path.basename(witness.record)} "
                       "beside it, which records each call) is gone", again)
    if not all(witness.genuine(entry) for entry in entries):
        return Refused("record", f"{mine}'s witness was edited: an entry's signature does "
                       "not match", again)
    own = own_sql(entries, exercise)
    if own:
        return Refused("sql", f"{mine}'s file was changed by SQL of your own, run inside "
                       f"`{mine}.transaction()` (it changed {_named(own)}): a transaction you "
                       "open yourself is not one of the package's calls, though it runs on "
                       f"{mine}", again)
    # a handler's own hook that wrote is named as the handler, not as the SQL it ran
    handlers = sorted({(entry["handler"], hook) for entry in entries if entry["kind"] == "call"
                       for hook in entry.get("hooks", ())})
    if handlers:
        name, hooks = handlers[0][0], [hook for n, hook in handlers if n == handlers[0][0]]
        return Refused("handler", f"a handler of your own ({name}, whose "
                       f"{' and '.join(hooks)} {'is' if len(hooks) == 1 else 'are'} not "
                       f"Handler's) ran inside {mine}'s ACK with the ACK's connection, so what "
                       "it wrote there cannot be told from the package's own work",
                       f"run `start_{exercise}` again ({start}) and process with the course's "
                       "Handler (`Handler()`, or `Handler().supporting(...)`)")
    inside = sorted({entry.get("what", "") for entry in entries
                     if entry["kind"] == "call" and entry.get("own_sql")})
    if inside:
        calls = ", ".join(f"`{mine}.{what}()`" for what in inside)
        return Refused("sql", f"SQL of your own ran inside {calls}: code that the call runs "
                       f"back (a clock of your own, a handler's effect_of) wrote with {mine}'s "
                       "connection within the call's own transaction, so what the call left "
                       "cannot be told from the package's own work", again)
    if any(entry["kind"] == "tampered" for entry in entries):
        return Refused("tampered", f"{mine}'s file was changed around the package's calls "
                       f"before a later call on {mine} (SQL of your own, or a Queue of your own "
                       "on its file)", again)
    if file_digest(path) not in witness.signed():
        return Refused("tampered", f"{mine}'s file was changed around the package's calls "
                       f"since the last call on {mine} (SQL of your own, or a Queue of your own "
                       "on its file)", again)
    return None


def _named(changed: list[str]) -> str:
    """``the tables a, b`` and ``the trigger t``: what ``table_digests`` keys name."""
    tables = [name for name in changed if " " not in name]
    said = [f"the table{'s' if len(tables) > 1 else ''} {', '.join(tables)}"] if tables else []
    said += [f"the {name}" for name in changed if " " in name]
    return " and ".join(said)


def own_sql(entries: list[dict[str, Any]], exercise: int) -> list[str]:
    """The queue's tables that SQL of the caller's own changed (``sql`` entries),
    the exercise's own tables (``OWN_TABLES``) aside."""
    allowed = OWN_TABLES.get(exercise, frozenset())
    return sorted({table for entry in entries if entry["kind"] == "sql"
                   for table in entry.get("tables", ()) if table not in allowed})


def handlers_used(path: str | os.PathLike[str]) -> list[str]:
    """The names of the handlers of the caller's own that the signed calls on the file
    at ``path`` ran (in the order first used): none for the course's ``Handler``."""
    witness = _STARTED.get(_key(path))
    entries = witness.entries() or [] if witness is not None else []
    return list(dict.fromkeys(entry["handler"] for entry in entries
                              if entry.get("kind") == "call" and "handler" in entry))


def signed_calls(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The entries of the package's calls signed on the file at ``path`` since its
    start, in order (a call that changed nothing included: a claim that found nothing
    due)."""
    witness = _STARTED.get(_key(path))
    if witness is None:
        return []
    return [entry for entry in witness.entries() or ()
            if entry.get("kind") == "call" and witness.genuine(entry)]


def calls_made(path: str | os.PathLike[str]) -> list[str]:
    """The names of the package's calls signed on the file at ``path`` since its start."""
    return [entry.get("what", "") for entry in signed_calls(path)]


def journal_by_hand(path: str | os.PathLike[str]) -> list[int]:
    """The sequence numbers of the journal rows of the file at ``path`` that neither
    its start nor a witnessed call of the package's wrote: rows written with SQL of
    one's own (in ``transaction()`` too), from another connection, or by a queue of
    one's own on the file. Empty when the file has no start's witness here."""
    witness = _STARTED.get(_key(path))
    entries = [entry for entry in witness.entries() or () if witness.genuine(entry)] \
        if witness is not None else []
    spans = [entry["journal"] for entry in entries
             if entry.get("kind") in ("start", "call") and len(entry.get("journal", ())) == 2]
    if not spans:
        return []
    conn = connect_readonly(path)
    try:
        with read_transaction(conn):
            seqs = [row[0] for row in conn.execute("SELECT seq FROM transitions ORDER BY seq")]
    finally:
        conn.close()
    start_end = spans[0][1]
    return [seq for seq in seqs if seq > start_end
            and not any(first < seq <= last for first, last in spans[1:])]
