"""Where a queue's contents came from: each start signs its queue, each call on it is witnessed.

A check that judged a queue by its contents alone would accept a queue that
someone else built (a course helper, in another folder), or rows written by
hand in the engine's own shape. So every ``start_N`` records, beside the
queue file, a **witness**: a file of entries, each signed (HMAC-SHA256) with
a key that exists only in this kernel's memory. The first entry names the
exercise and a random nonce, and signs a digest of the file's whole content
(every row of every table). The queue that ``start_N`` hands out is a
``WitnessedQueue``: every write transaction it runs, whatever the call,
reads the content's digest under the write lock before and after its
statements, and signs the pair. A worker process that a start's runner
starts (exercise 6's naive worker) gets the key in its arguments and signs
the same way; the exercise 7 consumers run in the kernel.

A check then asks three things of the file it is given:

- was it handed out by ``start_N`` in this kernel (the registry below, and
  the witness's nonce)? A queue built elsewhere, by a helper, by the
  learner's own ``Queue(...)`` or in an earlier kernel, is not;
- does its content now have a digest that a witnessed call signed? A row
  written, changed or deleted with SQL of one's own has none;
- did every witnessed call start from a signed state? A hand edit followed
  by a call (which would sign the edited content) is recorded as such.

What it cannot see: the key is in this kernel's memory, so code that reads
it (or that runs the engine's own calls on a ``WitnessedQueue`` to reach a
state) can sign anything; the witness proves that a state was reached
through the package's calls on the queue the start handed out, not which
calls a learner meant to make. EXERCISES.md says so.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import sqlite3
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from ...queue import Queue
from ...storage import connect_readonly, read_transaction

_KEY = secrets.token_bytes(32)  # this kernel's: a new kernel (or process) has another
_STARTED: dict[str, "Witness"] = {}  # queue file -> the witness of the start that built it last
SUFFIX = ".witness"


@dataclass(frozen=True)
class Witness:
    """The signed record of one start's queue file and of every witnessed call on it."""

    record: str
    exercise: int
    nonce: str
    key: bytes = field(repr=False, default=_KEY)

    def sign(self, kind: str, before: str, after: str, what: str | None = None) -> None:
        """Append one signed entry: ``start``, ``call`` or ``tampered``; ``what`` names
        the call where a check needs to know it (``enqueue``)."""
        entry = {"kind": kind, "exercise": self.exercise, "nonce": self.nonce,
                 "before": before, "after": after, **({"what": what} if what else {})}
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
                if entry.get("kind") in ("start", "call") and self.genuine(entry)}

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
    """SHA-256 of every row of every table of the file, in a fixed order."""
    digest = hashlib.sha256()
    tables = [row[0] for row in conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' "
        "ORDER BY name")]
    for table in tables:
        width = len(conn.execute(f'SELECT * FROM "{table}" LIMIT 0').description)
        order = ", ".join(str(i) for i in range(1, width + 1))
        digest.update(f"{table}\n".encode())
        for row in conn.execute(f'SELECT * FROM "{table}" ORDER BY {order}'):
            digest.update(repr(row).encode() + b"\n")
    return digest.hexdigest()


def file_digest(path: str | os.PathLike[str]) -> str:
    """``content_digest`` of the file at ``path``, read as the engine reads: one read
    transaction on a read-only connection."""
    conn = connect_readonly(path)
    try:
        with read_transaction(conn):
            return content_digest(conn)
    finally:
        conn.close()


class WitnessedQueue(Queue):
    """A ``Queue`` whose every write transaction signs the content it found and left."""

    def __init__(self, path: str | os.PathLike[str], *, witness: Witness, **options: Any) -> None:
        self.witness = witness
        self._what: str | None = None
        super().__init__(path, **options)

    def transaction(self, *, relaxed: bool = False) -> Any:
        return self._witnessed(super().transaction(relaxed=relaxed))

    def enqueue(self, batch: Any) -> Any:
        """``Queue.enqueue``, its transaction signed as an enqueue (exercise 8 asks
        whether a replay ran after the prune)."""
        self._what = "enqueue"
        try:
            return super().enqueue(batch)
        finally:
            self._what = None

    @contextmanager
    def _witnessed(self, inner: Any) -> Iterator[sqlite3.Connection]:
        with inner as conn:
            before = content_digest(conn)  # under the write lock: nobody changes it meanwhile
            if before not in self.witness.signed():
                self.witness.sign("tampered", before, before)
            yield conn
            self.witness.sign("call", before, content_digest(conn), self._what)


def queue_signing_as(witness: Witness | None, path: str | os.PathLike[str],
                     **options: Any) -> Queue:
    """A queue on ``path`` that signs as ``witness`` does (a plain one for ``None``)."""
    if witness is None:
        return Queue(path, **options)
    return WitnessedQueue(path, witness=witness, **options)


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
    digest = file_digest(queue.path)
    witness.sign("start", digest, digest)
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

    kind: str       # foreign, rebuilt, record, tampered
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
    if any(entry["kind"] == "tampered" for entry in entries):
        return Refused("tampered", f"{mine}'s file was changed around the package's calls "
                       f"before a later call on {mine} (SQL of your own, or a Queue of your own "
                       "on its file)", again)
    if file_digest(path) not in witness.signed():
        return Refused("tampered", f"{mine}'s file was changed around the package's calls "
                       f"since the last call on {mine} (SQL of your own, or a Queue of your own "
                       "on its file)", again)
    return None
