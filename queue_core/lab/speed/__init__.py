"""What a message costs (notebooks 08 and 10): commits, flushes, worker processes.

Each commit of a few messages, with its pages and its fsync (``commits``);
the rates of three workloads against flush latency (``flushcurve``), on a
slow disk made of a fast one (``slowdisk``: every fsync delayed, and
counted); throughput against worker processes on both stores, and what
decides its trend on this machine (``scaling``), also against raw commits
of as many clients (``rawcommits``: ``make scale``'s curve in small). These
measure; ``make bench`` compares with the peer queues, and ``benchplot``
draws a run of it.

    from queue_core.lab.speed import measure_scaling, plot_scaling

A name is imported from its module when it is first used, as in
``queue_core`` itself: a raw-commit client or a worker process started as
``python -m queue_core.lab.speed.<module>`` loads only what its module needs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...lazy import exports as _exports

_HOME = {
    "plot_throughput": "benchplot",
    "consume_transactions": "commits", "plot_transactions": "commits",
    "describe_flush_curve": "flushcurve", "flush_curve_frame": "flushcurve",
    "measure_flush_curve": "flushcurve", "plot_flush_curve": "flushcurve",
    **{name: "scaling" for name in (
        "CurvePoint", "ScalingRow", "against_raw_commits", "commit_cost", "describe_curve",
        "describe_scaling", "machine_busy", "measure_scaling",
        "pg_round_trips", "plot_curve", "plot_scaling", "scaling_frame")},
}

if TYPE_CHECKING:
    from .benchplot import plot_throughput
    from .commits import consume_transactions, plot_transactions
    from .flushcurve import (describe_flush_curve, flush_curve_frame, measure_flush_curve,
                             plot_flush_curve)
    from .scaling import (CurvePoint, ScalingRow, against_raw_commits, commit_cost,
                          describe_curve, describe_scaling, machine_busy,
                          measure_scaling, pg_round_trips, plot_curve, plot_scaling,
                          scaling_frame)


__getattr__, __dir__ = _exports(__name__, _HOME)


__all__ = sorted(_HOME)
