"""Running a parsed command: what each command does, and how its errors are answered."""

from __future__ import annotations

import argparse
import errno
import os
import signal
import sqlite3
import sys
from contextlib import contextmanager, nullcontext
from typing import Any, Iterator

from ..cli_text import metrics_lines, status_lines, work_summary
from ..clock import Clock, ModelClock, SystemClock
from ..errors import (CONNECTION_LOST_OUTCOME, ConnectionLost, IntegrityViolation, LockTimeout,
                      QueueError, UnusableFile)
from ..handler import Handler
from ..ids import COURSE, GENERAL, require_same_rule
from ..ingest import read_batch, require_ids
from ..migrations import migrate
from ..queue import Queue, require_event_id
from ..sqlite import file_rule, may_write, read, roll_back_hot_journal, unwritable
from ..stores import is_connection_string, open_store
from ..values import Lease, Outcome
from ..worker import drain
from . import (DEFAULT_LEASE_SECONDS, EXIT_BROKEN_PIPE, EXIT_OPERATIONAL, EXIT_REFUSED,
               EXIT_SIGNAL, READING_COMMANDS)


def run(args: argparse.Namespace) -> int:
    """Run the parsed command; answer every error it meets with its code and exit status."""
    try:
        return _run(args)
    except KeyboardInterrupt:  # Ctrl-C outside work's loop: nothing was left half-done
        print("stopped by SIGINT", file=sys.stderr)
        return EXIT_SIGNAL[signal.SIGINT]
    except BrokenPipeError:
        _silence_stdout()  # the reader left: nothing more to say, and no second error at exit
        return EXIT_BROKEN_PIPE
    except OSError as exc:
        if exc.filename is not None:  # a file the command was given: refused input
            print(f"error: os_error: {exc.filename}: {exc.strerror}", file=sys.stderr)
            return EXIT_OPERATIONAL
        _silence_stdout()
        print(f"error: output_failed: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_OPERATIONAL
    except (IntegrityViolation, UnusableFile, ConnectionLost, LockTimeout) as exc:
        # the file, the server or the network, not the input, is the problem
        print(f"error: {exc.code}: {exc}", file=sys.stderr)
        return EXIT_OPERATIONAL
    except QueueError as exc:
        print(_refusal(exc), file=sys.stderr)
        return EXIT_REFUSED
    except Exception as exc:  # noqa: BLE001 - only a database's own errors are answered here
        if not _is_database_error(exc):
            raise
        if _is_connection_lost(exc):
            print(f"error: connection_lost: {open_store(args.db).describe()}: {_one_line(exc)}; "
                  f"{CONNECTION_LOST_OUTCOME}", file=sys.stderr)
            return EXIT_OPERATIONAL
        where = open_store(args.db).describe() if is_connection_string(args.db) else args.db
        print(f"error: database_error: {where}: {_one_line(exc)}", file=sys.stderr)
        return EXIT_OPERATIONAL


def _known_rule(args: argparse.Namespace) -> str:
    """The id rule input is checked against before the queue is opened: the one
    ``--ids`` gives, else the file's own (read as a reading command reads), the
    course's for a file that is no queue yet. A PostgreSQL server is not reached
    before the input is checked: there the general rule refuses what no queue
    could hold, and the queue's own rule is checked once connected."""
    given = getattr(args, "ids", None)
    if is_connection_string(args.db):
        return GENERAL
    try:
        rule = file_rule(args.db)
    except (UnusableFile, OSError, sqlite3.Error):  # the command meets it again, and says so
        return given or COURSE
    if rule is None:  # no queue yet: enqueue creates one with the rule given
        return given or COURSE
    if given is not None:  # a queue's rule is chosen once: a second choice is refused first
        require_same_rule(args.db, rule, given)
    return rule


def _run(args: argparse.Namespace) -> int:
    if args.command == "demo":
        from ..lab.story import run_demo  # the course's scenario, with a real crashing child
        run_demo(say=_say)
        return 0
    rule = _known_rule(args) if args.command in ("enqueue", "redrive") else COURSE
    # A rejected batch must leave no trace, not even a new empty database file.
    batch = read_batch(args.file, ids=rule) if args.command == "enqueue" else None
    if args.command == "redrive":  # refused input, before any queue is opened
        require_event_id(args.event_id, rule)
    reading = args.command in READING_COMMANDS
    if not is_connection_string(args.db):
        _require_folder(args.db)
        if not reading and (args.command == "enqueue" or os.path.exists(args.db)):
            # SQLite would open a file it may not write read-only, silently, make
            # the -wal and -shm it then cannot remove, and fail at the first write.
            refused = unwritable(args.db)
            if refused is not None:
                raise refused
        # Before the file's header is checked: a writer killed during COMMIT leaves a
        # header that counts pages not yet written, which would read as a truncated file.
        roll_back_hot_journal(args.db)
    if batch is not None and is_connection_string(args.db):
        # checked against the general rule before the server was reached: now its own
        from ..postgres import PostgresStore
        store = PostgresStore(args.db)
        here = store.rule_here()
        if here is not None and args.ids is not None:
            require_same_rule(store.describe(), here, args.ids)
        require_ids(batch, here or args.ids or COURSE)
    clock: Clock = ModelClock(args.now) if args.now is not None else _system_clock(args.db)
    # Only enqueue creates: a mistyped --db must not become a new, empty queue.
    queue = Queue(args.db, clock=clock, create=args.command == "enqueue",
                  lease_seconds=getattr(args, "lease_seconds", DEFAULT_LEASE_SECONDS),
                  ids=getattr(args, "ids", None))
    if not reading and not is_connection_string(args.db):  # the file is the queue's: sound?
        _refuse_damaged(args.db)
    if batch is not None:
        result = queue.enqueue(batch, priority=args.priority)
        _say(f"inserted {result.inserted}, duplicates {result.duplicates}")
    elif args.command == "work":
        return _work(queue, Handler().supporting(*args.accept), args.batch_size,
                     args.max_messages)
    elif reading:
        # Where it may write, on a connection that may (it removes what a killed writer
        # left); elsewhere each read leaves the folder as it found it (``sqlite.read``).
        closing = _closing_last(queue, query_only=True) \
            if is_connection_string(args.db) or may_write(args.db) else nullcontext()
        with closing:
            lines = status_lines(queue.status(), as_json=args.json) if args.command == "status" \
                else metrics_lines(queue.metrics(), as_json=args.json,
                                   model_time=args.now is not None)
        for line in lines:
            _say(line)
    elif args.command == "redrive":
        queue.redrive(args.event_id)
        _say(f"{args.event_id} is ready again (attempts reset, generation kept)")
    elif args.command == "prune":
        for line in queue.prune(args.older_than).lines():
            _say(line)
    elif args.command == "migrate":
        for line in migrate(args.db).lines():
            _say(line)
    return 0


def _refuse_damaged(path: str) -> None:
    """Refuse to write to a file whose pages SQLite finds damaged (``PRAGMA quick_check``).

    SQLite meets a damaged page only when a statement reads it: a writing
    command would otherwise commit into the sound pages of a damaged file
    (a batch stored, messages worked) before it met the damage, if ever. One
    read of every page, before the first write, costs what reading the file
    costs; reading commands report what they can read, as before.
    """
    found = read(path, lambda conn: [row[0] for row in conn.execute("PRAGMA quick_check(3)")])
    if found != ["ok"]:
        said = "; ".join(part.strip() for row in found for part in str(row).splitlines()
                         if part.strip() and not part.startswith("***"))  # one line
        raise UnusableFile("not_a_database", f"{path} is damaged: SQLite's quick_check found "
                           f"{said[:200]}; nothing was written. A damaged file is "
                           "outside the guarantee (README: where the guarantee ends): restore "
                           "it from a copy")


def _require_folder(path: str) -> None:
    """Refuse a file path whose folder is missing (or is a file), before any file is made."""
    folder = os.path.dirname(path) or "."
    if not os.path.isdir(folder):
        missing = not os.path.exists(folder)
        code = errno.ENOENT if missing else errno.ENOTDIR
        why = f"the folder {folder} does not exist" if missing else \
            f"{folder} is a file, not a folder"
        raise OSError(code, f"{os.strerror(code)} ({why})", path)


@contextmanager
def _closing_last(queue: Queue, *, query_only: bool = False) -> Iterator[None]:
    """Run the command's calls on one connection that may write, closed at the end.

    SQLite removes the ``-wal`` and ``-shm`` files beside a queue file when
    the last connection to it closes, but only if that connection may write:
    one opened read-only (``mode=ro``) leaves them behind. With
    ``query_only`` no statement on it can write; closing last, it does what
    every last connection does: it copies into the file what a killed
    writer committed to the WAL, then removes both. (Where this user may not
    write, a reading command opens no session: each read then leaves the
    folder as it found it, ``sqlite.read``.)
    """
    with queue.session():
        if query_only and isinstance(queue.connection, sqlite3.Connection):
            queue.connection.execute("PRAGMA query_only = ON")
        yield


def _system_clock(db: str) -> Clock:
    """This host's clock for a file; the server's for a database that many hosts share."""
    if is_connection_string(db):
        from ..postgres import DatabaseClock
        return DatabaseClock(db)
    return SystemClock()


def _is_database_error(exc: Exception) -> bool:
    if isinstance(exc, sqlite3.Error):
        return True
    psycopg = sys.modules.get("psycopg")  # loaded only if a connection string was given
    return psycopg is not None and isinstance(exc, psycopg.Error)


def _is_connection_lost(exc: Exception) -> bool:
    """A PostgreSQL connection that broke under the command (a restart, a
    terminated backend, a network drop), as opposed to a refused statement."""
    if sys.modules.get("psycopg") is None:
        return False
    from ..postgres.session import session_ended
    return session_ended(exc)


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())


