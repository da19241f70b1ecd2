"""The engines of earlier releases, taken from git history and run in child processes.

A file written by any earlier release must open, and migrate; an earlier
engine must refuse a migrated file and change nothing. Both are tested with
that release's own code, never a simulation of it: the lab's
``lifetime.earlier`` exports the package ``queue_core`` as it was at a commit
into a folder of its own and runs a script against it in a child process.
This module adds what the tests need on top: ``ENGINES`` pinned by commit,
and ``require_history``, which says why a test cannot run outside a git
checkout that holds them (a source archive), and fails under CI (which
always has the history) rather than skip.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from queue_core.lab.lifetime.earlier import (ENGINES, SCHEMA2_ENGINE, SCHEMA3_ENGINE,
                                            SCHEMA4_ENGINE, SCHEMA5_ENGINE, SCHEMA6_ENGINE,
                                            NoHistory, earlier_cli, export_engine,
                                            run_earlier)

__all__ = ["ENGINES", "SCHEMA2_ENGINE", "SCHEMA3_ENGINE", "SCHEMA4_ENGINE", "SCHEMA5_ENGINE",
           "SCHEMA6_ENGINE", "cli", "export", "has_history", "require_history", "run"]
SCHEMA_ENGINES = (SCHEMA2_ENGINE, SCHEMA3_ENGINE, SCHEMA4_ENGINE, SCHEMA5_ENGINE,
                  SCHEMA6_ENGINE)

ROOT = Path(__file__).resolve().parent.parent


def has_history() -> bool:
    """Whether this checkout holds the commits of ``ENGINES`` and the schema engines."""
    try:
        for commit in (*ENGINES, *SCHEMA_ENGINES):
            subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{commit}^{{commit}}"],
                           check=True, capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    return True


def require_history() -> None:
    """Skip (or, under CI, fail) a test that needs an earlier engine from git history."""
    if has_history():
        return
    why = (f"the earlier engines ({', '.join((*ENGINES, *SCHEMA_ENGINES))}) "
           "come from git history, and "
           f"{ROOT} is not a git checkout that holds them (a source archive?)")
    if os.environ.get("CI"):
        pytest.fail(why)
    pytest.skip(why)


def export(commit: str, folder: Path) -> Path:
    """``queue_core`` as it was at ``commit``, in ``folder/<commit>``: the folder to put
    first on ``sys.path``."""
    try:
        return export_engine(commit, folder)
    except NoHistory as why:
        pytest.fail(str(why))


def run(engine: Path, script: str, *args: str, timeout: float = 60,
        check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``script`` in a child process whose ``queue_core`` is ``engine``'s."""
    done = run_earlier(engine, script, *args, timeout=timeout)
    if check and done.returncode != 0:
        raise AssertionError(f"the engine of {engine.name} failed ({done.returncode}):\n"
                             f"{done.stdout}\n{done.stderr}")
    return done


def cli(engine: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``python -m queue_core ARGS`` of ``engine``, in a child process."""
    return earlier_cli(engine, *args)


# A story told in course ids, told again under ids that real sources send (a general
# queue), mapped in the same order so that a sorted read of either lists the same events.
GENERAL_IDS = {"E0001": "9f1c2a3e-4b5d-4e6f-8a7b-0c1d2e3f4a5b", "E0002": "evt_1NG8Du2eZvKYlo2C",
               "E0003": "order-2026-000003", "E0004": "shop:order:2026-000004",
               "E0005": "x.5", "E0006": "x.6"}
assert sorted(GENERAL_IDS.values()) == list(GENERAL_IDS.values())


def story_of(story: str, ids: str) -> str:
    """``story``, a script whose queue is created with ``lease_seconds=30)`` and whose
    events have course ids, for a queue of the rule ``ids``."""
    if ids == "course":
        return story
    text = story.replace("lease_seconds=30)", "lease_seconds=30, ids='general')", 1)
    for course, general in GENERAL_IDS.items():
        text = text.replace(f'"{course}"', f'"{general}"')
    assert "ids='general'" in text and not any(course in text for course in GENERAL_IDS)
    return text


def named(ids: str, event_id: str) -> str:
    """The id of the course's ``event_id`` in a queue of the rule ``ids``."""
    return event_id if ids == "course" else GENERAL_IDS[event_id]
