"""The queue over its lifetime (notebook 13): retention, migrations, earlier releases.

What five systems do with a late duplicate (``windows``); a file's size over
a steady load, with and without ``prune`` (``growth``); a migration killed
at every step, whole in ``make reliability`` (``migration``); the engine of
an earlier release, exported from git history and run in a child process
(``earlier``). None of it is protocol: ``migrate`` and ``prune`` are
``queue_core``'s.

    from queue_core.lab.lifetime import run_migration_sweep, steady_load, windows_frame
"""

from .earlier import (ENGINES, PREVIOUS, NoHistory, earlier_cli, export_engine, run_earlier,
                      worker_across_migration, write_v1_file)
from ...ids import COURSE_CAPACITY
from .growth import plot_growth, steady_load
from .migration import (MIGRATION_POINTS, MigrationCase, kill_migration, migration_frame,
                        plot_migration_grid, run_migration_sweep, sweep_every_engine)
from .windows import WINDOWS, Window, windows_frame

__all__ = ["COURSE_CAPACITY", "ENGINES", "MIGRATION_POINTS", "PREVIOUS", "WINDOWS", "MigrationCase", "NoHistory",
           "Window", "earlier_cli", "export_engine", "kill_migration", "migration_frame",
           "plot_growth", "plot_migration_grid", "run_earlier", "run_migration_sweep",
           "steady_load", "sweep_every_engine", "windows_frame", "worker_across_migration",
           "write_v1_file"]