def _work(queue: Queue, handler: Handler, batch_size: int, limit: int | None) -> int:
    """Drain; Ctrl-C or SIGTERM ends the loop once the current message is settled."""
    lost: list[tuple[Lease, QueueError]] = []

    def given_back(lease: Lease, why: QueueError | None) -> None:
        if why is not None:
            lost.append((lease, why))

    # The last line's metrics are read on drain's connection: read on one of
    # their own, they would be the last to close, and read-only.
    processed = 0

    def said(outcome: Outcome) -> None:  # each outcome printed, none kept: a long run's
        nonlocal processed                # memory does not grow with its messages
        processed += 1
        stop.say(str(outcome))

    with _closing_last(queue), _StopRequest() as stop:
        drain(queue, handler, batch_size=batch_size, stop=stop.requested, max_messages=limit,
              on_given_back=given_back, on_outcome=said, keep_outcomes=False)
        if stop.signal is None:
            stop.say(work_summary(queue.metrics(), processed, limit))
            return 0
    print(f"stopped by {signal.Signals(stop.signal).name} after {processed} processed; "
          f"every finished message is committed{_already_lost(lost)}: run work again to go on",
          file=sys.stderr)
    return EXIT_SIGNAL[stop.signal]


def _already_lost(lost: list[tuple[Lease, QueueError]]) -> str:
    """What the stop line says of a message claimed ahead that was lost before it
    could be given back: no error of the stop, since its deadline had passed."""
    return "".join(f"; {lease.event_id}, claimed ahead, was already lost ({why.code}: its "
                   "lease had run out while this worker was held up, and "
                   + ("another worker has claimed it since" if why.code == "stale_generation"
                      else "a claim has recovered it") + "), so there was nothing to give back"
                   for lease, why in lost)


