"""The course's pictures (every chapter) and notebook 00's summary card.

A message's states over time and the state machine with its edges counted
(``timeline``); two consumers' turns and a sequence of calls (``workers``);
how long a message waits, and the oldest due message of each priority
(``priorities``); every public call of the package in one table (``card``). Each plot imports
pandas and matplotlib when it is drawn, not when it is imported.

    from queue_core.lab.plots import plot_timeline, transitions_frame
"""

from .card import summary_card
from .priorities import ahead_over_time, oldest_due, plot_oldest_due, plot_wait_behind
from .timeline import (STATE_COLORS, Mark, arrow_counts, mark, metrics_frame, plot_metrics,
                       plot_state_machine, plot_timeline, transitions_frame)
from .workers import consumer_turns, consumers_frame, plot_consumers, plot_sequence

__all__ = ["STATE_COLORS", "Mark", "ahead_over_time", "arrow_counts", "consumer_turns",
           "consumers_frame", "mark", "metrics_frame", "oldest_due", "plot_consumers",
           "plot_metrics", "plot_oldest_due", "plot_sequence", "plot_state_machine",
           "plot_timeline", "plot_wait_behind", "summary_card", "transitions_frame"]
