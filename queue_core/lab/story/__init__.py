"""The course's story and its actors (notebooks 00 to 07, 10, 13, 15, the exercises).

The reference scenario's input and clock (``scenario``), played end to end
(``demo``); a worker in a real OS process that dies by ``os._exit`` at a
named crash point (``child``); the deliberately broken protocols kept as
contrasts, and a cleanup of old history that forgets their keys
(``contrasts``); a handler with transient faults injected on purpose
(``faults``); a load of bulk orders and urgent refunds played on the model
clock, the strict-priority contrast, and how long each message waited
(``priorities``). None of it is protocol: the protocol is ``queue_core``.

    from queue_core.lab.story import DEMO_JSONL, run_child, run_scenario
"""

from .child import ChildResult, collect, mode_for, open_gate, reap, run_child
from .contrasts import (PROTOCOLS, REAL, Books, Cleanup, Protocol, naive_cleanup, protocol,
                        read_books)
from .demo import DemoReport, play_scenario, run_demo, run_scenario
from .faults import FlakyHandler
from .priorities import (REFUND_HANDLER, Load, StrictPriority, Wait, bulk_import, longest_wait,
                         play_load, read_waits, refunds)
from .scenario import DEMO_JSONL, LEASE_SECONDS, START

__all__ = ["DEMO_JSONL", "LEASE_SECONDS", "START", "Books", "ChildResult", "Cleanup", "DemoReport",
           "FlakyHandler", "naive_cleanup", "read_books",
           "PROTOCOLS", "Protocol", "REAL", "collect", "mode_for", "open_gate", "play_scenario",
           "protocol", "reap", "run_child", "run_demo", "run_scenario",
           "REFUND_HANDLER", "Load", "StrictPriority", "Wait", "bulk_import", "longest_wait",
           "play_load", "read_waits", "refunds"]
