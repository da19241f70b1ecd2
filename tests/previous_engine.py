"""The engines of earlier releases, taken from git history and run in child processes.

A file written by any earlier release must open, and migrate; an earlier
engine must refuse a migrated file and change nothing. Both are tested with
that release's own code, never a simulation of it: ``export`` writes the
package ``queue_core`` as it was at a commit into a folder of its own, and
``run`` runs a script against it in a child process, whose ``import
queue_core`` finds that folder first.

``ENGINES`` pins each by commit. In a git checkout (CI always has one) the
history is there; elsewhere (a source archive) ``require_history`` says why
the test cannot run, and fails under CI rather than skip.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# commit -> what its engine writes
ENGINES = {
    "265c64c": "schema 1, 1 KB pages",
    # the last commit before 5dd7a2d ("New queue files use 1 KB pages")
    "0d78855": "schema 1, 4 KB pages",
}


def has_history() -> bool:
    """Whether this checkout holds the commits of ``ENGINES``."""
    try:
        for commit in ENGINES:
            subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{commit}^{{commit}}"],
                           check=True, capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    return True


def require_history() -> None:
    """Skip (or, under CI, fail) a test that needs an earlier engine from git history."""
    if has_history():
        return
    why = (f"the earlier engines ({', '.join(ENGINES)}) come from git history, and "
           f"{ROOT} is not a git checkout that holds them (a source archive?)")
    if os.environ.get("CI"):
        pytest.fail(why)
    pytest.skip(why)


def export(commit: str, folder: Path) -> Path:
    """``queue_core`` as it was at ``commit``, written into ``folder/<commit>``;
    the folder to put first on ``sys.path``."""
    target = folder / commit
    if (target / "queue_core" / "__init__.py").exists():
        return target
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", commit,
                              "queue_core"], check=True, capture_output=True, timeout=60).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(target, filter="data")
    return target


def run(engine: Path, script: str, *args: str, timeout: float = 60,
        check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``script`` in a child process whose ``queue_core`` is ``engine``'s."""
    env = {**os.environ, "PYTHONPATH": str(engine), "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run([sys.executable, "-c", script, *args], env=env, cwd=engine,
                          capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise AssertionError(f"the engine of {engine.name} failed ({done.returncode}):\n"
                             f"{done.stdout}\n{done.stderr}")
    return done


def cli(engine: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``python -m queue_core ARGS`` of ``engine``, in a child process."""
    return run(engine, "import sys, runpy; sys.argv = ['queue-core', *sys.argv[1:]]; "
               "runpy.run_module('queue_core', run_name='__main__')", *args,
               timeout=timeout, check=False)
