"""The engine of an earlier release, taken from git history and run in a child process.

A previous-release worker meeting a migrated file must be that release's
own code, not a simulation of it. ``export_engine`` writes the package
``queue_core`` as it was at a commit into a folder of its own (``git
archive``, read-only on the repository); ``run_earlier`` runs a script
against it in a child process, whose ``import queue_core`` finds that
folder first. Outside a git checkout that holds the commit (a source
archive), ``NoHistory`` says why, and the chapter goes on without it.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Callable, Sequence

ROOT = Path(__file__).resolve().parents[3]
# commit -> what its engine writes: schema 1, and the page size new files got
ENGINES = {"265c64c": "schema 1, 1 KB pages",
           "0d78855": "schema 1, 4 KB pages"}  # the last before new files got 1 KB pages
PREVIOUS = "265c64c"
# The last release before PostgreSQL's schema 3 (the worker's step as a function):
# it writes schema 2 on both stores (SQLite's 2 was this engine's until the id rule's 3).
SCHEMA2_ENGINE = "5e07019"
# The last release before PostgreSQL's schema 4 (the step holds the payload to the
# digest kept from enqueue on): it writes PostgreSQL's schema 3, SQLite's 2.
SCHEMA3_ENGINE = "275fe7a"
# The last release before the id rule (SQLite's schema 3, PostgreSQL's 5): it writes
# PostgreSQL's schema 4, SQLite's 2, and knows only the course's ids.
SCHEMA4_ENGINE = "e256d49"
# The last release before priorities: it writes PostgreSQL's schema 5, SQLite's 3.
SCHEMA5_ENGINE = "11541ae"
# The last release before PostgreSQL's schema 7 (the step's claim with a constant
# LIMIT): it writes PostgreSQL's schema 6, SQLite's 4.
SCHEMA6_ENGINE = "310843c"

# One state of every kind, written by the earlier engine on a model clock:
# E0001 and E0003 done (E0003 at generation 2), E0002 dead, E0004 leased until
# 1037, E0005 ready; 15000 of money.
V1_STORY = r"""
import sys
from queue_core import Handler, ModelClock, Queue
clock = ModelClock(1000)
queue = Queue(sys.argv[1], clock=clock, lease_seconds=30)
queue.enqueue_jsonl(
    '{"event_id": "E0001", "payload": {"category": "book", "amount_cents": 10000}}\n'
    '{"event_id": "E0002", "payload": {"category": "toy", "amount_cents": 3000}}\n'
    '{"event_id": "E0003", "payload": {"category": "book", "amount_cents": 5000}}\n'
    '{"event_id": "E0004", "payload": {"category": "pen", "amount_cents": 2000}}\n')
handler = Handler()
queue.complete(queue.claim(), handler)
clock.advance(1)
queue.fail(queue.claim(), "invalid_payload", permanent=True)
clock.advance(1)
queue.fail(queue.claim())
clock.advance(5)
lease = queue.claim()
clock.advance(3)
queue.complete(queue.claim(), handler)
queue.enqueue_jsonl('{"event_id": "E0005", "payload": {"category": "bag", "amount_cents": 700}}')
import sqlite3
last = sqlite3.connect(sys.argv[1])
last.execute('SELECT count(*) FROM sqlite_master').fetchone()
last.close()
"""


class NoHistory(Exception):
    """The earlier engine cannot be had here; the text says why."""


def export_engine(commit: str, folder: str | os.PathLike[str]) -> Path:
    """``queue_core`` as it was at ``commit``, written into ``folder/<commit>``: the
    folder to put first on ``sys.path``. Raises ``NoHistory`` (with why) when this
    checkout does not hold the commit."""
    target = Path(folder) / commit
    if (target / "queue_core" / "__init__.py").exists():
        return target
    try:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", commit,
                                  "queue_core"], check=True, capture_output=True,
                                 timeout=60).stdout
    except FileNotFoundError:
        raise NoHistory("git is not installed, and the earlier engine comes from git "
                        "history") from None
    except subprocess.CalledProcessError:
        raise NoHistory(f"the earlier engine ({commit}) comes from git history, and this "
                        "copy of the course is not a git checkout that holds it (a source "
                        "archive?)") from None
    except subprocess.TimeoutExpired:
        raise NoHistory("git took too long to export the earlier engine") from None
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(target, filter="data")
    return target


def run_earlier(engine: Path, script: str, *args: str,
                timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run ``script`` in a child process whose ``queue_core`` is ``engine``'s."""
    env = {**os.environ, "PYTHONPATH": str(engine), "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run([sys.executable, "-c", script, *args], env=env, cwd=engine,
                          capture_output=True, text=True, timeout=timeout)


