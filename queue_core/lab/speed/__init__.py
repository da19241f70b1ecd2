"""What a message costs (notebooks 08 and 10): commits, flushes, worker processes.

Each commit of a few messages, with its pages and its fsync (``commits``);
the rates of three workloads against flush latency (``flushcurve``), on a
slow disk made of a fast one (``slowdisk``: every fsync delayed, and
counted); throughput against worker processes on both stores, and what
decides its trend on this machine (``scaling``), also against raw commits
of as many clients (``rawcommits``: ``make scale``'s curve in small). These measure; ``make
bench`` compares with the peer queues, and ``benchplot`` draws a run of it.

    from queue_core.lab.speed import measure_scaling, plot_scaling
"""

from .benchplot import plot_throughput
from .commits import consume_transactions, plot_transactions
from .flushcurve import (describe_flush_curve, flush_curve_frame, measure_flush_curve,
                         plot_flush_curve)
from .scaling import (CurvePoint, ScalingRow, commit_cost, describe_curve, describe_scaling,
                      machine_busy, measure_curve, measure_scaling, pg_round_trips, plot_curve,
                      plot_scaling, scaling_frame)

__all__ = ["CurvePoint", "ScalingRow", "commit_cost", "consume_transactions", "describe_curve",
           "describe_flush_curve", "describe_scaling", "flush_curve_frame", "machine_busy",
           "measure_curve", "measure_flush_curve", "measure_scaling", "pg_round_trips",
           "plot_curve", "plot_flush_curve", "plot_scaling", "plot_throughput",
           "plot_transactions", "scaling_frame"]