class _StopRequest:
    """While entered, SIGINT and SIGTERM only note a request that the worker
    loop reads between messages, so no message is left half-done by them.

    A reader that stalls (``work | less``, left unread) cannot hold a stop
    up: a signal that arrives while a line is being written points standard
    output at ``/dev/null``, so the blocked write ends (what the reader has
    not yet taken of that line is dropped) and the loop sees the request.
    """

    def __init__(self) -> None:
        self.signal: int | None = None
        self._previous: dict[int, Any] = {}
        self._writing = False

    def requested(self) -> bool:
        return self.signal is not None

    def say(self, text: str) -> None:
        """``_say``, during which a stop silences the output instead of waiting for it."""
        self._writing = True
        try:
            _say(text)
        finally:
            self._writing = False

    def __enter__(self) -> "_StopRequest":
        self._previous = {signum: signal.signal(signum, self._note) for signum in EXIT_SIGNAL}
        return self

    def _note(self, signum: int, frame: Any) -> None:
        self.signal = self.signal or signum
        if self._writing:  # a write interrupted by this signal is retried on the same fd
            _silence_stdout()

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)


def _say(text: str) -> None:
    """Print one line now: a reader sees each outcome as soon as it is committed."""
    print(text, flush=True)


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def _refusal(exc: QueueError) -> str:
    text = str(exc)
    return text if text.startswith(("line ", f"{exc.code}:")) else f"{exc.code}: {text}"
