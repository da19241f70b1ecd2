"""Throughput against the number of worker processes, on either store.

``measure_scaling`` enqueues the same batch into a new queue for every
(store, worker count) pair, starts that many real worker processes
(``child``, ``drain`` mode, the model clock fixed so that no lease expires),
lets them go together through a starting gate, and times from the gate's
opening to the last worker's exit. Every run is then audited: each event
done exactly once, reported done by exactly one worker, the money right.
Notebook 10 draws the result with ``plot_scaling``.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from .. import audit
from ..clock import ModelClock
from ..queue import Queue
from .child import collect, open_gate, reap, run_child
from .scenario import START

LONG_LEASE_SECONDS = 600  # the model clock stands still: no lease expires during a run


@dataclass(frozen=True)
class ScalingRow:
    """One timed run: ``workers`` processes draining ``events`` messages on ``store``."""

    store: str
    workers: int
    events: int
    seconds: float
    done: int
    effects: int
    reported_twice: int
    total: int
    expected_total: int
    findings: tuple[str, ...]

    @property
    def per_second(self) -> float:
        return self.events / self.seconds

    @property
    def exactly_once(self) -> bool:
        return (self.done == self.effects == self.events and self.reported_twice == 0
                and self.total == self.expected_total and not self.findings)


def scaling_batch(events: int) -> tuple[str, int]:
    """``events`` valid orders as JSONL, and the money they add together."""
    lines = [json.dumps({"event_id": f"E{n:04d}",
                         "payload": {"category": "book", "amount_cents": 100 + n}})
             for n in range(1, events + 1)]
    return "\n".join(lines) + "\n", sum(100 + n for n in range(1, events + 1))


def time_workers(db: str, store: str, workers: int, events: int) -> ScalingRow:
    """Enqueue ``events`` orders into the new queue ``db``, drain them with
    ``workers`` processes started together, and audit the result."""
    text, expected = scaling_batch(events)
    Queue(db, clock=ModelClock(START)).enqueue_jsonl(text)
    with tempfile.TemporaryDirectory(prefix="queue_gate_") as gate:
        procs = [run_child(db, now=START, lease_seconds=LONG_LEASE_SECONDS, mode="drain",
                           gate=gate, wait=False) for _ in range(workers)]
        try:
            open_gate(gate, workers)
            started = time.perf_counter()
            results = [collect(proc) for proc in procs]  # type: ignore[arg-type]
            seconds = time.perf_counter() - started
        finally:
            reap(procs)  # type: ignore[arg-type]
    reported = Counter(o.event_id for r in results for o in r.outcomes if o.kind == "done")
    snap = audit.snapshot(db)
    return ScalingRow(store, workers, events, seconds,
                      sum(1 for s in snap.states().values() if s == "done"), len(snap.effect_rows),
                      sum(n - 1 for n in reported.values() if n > 1), snap.money, expected,
                      tuple(str(f) for f in audit.check(snap)))


def measure_scaling(new_db: Callable[[str], str], *, stores: Sequence[str] = ("sqlite",),
                    workers: Sequence[int] = (1, 2, 4), events: int = 200) -> list[ScalingRow]:
    """``time_workers`` for every store and worker count; ``new_db(store)``
    returns a new, empty queue location of that store for each run."""
    return [time_workers(new_db(store), store, n, events) for store in stores for n in workers]


def scaling_frame(rows: Sequence[ScalingRow]) -> Any:
    """The runs as a pandas DataFrame: one row per run, messages per second included."""
    import pandas as pd

    return pd.DataFrame([{"store": r.store, "workers": r.workers, "events": r.events,
                          "seconds": round(r.seconds, 3), "per second": round(r.per_second),
                          "exactly once": r.exactly_once} for r in rows])


def plot_scaling(rows: Sequence[ScalingRow], title: str = "Throughput against worker processes"
                 ) -> Any:
    """Messages per second against the number of worker processes, one line per store."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for store, style in (("sqlite", "o-"), ("postgres", "s-")):
        mine = [r for r in rows if r.store == store]
        if mine:
            ax.plot([r.workers for r in mine], [r.per_second for r in mine], style, label=store)
    counts = sorted({r.workers for r in rows})
    ax.set_xticks(counts)
    ax.set_xlabel("worker processes")
    ax.set_ylabel("messages per second")
    ax.set_ylim(bottom=0)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return fig
