"""A broker beside the queue (notebook 12, exercise 7): Redis Streams and an inbox.

The broker's calls (``streams``); consumer processes that crash or stall
on purpose, naive or with the inbox (``consumer``); the stories played
with them (``play``) and their pictures (``plots``). A broker imports
redis-py only when it first talks to its server.

    from queue_core.lab.broker import open_broker, play_many, plot_deliveries
"""

from .consumer import ConsumerResult, collect_consumer, inbox_step, naive_step, run_consumer
from .play import FAILURES, ORDERS, POISON, BrokerRun, play, play_many, play_poison
from .plots import (outcomes, plot_deliveries, plot_redelivery, plot_refusals, repeat_marks,
                    steps_frame)
from .streams import Broker, DeadLetter, LogStep, Pending, open_broker

__all__ = ["FAILURES", "ORDERS", "POISON", "Broker", "BrokerRun", "ConsumerResult",
           "DeadLetter", "LogStep", "Pending", "collect_consumer", "inbox_step", "naive_step",
           "open_broker", "outcomes", "play", "play_many", "play_poison", "plot_deliveries",
           "plot_redelivery", "plot_refusals", "repeat_marks", "run_consumer", "steps_frame"]
