"""A migration killed at every step: the grid of notebook 13, whole in ``make reliability``.

Each case copies a schema-1 file (written by the earlier engine itself),
runs ``migrate`` in a real child process armed to end by ``os._exit`` at one
crash point (``crashpoints.LIFETIME_POINTS``, the ``migrate.*`` ones), then
reads what the crash left: the schema version, the audit's findings, the
money and the states; then migrates again and reads once more.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from ...audit import check, snapshot
from ...crashpoints import CRASH_EXIT_CODE, LIFETIME_POINTS
from ...migrations import migrate
from ...sqlite.schema import SCHEMA_VERSION

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

MIGRATION_POINTS = tuple(p for p in LIFETIME_POINTS if p.startswith("migrate."))
ROOT = Path(__file__).resolve().parents[3]
COLOURS = {"ok": "#2e7d32", "not ok": "#c62828"}


@dataclass(frozen=True, slots=True)
class MigrationCase:
    """One killed migration: where it died, how the process ended, and what the file
    held after the crash and after the next ``migrate``."""

    point: str
    exit_code: int
    version: int
    findings: tuple[str, ...]
    money: int
    states: tuple[tuple[str, str], ...]
    version_after: int
    findings_after: tuple[str, ...]
    money_after: int

    @property
    def ok(self) -> bool:
        """A whole version, a clean audit and the same money, before and after the re-run."""
        return (self.exit_code == CRASH_EXIT_CODE and self.version in (1, 2)
                and not self.findings and not self.findings_after
                and self.version_after == SCHEMA_VERSION
                and self.money == self.money_after)


def migrate_killed_at(db: str | os.PathLike[str], point: str) -> subprocess.CompletedProcess[str]:
    """Run ``migrate(db)`` (a SQLite file or a PostgreSQL DSN) in a real child process
    armed to end by ``os._exit`` at the crash point ``point``; return how it ended
    (``CRASH_EXIT_CODE`` where it reached the point)."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
        import sys
        from queue_core import crashpoints, migrate
        crashpoints.arm({point!r})
        migrate(sys.argv[1])
        """), os.fspath(db)], cwd=ROOT, capture_output=True, text=True, timeout=120)


def kill_migration(v1_file: str | os.PathLike[str], point: str,
                   folder: str | os.PathLike[str]) -> MigrationCase:
    """Migrate a copy of ``v1_file`` in a child process killed at ``point``; read what is left."""
    db = Path(folder) / f"{point}.sqlite3"
    shutil.copyfile(v1_file, db)
    child = migrate_killed_at(db, point)
    left = snapshot(db)
    migrate(db)
    after = snapshot(db)
    return MigrationCase(point, child.returncode, left.version,
                         tuple(f.name for f in check(left)), left.money,
                         tuple(sorted(left.states().items())), after.version,
                         tuple(f.name for f in check(after)), after.money)


def run_migration_sweep(v1_file: str | os.PathLike[str],
                        points: Sequence[str] = MIGRATION_POINTS) -> list[MigrationCase]:
    """Kill a migration of ``v1_file`` once at each of ``points`` (all, by default)."""
    with tempfile.TemporaryDirectory(prefix="queue-migration-") as folder:
        return [kill_migration(v1_file, point, folder) for point in points]


def migration_frame(cases: Sequence[MigrationCase]) -> "pd.DataFrame":
    """One row per crash point: exit code, version left, audit, money, then after re-run."""
    import pandas as pd

    return pd.DataFrame([{
        "killed at": case.point, "exit code": case.exit_code, "version left": case.version,
        "audit": ", ".join(case.findings) or "clean", "money": case.money,
        "migrate again": f"version {case.version_after}",
        "audit after": ", ".join(case.findings_after) or "clean",
        "money after": case.money_after} for case in cases]).set_index("killed at")


def plot_migration_grid(cases: Sequence[MigrationCase],
                        title: str = "A migration killed at each step") -> "Figure":
    """Crash points down, what was checked across; each cell green (held) or red."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch, Rectangle

    columns = ("whole version left", "audit clean", "money kept",
               f"migrate again: version {SCHEMA_VERSION}")
    fig, ax = plt.subplots(figsize=(9, 1.6 + 0.55 * len(cases)))
    for y, case in enumerate(cases):
        held = (case.version in (1, 2), not case.findings, case.money == case.money_after,
                case.version_after == SCHEMA_VERSION and not case.findings_after)
        labels = (f"version {case.version}", "clean" if held[1] else case.findings[0],
                  str(case.money), "clean" if held[3] else "not clean")
        for x, (good, label) in enumerate(zip(held, labels)):
            ax.add_patch(Rectangle((x - 0.48, y - 0.45), 0.96, 0.9,
                                   color=COLOURS["ok" if good else "not ok"]))
            ax.text(x, y, label, ha="center", va="center", fontsize=9, color="white")
    ax.set_xlim(-0.5, len(columns) - 0.5)
    ax.set_ylim(len(cases) - 0.5, -0.5)
    ax.set_xticks(range(len(columns)), [c.replace(": ", ":\n") for c in columns])
    ax.set_yticks(range(len(cases)), [case.point for case in cases])
    ax.set_ylabel("where the migrating process died")
    ax.set_title(title)
    ax.legend(handles=[Patch(color=COLOURS[o], label=o) for o in COLOURS], loc="upper left",
              bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    return fig


def sweep_every_engine() -> dict[str, list[MigrationCase]]:
    """The whole sweep (every ``migrate.*`` point) on a schema-1 file of each earlier
    engine (``earlier.ENGINES``), each written by that engine itself. Raises
    ``earlier.NoHistory`` when git history does not hold them."""
    from .earlier import ENGINES, export_engine, write_v1_file

    cases: dict[str, list[MigrationCase]] = {}
    with tempfile.TemporaryDirectory(prefix="queue-engines-") as folder:
        for commit in ENGINES:
            engine = export_engine(commit, folder)
            cases[commit] = run_migration_sweep(write_v1_file(engine, Path(folder) /
                                                              f"v1-{commit}.sqlite3"))
    return cases
