"""Every commit of a message: what the worker loop's fused step saves.

The course teaches the protocol as ``claim`` then ``complete``: two
commits per message, the claim's without an fsync of its own. The worker
loop (``drain``) acknowledges each message and claims the next in one
transaction (``Queue.complete_and_claim``). ``consume_transactions``
consumes three orders each way on a fresh file, with the power-loss
sweep's recorder (``powerloss.record``: checkpoints off, every commit's
WAL frames and durability noted), and returns each commit in order: the
messages it acknowledged and claimed, whether it waited for an fsync, the
pages it wrote. ``plot_transactions`` draws them, one box per commit.

    ways = consume_transactions()
    plot_transactions(ways)               # matplotlib loads only here
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...handler import Handler
from ...values import State
from ...worker import drain
from ..sweeps.powerloss import Scenario, record

ORDERS = "".join(json.dumps({"event_id": f"E{i:04d}", "payload": {
    "category": "book", "amount_cents": 100 * i}}) + "\n" for i in range(1, 4))


@dataclass(frozen=True)
class Transaction:
    """One commit of a consume run: the messages it acknowledged and claimed,
    whether it waited for an fsync (FULL), and the WAL pages it wrote."""

    acked: tuple[str, ...]
    claimed: tuple[str, ...]
    fsynced: bool
    pages: int

    @property
    def label(self) -> str:
        return "\n".join([*(f"ACK {e}" for e in self.acked), *(f"claim {e}" for e in self.claimed)])


def _claim_then_ack(open_queue: Any, clock: Any) -> None:
    queue = open_queue()
    queue.enqueue_jsonl(ORDERS)
    while (lease := queue.claim()) is not None:
        queue.complete(lease, Handler())
    _exactly_once(queue)


def _worker_loop(open_queue: Any, clock: Any) -> None:
    queue = open_queue()
    queue.enqueue_jsonl(ORDERS)
    drain(queue, Handler())
    _exactly_once(queue)


def _exactly_once(queue: Any) -> None:
    status = queue.status()
    found = (status.states["done"], status.effects, status.total, queue.audit())
    if found != (3, 3, 600, []):
        raise RuntimeError(f"three orders were not consumed exactly once: {found}")


CONSUMERS = {"claim, then ACK": _claim_then_ack, "the worker loop (drain)": _worker_loop}


def consume_transactions() -> dict[str, tuple[Transaction, ...]]:
    """Three orders consumed each way (``CONSUMERS``) on a fresh file at the
    default durability: every commit after the enqueue, in order, read from
    the WAL (checkpoints off) as the power-loss sweep reads it."""
    found = {}
    with tempfile.TemporaryDirectory(prefix="queue-commits-") as tmp:
        for n, (way, play) in enumerate(CONSUMERS.items()):
            run = record(Scenario(f"way{n}", play, Handler, {}, {}), Path(tmp), "FULL")
            ends = [0, *(commit.frames for commit in run.commits)]
            found[way] = tuple(
                Transaction(tuple(t.event_id for t in c.journal if t.to_state == State.DONE),
                            tuple(t.event_id for t in c.journal if t.to_state == State.LEASED),
                            c.durable, end - start)
                for c, start, end in zip(run.commits, ends, ends[1:]) if c.kind != "enqueue")
    return found


def plot_transactions(ways: dict[str, tuple[Transaction, ...]],
                      title: str = "Three messages consumed two ways: every commit") -> Any:
    """One row per way: each commit a box as wide as the pages it wrote, in
    order; a black bar where it waited for its fsync."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch, Rectangle

    colours = {"claim": "#c6dbef", "ACK": "#3182bd", "ACK that claims the next": "#756bb1"}
    widest = max(sum(t.pages for t in commits) for commits in ways.values())
    fig, ax = plt.subplots(figsize=(11, 1.1 * len(ways) + 1.3))
    for y, commits in enumerate(ways.values()):
        x = 0
        for t in commits:
            kind = "ACK that claims the next" if t.acked and t.claimed else \
                "ACK" if t.acked else "claim"
            ax.add_patch(Rectangle((x, y - 0.32), t.pages, 0.64, fc=colours[kind], ec="white",
                                   lw=2))
            ax.text(x + t.pages / 2, y, t.label, ha="center", va="center", fontsize=8,
                    color="black" if kind == "claim" else "white")
            if t.fsynced:
                ax.plot([x + t.pages] * 2, [y - 0.42, y + 0.42], color="black", lw=3)
            x += t.pages
        ax.text(x + 0.6, y, f"{len(commits)} commits\n{sum(t.fsynced for t in commits)} fsyncs"
                f"\n{x} pages", va="center", fontsize=9)
    ax.set(xlim=(0, widest + 5), ylim=(len(ways) - 0.5, -0.5), title=title,
           xlabel="WAL pages written, commit after commit (each box: one commit)")
    ax.set_yticks(range(len(ways)), list(ways))
    ax.spines[["top", "right"]].set_visible(False)
    ax.legend(handles=[*(Patch(color=c, label=k) for k, c in colours.items()),
                       Line2D([], [], color="black", lw=3, label="the commit waits for an fsync")],
              loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=4, frameon=False,
              fontsize="small")
    fig.tight_layout()
    return fig
