"""What a learner's function does while an exercise check runs it: the
``queue_core`` functions it enters, the SQL it runs that would write to a
database file, and the child processes it starts.

Nothing is replaced, and nothing the function does is refused while it
runs: the check judges afterwards, from what was seen.

- Calls into ``queue_core``: ``sys.setprofile`` sees every call; those into a
  file of the package from outside it are kept (a context manager's own
  resume and private helpers are not).
- Writes: the same profile function sees each ``execute``, ``executemany``,
  ``executescript`` and ``cursor`` call on a ``sqlite3`` connection (or
  cursor) and gives that connection an authorizer, which SQLite consults as
  it prepares every statement. The authorizer records each action that
  writes to a database file (``INSERT``, ``UPDATE``, ``DELETE``, ``CREATE``,
  ``DROP``, ``ALTER``, ...; a TEMP table is no file) and allows it: the
  statement runs as written. It sees an ``UPDATE`` that changes no value too,
  which leaves no trace in the file. It records each ``PRAGMA`` given a
  value as well (``PRAGMA journal_mode=DELETE``): a pragma that sets
  something of the file (``FILE_PRAGMAS``) is a write too. The authorizers
  are removed afterwards.
- Child processes, and threads: an audit hook (``sys.addaudithook``) records
  ``subprocess.Popen``, ``os.system``, ``os.posix_spawn``, ``os.exec`` and
  ``os.spawn`` events with their command lines, and each ``sqlite3.connect``
  that the package's own code makes, in any thread of the process (the
  profile function sees only the thread it was set in). An audit hook cannot
  be removed, so it is installed once per process and does nothing unless a
  watch is on.

A write made outside this process, or by a library that is not ``sqlite3``,
has no authorizer: the check compares ``PRAGMA data_version`` (read before
and after on a connection it holds open) and the audit's snapshot for that.
"""

from __future__ import annotations

import os
import sqlite3
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

__all__ = ["Watched", "watched"]

_PACKAGE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep  # queue_core/
_HERE = os.path.abspath(__file__)
_SQL_CALLS = frozenset({"execute", "executemany", "executescript", "cursor"})
_SPAWNS = frozenset({"subprocess.Popen", "os.system", "os.posix_spawn", "os.exec", "os.spawn",
                     "pty.spawn"})
_WRITE_ACTIONS = {getattr(sqlite3, name): verb for name, verb in (
    ("SQLITE_INSERT", "INSERT INTO"), ("SQLITE_UPDATE", "UPDATE"), ("SQLITE_DELETE", "DELETE FROM"),
    ("SQLITE_CREATE_TABLE", "CREATE TABLE"), ("SQLITE_CREATE_INDEX", "CREATE INDEX"),
    ("SQLITE_CREATE_TRIGGER", "CREATE TRIGGER"), ("SQLITE_CREATE_VIEW", "CREATE VIEW"),
    ("SQLITE_CREATE_VTABLE", "CREATE VIRTUAL TABLE"), ("SQLITE_DROP_TABLE", "DROP TABLE"),
    ("SQLITE_DROP_INDEX", "DROP INDEX"), ("SQLITE_DROP_TRIGGER", "DROP TRIGGER"),
    ("SQLITE_DROP_VIEW", "DROP VIEW"), ("SQLITE_DROP_VTABLE", "DROP VIRTUAL TABLE"),
    ("SQLITE_ALTER_TABLE", "ALTER TABLE"), ("SQLITE_REINDEX", "REINDEX"),
    ("SQLITE_ANALYZE", "ANALYZE")) if hasattr(sqlite3, name)}
# The pragmas that, given a value, change the database file itself (not the connection).
FILE_PRAGMAS = frozenset({"journal_mode", "user_version", "application_id", "auto_vacuum",
                          "page_size", "schema_version"})
_watches: dict[int, "Watched"] = {}   # thread id -> the watch on in that thread
_hooked = False


