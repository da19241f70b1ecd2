"""The command line as a well-kept Unix tool, through real subprocesses:
Ctrl-C and SIGTERM stop ``work`` after the current message, a closed pipe or
a full output device ends it quietly, ``--version`` and every help text.
After each interruption the audit is clean, the folder holds the database
file alone, and a later run finishes every message exactly once."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from queue_core import __version__
from queue_core.audit import findings, snapshot
from queue_core.cli import build_parser

EVENTS = 1000
CATEGORIES = ("book", "pen", "bag")


def command(db: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "queue_core", "--db", str(db), "--now", "1000", *args]


@pytest.fixture
def busy_db(tmp_path: Path) -> tuple[Path, int]:
    """A queue of 1000 due events, enough to keep ``work`` busy for a while."""
    lines = [json.dumps({"event_id": f"E{i:04d}",
                         "payload": {"category": CATEGORIES[i % 3], "amount_cents": 100 + i}})
             for i in range(1, EVENTS + 1)]
    batch = tmp_path / "batch.jsonl"
    batch.write_text("\n".join(lines) + "\n")
    db = tmp_path / "q.sqlite3"
    subprocess.run(command(db, "enqueue", str(batch)), check=True, capture_output=True)
    return db, sum(100 + i for i in range(1, EVENTS + 1))


def finish_and_check(db: Path, money: int) -> None:
    """The interrupted file is consistent and alone (no -wal, no -shm: the stopped
    worker closed its connection last); a later run finishes every message once."""
    assert sorted(path.name for path in db.parent.iterdir()) == ["batch.jsonl", db.name]
    assert findings(db) == []
    done = subprocess.run(command(db, "work"), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    snap = snapshot(db)
    assert (snap.status.states["done"], snap.status.effects, snap.status.total) == \
        (EVENTS, EVENTS, money)
    assert findings(db) == []


@pytest.mark.parametrize("signum, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)],
                         ids=["ctrl-c", "sigterm"])
def test_a_signal_during_work_stops_after_the_current_message(
        busy_db: tuple[Path, int], signum: int, status: int) -> None:
    db, money = busy_db
    proc = subprocess.Popen(command(db, "work"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None and proc.stdout.readline()  # it is working
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=60)

    assert proc.returncode == status
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"stopped by {signal.Signals(signum).name} after ")
    assert "nothing left to claim" not in out
    status = subprocess.run(command(db, "status", "--json"), capture_output=True, text=True)
    assert json.loads(status.stdout)["states"]["leased"] == 0  # the message in hand was settled
    finish_and_check(db, money)


def test_a_closed_pipe_ends_work_quietly_with_status_141(busy_db: tuple[Path, int]) -> None:
    db, money = busy_db
    proc = subprocess.Popen(command(db, "work"), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline()  # like: work | head -1
    proc.stdout.close()
    err = proc.stderr.read() if proc.stderr else b""
    proc.wait(timeout=60)

    assert proc.returncode == 141
    assert err == b""
    finish_and_check(db, money)


def test_a_full_output_device_ends_work_with_one_line_and_status_1(
        busy_db: tuple[Path, int]) -> None:
    db, money = busy_db
    with open("/dev/full", "w") as full:
        result = subprocess.run(command(db, "work"), stdout=full, stderr=subprocess.PIPE,
                                text=True, timeout=60)

    assert result.returncode == 1
    assert result.stderr.startswith("error: output_failed: ") and result.stderr.count("\n") == 1
    finish_and_check(db, money)


def test_version_prints_the_package_version() -> None:
    result = subprocess.run([sys.executable, "-m", "queue_core", "--version"],
                            capture_output=True, text=True)

    assert (result.returncode, result.stdout) == (0, f"queue-core {__version__}\n")


def test_every_argument_and_option_has_help_with_its_default_and_each_command_an_example(
) -> None:
    parser = build_parser()
    subparsers = next(a for a in parser._actions if a.dest == "command").choices  # noqa: SLF001
    for name, sub in [("queue-core", parser), *subparsers.items()]:
        assert sub.epilog and sub.epilog.startswith("example: "), name
        for action in sub._actions:  # noqa: SLF001
            if action.dest in ("help", "version", "command"):
                continue
            assert action.help, (name, action.dest)
            if action.option_strings and action.nargs != 0:
                assert "default" in action.help, (name, action.dest)


def test_the_help_says_only_enqueue_creates_a_queue_and_what_the_demo_takes() -> None:
    def help_of(*args: str) -> str:
        result = subprocess.run([sys.executable, "-m", "queue_core", *args, "--help"],
                                capture_output=True, text=True)
        assert result.returncode == 0, result.stderr
        return " ".join(result.stdout.split())

    assert ("only enqueue creates it, every other command refuses a missing one "
            "(no_queue_file) (default: queue.sqlite3)") in help_of()
    assert "on its own model clock (so it takes neither --db nor --now)" in help_of("demo")
    assert "--max N process at most N messages, then stop" in help_of("work")