def earlier_cli(engine: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``queue-core ARGS`` of ``engine``, in a child process."""
    return run_earlier(engine, "import sys, runpy; sys.argv = ['queue-core', *sys.argv[1:]]; "
                       "runpy.run_module('queue_core', run_name='__main__')", *args)


def write_v1_file(engine: Path, path: str | os.PathLike[str]) -> Path:
    """A schema-1 queue file at ``path``, written by ``engine`` (``V1_STORY``)."""
    done = run_earlier(engine, V1_STORY, os.fspath(path))
    if done.returncode != 0:
        raise NoHistory(f"the earlier engine could not write its file: "
                        f"{done.stderr.strip().splitlines()[-1:]}")
    return Path(path)


# What a worker of the earlier engine does once the file is migrated under it, as
# that release would: ACK, enqueue, replay, fail. Each step is a name and an
# expression over ``queue``, ``lease``, ``Handler`` and ``drain`` of that release.
AFTER_MIGRATION = (
    ("ACK", "queue.complete(lease, Handler())"),
    ("enqueue E0009", "queue.enqueue_jsonl('{\"event_id\": \"E0009\", \"payload\": "
                      "{\"category\": \"pen\", \"amount_cents\": 100}}')"),
    ("replay E0001", "queue.enqueue_jsonl('{\"event_id\": \"E0001\", \"payload\": "
                     "{\"category\": \"book\", \"amount_cents\": 10000}}')"),
    ("fail", "queue.fail(lease)"))

# A worker of the earlier engine that opened its session (and claimed) before the
# migration, then takes the steps in argv[2] (JSON), one line of JSON for each.
_RUNNING_WORKER = r"""
import json, sys
from queue_core import Handler, ModelClock, Queue, drain
queue = Queue(sys.argv[1], clock=ModelClock(1020), lease_seconds=30)
def attempt(name, call):
    try:
        said = {"step": name, "ok": repr(call())}
    except Exception as exc:
        said = {"step": name, "error": type(exc).__name__, "text": str(exc)}
        if isinstance(getattr(exc, "code", None), str):
            said["code"] = exc.code
    print(json.dumps(said), flush=True)
with queue.session():
    lease = queue.claim()
    print(json.dumps({"step": "claim", "ok": repr(lease)}), flush=True)
    sys.stdin.readline()
    names = {"Handler": Handler, "drain": drain, "queue": queue, "lease": lease}
    for name, expression in json.loads(sys.argv[2]):
        attempt(name, lambda: eval(expression, names))
"""


def worker_said(engine: Path, db: str | os.PathLike[str], migrate_now: Callable[[], object],
                steps: Sequence[tuple[str, str]] = AFTER_MIGRATION) -> list[dict[str, str]]:
    """Start a worker of ``engine`` on ``db`` (it claims), call ``migrate_now`` while
    it waits, then let it take ``steps``; return what it said of each, first its
    claim: ``step`` and ``ok`` (the repr) or ``error``, ``text`` and any ``code``."""
    import json

    env = {**os.environ, "PYTHONPATH": str(engine), "PYTHONDONTWRITEBYTECODE": "1"}
    worker = subprocess.Popen([sys.executable, "-c", _RUNNING_WORKER, os.fspath(db),
                               json.dumps(steps)], env=env, cwd=engine, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert worker.stdout is not None
        first = worker.stdout.readline()
        migrate_now()
        rest, err = worker.communicate("go\n", timeout=60)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    said = [json.loads(line) for line in (first + rest).splitlines()]
    if len(said) != len(steps) + 1:
        raise RuntimeError(f"the worker of {engine.name} stopped early: {said}\n{err}")
    return said


def worker_across_migration(engine: Path, db: str | os.PathLike[str],
                            migrate_now: Callable[[], object]) -> list[tuple[str, str]]:
    """Start a worker of ``engine`` on ``db`` (it claims), call ``migrate_now`` while
    it waits, then let it go on (``AFTER_MIGRATION``); return each of its steps with
    what it got."""
    return [(said["step"], f"accepted: {said['ok']}" if "ok" in said
             else f"refused: {said['error']}: {said['text']}")
            for said in worker_said(engine, db, migrate_now)]