@dataclass
class Watched:
    """What one run of the learner's function did: its result or what it raised,
    the ``queue_core`` functions it entered (in order), the writing statements
    it ran (``UPDATE messages``), and the command lines of its child processes."""

    result: Any = None
    error: BaseException | None = None
    entered: list[str] = field(default_factory=list)
    writes: list[str] = field(default_factory=list)
    pragmas: list[str] = field(default_factory=list)  # each given a value: "journal_mode=DELETE"
    children: list[tuple[str, str]] = field(default_factory=list)  # (as run, as shown)
    # files the package's own code opened with sqlite3 while the function ran, in any
    # thread: the answer key reached from a thread the profile function does not see
    package_opened: list[str] = field(default_factory=list)
    _connections: dict[int, sqlite3.Connection] = field(default_factory=dict, repr=False)

    def authorize(self, action: int, first: Any, second: Any, database: Any, _: Any) -> int:
        """SQLite's authorizer: note a write to a database file, allow everything."""
        if action == sqlite3.SQLITE_PRAGMA and second is not None:
            said = f"{first}={second}"
            if said not in self.pragmas:
                self.pragmas.append(said)
        verb = _WRITE_ACTIONS.get(action)
        name = second if action == getattr(sqlite3, "SQLITE_ALTER_TABLE", None) else first
        if verb and database != "temp" and not str(name or "").startswith("sqlite_"):
            text = f"{verb} {name}" if name else verb
            if text not in self.writes:
                self.writes.append(text)
        return sqlite3.SQLITE_OK

    def profile(self, frame: Any, event: str, arg: Any) -> None:
        if event == "c_call" and getattr(arg, "__name__", "") in _SQL_CALLS:
            self._watch_connection(getattr(arg, "__self__", None))
        elif event == "call" and frame.f_code.co_filename.startswith(_PACKAGE) \
                and frame.f_code.co_filename != _HERE:   # not the authorizer's own call
            self._note_entry(frame)

    def _watch_connection(self, owner: Any) -> None:
        conn = owner.connection if isinstance(owner, sqlite3.Cursor) else owner
        if isinstance(conn, sqlite3.Connection) and id(conn) not in self._connections:
            try:
                conn.set_authorizer(self.authorize)
                self._connections[id(conn)] = conn
            except sqlite3.Error:  # closed, or another thread's: SQLite refuses it anyway
                pass

    def _note_entry(self, frame: Any) -> None:
        caller = frame.f_back
        name = getattr(frame.f_code, "co_qualname", frame.f_code.co_name)
        last = name.rsplit(".", 1)[-1]
        public = last == "__init__" or not last.startswith(("_", "<"))
        if (caller is None or not caller.f_code.co_filename.startswith(_PACKAGE)) \
                and public and name not in self.entered:   # not a context manager's own resume
            self.entered.append(name)

    def release(self) -> None:
        """Take the authorizers off the connections still open."""
        for conn in self._connections.values():
            try:
                conn.set_authorizer(None)
            except sqlite3.Error:
                pass
        self._connections.clear()


def watched(fn: Callable[[str], Any], path: str) -> Watched:
    """Call ``fn(path)`` and return what it did (``Watched``); never raises what
    ``fn`` raised (``SystemExit`` and ``KeyboardInterrupt`` included)."""
    _install_hook()
    watch, thread = Watched(), threading.get_ident()
    previous = sys.getprofile()
    _watches[thread] = watch
    sys.setprofile(watch.profile)
    try:
        watch.result = fn(path)
    except BaseException as exc:  # the learner's function may fail in any way
        watch.error = exc
    finally:
        sys.setprofile(previous)
        _watches.pop(thread, None)
        watch.release()
    return watch


def _install_hook() -> None:
    global _hooked
    if not _hooked:
        sys.addaudithook(_audit)
        _hooked = True


def _audit(event: str, args: tuple[Any, ...]) -> None:
    """While a watch is on, note a child process started, and a database file the
    package's own code opens, in ANY thread of the process: a function may do its
    work in a thread of its own, which the profile function does not see (silent
    while no watch is on)."""
    if not _watches or (event not in _SPAWNS and event != "sqlite3.connect"):
        return
    try:
        watch = _watches.get(threading.get_ident()) or next(iter(_watches.values()))
        if event == "sqlite3.connect":
            caller = sys._getframe(1)
            if caller.f_code.co_filename.startswith(_PACKAGE):
                watch.package_opened.append(os.fsdecode(args[0]) if args else "")
        else:
            watch.children.append(command_line(event, args))
    except Exception:  # an audit hook that raises would break the call it audits
        pass


def command_line(event: str, args: tuple[Any, ...]) -> tuple[str, str]:
    """The command a spawn event runs, as run and as shown: shown, its program has
    no folder and other paths read ``<path>``, the same text on every machine."""
    at = {"subprocess.Popen": 1, "os.posix_spawn": 1, "os.exec": 1, "os.spawn": 2}.get(event, 0)
    words = args[at] if at < len(args) else ()
    if isinstance(words, (str, bytes, os.PathLike)):
        words = [words]
    text = " ".join(os.fsdecode(w) if isinstance(w, (bytes, os.PathLike)) else str(w)
                    for w in words)
    tokens = text.split()
    shown = [os.path.basename(t) if n == 0 else "<path>" if ("/" in t or os.sep in t) else t
             for n, t in enumerate(tokens)]
    return text, " ".join(shown)
