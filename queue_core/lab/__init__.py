"""The course's lab: everything the notebooks use to show the engine at work.

The engine (``queue_core``) holds the protocol and its public API; the lab
sits above it and adds what a course needs and a worker does not: real
worker processes that crash on purpose (``child``), deliberately broken
protocols kept as contrasts (``contrasts``), a handler with injected faults
(``faults``), the reference scenario (``scenario``, ``demo``), the crash
sweep (``sweep``), the power-loss sweep (``powerloss``, ``wal``), the
schedule explorer (``explore``, ``schedule``), the stress run (``stress``),
throughput against worker processes (``scaling``), a PostgreSQL server of
its own and a fresh schema per run (``postgres_server``, ``pgcases``), a
Redis broker beside the queue with consumer processes that crash or stall
on purpose (``redis_server``, ``broker``, ``broker_consumer``,
``broker_play``, ``broker_plots``), the exercises and their checks
(``exercises``, ``exercise_setup``, ``exercise_inbox``), the pictures
(``plots``, ``plots_workers``) and notebook 00's summary card of every call
(``card``).

Importing the lab imports neither pandas, matplotlib, psycopg nor redis; a
plot imports the first two when it is drawn, ``DatabaseClock`` the third when
it is first named, a broker the fourth when it first talks to its server.
Notebooks import these public names:

    from queue_core.lab import run_child, plot_timeline, transitions_frame
"""

from .broker import Broker, DeadLetter, LogStep, Pending, open_broker
from .broker_consumer import ConsumerResult, collect_consumer, run_consumer
from .broker_play import FAILURES, ORDERS, BrokerRun, play, play_many, play_poison
from .broker_plots import (outcomes, plot_deliveries, plot_redelivery, plot_refusals,
                           repeat_marks, steps_frame)
from .child import ChildResult, collect, open_gate, reap, run_child
from .contrasts import PROTOCOLS, REAL, Protocol, protocol
from .demo import DemoReport, play_scenario, run_demo, run_scenario
from .faults import FlakyHandler
from .postgres_server import fresh_schema, private_postgres
from .redis_server import private_redis
from .scaling import ScalingRow, measure_scaling, plot_scaling, scaling_frame
from .powerloss import PowerLossReport, plot_powerloss, powerloss_frame, run_powerloss
from .explore import Exploration, explore, plot_state_space, replay
from .schedule import FINISH, SMALL, Scenario, Step
from .card import summary_card
from .plots import (STATE_COLORS, Mark, arrow_counts, mark, metrics_frame, plot_metrics,
                    plot_state_machine, plot_timeline, transitions_frame)
from .plots_workers import consumer_turns, consumers_frame, plot_consumers, plot_sequence
from .scenario import DEMO_JSONL, LEASE_SECONDS, START
from .stress import StressReport, run_stress
from .sweep import SCHEDULES, STEPS, SweepRow, plot_sweep, run_sweep, sweep_frame

__all__ = [
    "ChildResult", "DEMO_JSONL", "arrow_counts", "summary_card", "DemoReport", "Exploration", "FINISH", "SMALL", "Scenario", "Step", "consumer_turns", "explore",
    "plot_sequence", "plot_state_space", "replay", "FlakyHandler", "LEASE_SECONDS", "Mark",
    "PROTOCOLS", "PowerLossReport", "Protocol", "REAL", "SCHEDULES", "START", "STATE_COLORS", "STEPS", "StressReport",
    "SweepRow", "collect", "consumers_frame", "mark", "metrics_frame", "open_gate",
    "plot_consumers", "plot_metrics", "plot_powerloss", "plot_state_machine", "plot_sweep",
    "plot_timeline", "powerloss_frame", "fresh_schema", "play_scenario", "private_postgres",
    "DatabaseClock", "ScalingRow", "measure_scaling", "plot_scaling", "scaling_frame",
    "protocol", "reap", "run_child", "run_demo", "run_powerloss", "run_scenario", "run_stress",
    "run_sweep",
    "sweep_frame", "transitions_frame",
    "Broker", "BrokerRun", "ConsumerResult", "DeadLetter", "FAILURES", "LogStep", "ORDERS",
    "Pending", "collect_consumer", "open_broker", "outcomes", "play", "play_many", "play_poison",
    "plot_deliveries", "plot_redelivery", "plot_refusals", "private_redis", "repeat_marks",
    "run_consumer", "steps_frame",
]


def __getattr__(name: str) -> object:
    """``DatabaseClock`` on first use: importing the lab does not load psycopg."""
    if name == "DatabaseClock":
        from ..postgres import DatabaseClock
        return DatabaseClock
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
