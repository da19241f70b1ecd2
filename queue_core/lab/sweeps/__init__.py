"""Crashes everywhere (notebooks 07, 08 and 11): sweeps, the stress run, the explorer.

A worker killed at every crash point, per protocol (``sweep``); many
workers killed at random while they drain (``stress``); every prefix of the
WAL a power cut can leave (``powerloss``, which reads frames with ``wal``);
every schedule of a small scenario, model-checked on the real engine
(``explore``, its steps in ``schedule``); a migration and a prune killed at
each of their steps and cut at every frame of their log
(``run_lifetime_sweep``, ``run_lifetime_powerloss``, judged by ``lifetime``); a
worker's PostgreSQL connection broken at every step (``network``, through
``servers.faultproxy``) and a worker stalled mid-transaction (``hostage``).
Each run is judged by the audit.

    from queue_core.lab.sweeps import plot_sweep, run_sweep, sweep_frame
"""

from .explore import Exploration, explore, plot_state_space, replay
from .hostage import HostageRun, hold_hostage
from .network import (FAULTS as NETWORK_FAULTS, STEPS as NETWORK_STEPS, NetRow, network_frame,
                      plot_network_sweep, run_network_sweep)
from .powerloss import (LifetimePowerLoss, PowerLossReport, plot_powerloss, powerloss_frame,
                        run_lifetime_powerloss, run_powerloss)
from .schedule import DEFAULT, FINISH, HANDOFF, SMALL, Scenario, Step
from .stress import MAX_CRASH_AFTER, StressReport, run_stress
from .sweep import (ACCEPT, BATCH, EXPECTED_DEAD, EXPECTED_DONE, EXPECTED_TOTAL, FAULTS,
                    SCHEDULES, STEPS, LifetimeRow, SweepRow, audit, current_handler, plot_sweep,
                    run_lifetime_sweep, run_sweep, run_to_completion, sweep_frame)

__all__ = ["ACCEPT", "BATCH", "DEFAULT", "EXPECTED_DEAD", "EXPECTED_DONE", "EXPECTED_TOTAL",
           "Exploration", "FAULTS", "FINISH", "HANDOFF", "HostageRun", "LifetimePowerLoss",
           "LifetimeRow", "MAX_CRASH_AFTER", "NETWORK_FAULTS", "NETWORK_STEPS", "NetRow",
           "PowerLossReport", "SCHEDULES", "SMALL", "STEPS", "Scenario", "Step", "StressReport",
           "SweepRow", "audit", "current_handler", "explore", "hold_hostage", "network_frame",
           "plot_network_sweep", "plot_powerloss", "plot_state_space", "plot_sweep",
           "powerloss_frame", "replay", "run_lifetime_powerloss", "run_lifetime_sweep",
           "run_network_sweep", "run_powerloss", "run_stress", "run_sweep", "run_to_completion",
           "sweep_frame"]
