"""File size over a steady load, with and without ``prune`` (notebook 13's figure).

The same load on two fresh files: each round enqueues a batch of orders
with a 2 KB note in their payload, processes them all, and moves the model
clock on; one file is pruned after each round (``prune(older_than)``), the
other never. After each round the file's bytes (the file and its ``-wal``,
after a checkpoint) are measured. Commits run at ``synchronous=NORMAL``
here: the bytes a file holds do not depend on when they reach the disk.
"""

from __future__ import annotations

import json
import sqlite3
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from ...clock import ModelClock
from ...handler import Handler
from ...queue import Queue
from ...worker import drain

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

NOTE = "x" * 2000


def _bytes(path: Path) -> int:
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    finally:
        conn.close()
    return sum(p.stat().st_size for p in (path, Path(f"{path}-wal")) if p.exists())


def _orders(first: int, count: int) -> str:
    return "\n".join(json.dumps({"event_id": f"E{n:04d}", "payload": {
        "category": "book", "amount_cents": n, "note": NOTE}}) for n in range(first, first + count))


def steady_load(rounds: int = 12, per_round: int = 100, seconds_per_round: int = 60,
                older_than: int = 120) -> "pd.DataFrame":
    """Bytes after each round, pruned and unpruned, and the money and effects of each file."""
    import pandas as pd

    rows = []
    with tempfile.TemporaryDirectory(prefix="queue-growth-") as folder:
        for pruned in (False, True):
            clock = ModelClock(1000)
            path = Path(folder) / f"{'pruned' if pruned else 'kept'}.sqlite3"
            queue = Queue(path, clock=clock, synchronous="NORMAL")
            for n in range(rounds):
                queue.enqueue_jsonl(_orders(1 + n * per_round, per_round))
                drain(queue, Handler(), batch_size=50)
                clock.advance(seconds_per_round)
                dropped = queue.prune(older_than).messages if pruned else 0
                status = queue.status()
                rows.append({"with prune": pruned, "round": n + 1,
                             "events": (n + 1) * per_round, "bytes": _bytes(path),
                             "pruned": status.pruned, "dropped": dropped,
                             "money": status.total, "effects": status.effects})
    return pd.DataFrame(rows)


def plot_growth(frame: "pd.DataFrame", title: str = "File size over a steady load") -> "Figure":
    """File size (KB) against events processed: one line without prune, one with."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.2))
    for pruned, colour, label in ((False, "#c62828", "never pruned"),
                                  (True, "#2e7d32", "pruned after every round")):
        mine = frame[frame["with prune"] == pruned]
        ax.plot(mine["events"], mine["bytes"] / 1024, marker="o", color=colour, label=label)
        last = mine.iloc[-1]
        ax.annotate(f"{last['bytes'] / 1024:.0f} KB", (last["events"], last["bytes"] / 1024),
                    textcoords="offset points", xytext=(6, 0), va="center", color=colour)
    ax.set_xlabel("events processed (each with a 2 KB payload)")
    ax.set_ylabel("file size, KB (file + WAL)")
    ax.set_ylim(bottom=0)
    ax.set_title(title)
    ax.legend(loc="upper left", frameon=False)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig
