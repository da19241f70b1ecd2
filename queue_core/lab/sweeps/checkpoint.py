"""The checkpoint sweep: a command killed inside its checkpoint, then every command.

In WAL mode a commit is durable once its frames are in the ``-wal``; the
main database file is written later, by a checkpoint, which copies the
committed pages into it (usually when the last connection closes). A
process killed half-way through that copy leaves a main file whose header
page may already say one thing (a new page count, a new schema version)
while other pages are still old, or missing at its end. Nothing is lost:
the ``-wal`` still holds every frame, and the next connection reads
through it. The queue must see the file as SQLite does, as its last commit
left it, and refuse nothing that SQLite recovers.

This sweep kills real processes there. Each of four commands runs as its
own ``queue-core`` process on a prepared file, with a shim preloaded
(``benchmarks/killcheckpoint.c``) that counts the process's writes,
flushes and truncations of the main file (in WAL mode, only a checkpoint
makes them) and sends it ``SIGKILL`` before the k-th. An uninterrupted run
counts them first; then every k from 1 to that count is a case:

- ``enqueue``: a queue of 20 done messages takes a batch of 120 more;
- ``work``: a worker drains 120 ready messages beside 20 done;
- ``prune``: 140 done messages are pruned;
- ``migrate``: a schema-1 file of an earlier engine is upgraded to 2.

After each kill, every command runs on the file left behind: ``status``,
``metrics``, ``migrate``, ``work``, ``prune``; each must exit 0, the schema
version read must be the committed one (the ``-wal``'s, whatever the main
file's header says), the audit must find nothing, and the file must end
exactly as the uninterrupted run and the same commands leave it (states,
effects, money). ``make reliability`` runs every case; a unit test runs
some of them.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from ... import audit
from ...sqlite import schema_version
from ..speed.slowdisk import ROOT, shim_library

__all__ = ["COMMANDS", "CheckpointCase", "count_points", "prepare", "run_checkpoint_sweep"]

SOURCE = ROOT / "benchmarks" / "killcheckpoint.c"
LIBRARY = ROOT / "build" / "killcheckpoint.so"
SCHEMA1 = ROOT / "tests" / "files" / "schema1-265c64c.sqlite3"
NOW = 1000        # the model time of the command killed
LATER = 5000      # the model time of the commands after it
BATCH = 120       # events in the batch enqueue takes (and so the ones work and prune meet)

# The command killed, as ``queue-core`` arguments after ``--db FILE --now NOW``.
COMMANDS: dict[str, tuple[str, ...]] = {
    "enqueue": ("enqueue", "batch.jsonl"),
    "work": ("work",),
    "prune": ("prune", "--older-than", "0"),
    "migrate": ("migrate",),
}
# What every case runs after the kill, in this order: each must exit 0.
AFTERWARDS: tuple[tuple[str, ...], ...] = (
    ("status",), ("metrics",), ("migrate",), ("work",), ("prune", "--older-than", "0"),
    ("status", "--json"))


@dataclass(frozen=True)
class CheckpointCase:
    """One kill: the command, the point (the k-th write of the main file), what was seen."""

    command: str
    point: int
    killed: bool            # the process died by SIGKILL at that point
    version: int            # the schema version read right after the kill
    findings: tuple[str, ...]
    refused: str            # the first later command that did not exit 0, with its output
    end: dict[str, object]  # status --json at the end

    def problems(self, expected_version: int, expected_end: dict[str, object]) -> list[str]:
        where = f"{self.command} killed at write {self.point}"
        found = []
        if not self.killed:
            found.append(f"{where}: the process was not killed there (it made fewer writes)")
        if self.version != expected_version:
            found.append(f"{where}: schema version {self.version} read, {expected_version} "
                         "committed")
        if self.findings:
            found.append(f"{where}: audit found {', '.join(self.findings)}")
        if self.refused:
            found.append(f"{where}: {self.refused}")
        elif self.end != expected_end:
            found.append(f"{where}: ended {self.end}, the uninterrupted run {expected_end}")
        return found


def prepare(command: str, folder: Path) -> Path:
    """A fresh file (and batch) in ``folder`` in the state ``command`` starts from:
    a copy of one made once per command beside ``folder`` (closed, no ``-wal``)."""
    template = folder.parent / "template"
    if not (template / "queue.sqlite3").exists():
        _make(command, template)
    shutil.copytree(template, folder, dirs_exist_ok=True)
    return folder / "queue.sqlite3"


def _make(command: str, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    db = folder / "queue.sqlite3"
    batch = folder / "batch.jsonl"
    batch.write_text("".join(
        json.dumps({"event_id": f"E{1000 + i}",
                    "payload": {"category": ("book", "pen", "bag")[i % 3],
                                "amount_cents": 100 + i}}) + "\n" for i in range(BATCH)))
    if command == "migrate":
        shutil.copyfile(SCHEMA1, db)
        return
    _cli(db, NOW - 10, "enqueue", str(ROOT / "data" / "twenty.jsonl"))
    _cli(db, NOW - 10, "work")
    if command in ("work", "prune"):
        _cli(db, NOW - 10, "enqueue", str(batch))
    if command == "prune":
        _cli(db, NOW - 10, "work")


def count_points(command: str, folder: Path) -> int:
    """How many writes of the main file the uninterrupted ``command`` makes."""
    db = prepare(command, folder)
    report = folder / "points"
    _run(db, command, {"KILLCHECKPOINT_REPORT": str(report)}, check=True)
    return int(report.read_text())


def run_case(command: str, point: int, folder: Path) -> CheckpointCase:
    db = prepare(command, folder)
    died = _run(db, command, {"KILLCHECKPOINT_AT": str(point)}, check=False)
    version = schema_version(db)
    findings = tuple(finding.code for finding in audit.findings(db))
    refused, end = "", {}
    for args in AFTERWARDS:
        done = _cli(db, LATER, *args, check=False)
        if done.returncode != 0:
            refused = (f"`{' '.join(args)}` exited {done.returncode}: "
                       f"{(done.stderr or done.stdout).strip()[:300]}")
            break
        if args == ("status", "--json"):
            end = json.loads(done.stdout)
    return CheckpointCase(command, point, died == -signal.SIGKILL, version, findings,
                          refused, end)


def expected(command: str, folder: Path) -> tuple[int, dict[str, object]]:
    """The committed version after an uninterrupted ``command``, and how the file ends."""
    db = prepare(command, folder)
    _cli(db, NOW, *_arguments(db, command))
    version = schema_version(db)
    for args in AFTERWARDS[:-1]:
        _cli(db, LATER, *args)
    return version, json.loads(_cli(db, LATER, "status", "--json").stdout)


def run_checkpoint_sweep(folder: Path, commands: tuple[str, ...] = tuple(COMMANDS),
                         every: int = 1) -> tuple[list[CheckpointCase], list[str]]:
    """Every ``every``-th kill point of each command (and always the last), judged;
    returns the cases and the problems (none: the sweep is clean)."""
    shim_library(source=SOURCE, library=LIBRARY, what="the checkpoint sweep's shim")
    cases, problems = [], []
    for command in commands:
        version, end = expected(command, folder / command / "expected")
        points = count_points(command, folder / command / "count")
        if points == 0:
            problems.append(f"{command}: its run made no write of the main file to kill")
        # migrate takes a file of schema 1 through each step, one commit (and one
        # checkpoint, as its connection closes) per step: a kill in the checkpoint of
        # the first step finds version 2 committed, a later one the last version.
        first_step = points - _points_after_the_first_step(folder / command) \
            if command == "migrate" else 0
        chosen = sorted({*range(1, points + 1, every), points} - {0})
        for point in chosen:
            case = run_case(command, point, folder / command / f"at-{point}")
            cases.append(case)
            problems += case.problems(2 if point <= first_step else version, end)
            shutil.rmtree(folder / command / f"at-{point}", ignore_errors=True)
    return cases, problems


def _points_after_the_first_step(folder: Path) -> int:
    """How many writes of the main file migrate makes once the step 1 -> 2 is done."""
    from ...sqlite.migrations import migrate_step
    db = prepare("migrate", folder / "second")
    migrate_step(db, 1)  # its connection closes last: checkpointed, no -wal left
    report = folder / "second" / "points"
    _run(db, "migrate", {"KILLCHECKPOINT_REPORT": str(report)}, check=True)
    return int(report.read_text())


def _arguments(db: Path, command: str) -> tuple[str, ...]:
    return tuple(str(db.parent / arg) if arg.endswith(".jsonl") else arg
                 for arg in COMMANDS[command])


def _run(db: Path, command: str, extra: dict[str, str], *, check: bool) -> int:
    library = shim_library(source=SOURCE, library=LIBRARY, what="the checkpoint sweep's shim")
    env = {**os.environ, **extra, "KILLCHECKPOINT_FILE": str(db.resolve()),
           "LD_PRELOAD": " ".join(filter(None, [str(library), os.environ.get("LD_PRELOAD")]))}
    done = subprocess.run(_argv(db, NOW, *_arguments(db, command)), env=env,
                          capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"{command} failed uninterrupted: {done.stderr.strip()[:300]}")
    return done.returncode


def _cli(db: Path, now: int, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(_argv(db, now, *args), capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"`{' '.join(args)}` failed: {done.stderr.strip()[:300]}")
    return done


def _argv(db: Path, now: int, *args: str) -> list[str]:
    return [sys.executable, "-m", "queue_core", "--db", str(db), "--now", str(now), *args]
