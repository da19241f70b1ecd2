"""Notebook 15's pictures: how long a message waits, drawn from stored values.

``plot_wait_behind``: how many messages were still ahead of one message,
second by second, from its enqueue to its claim, read from the journal.
``plot_oldest_due``: for each priority, the age of its oldest due message
over model time (``Metrics.priorities``), one line per run, with a bound
where one is given. pandas and matplotlib are imported when a plot is drawn.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, Mapping, Sequence

from ...values import Metrics, State, Transition
from .timeline import FIG_WIDTH, STATE_COLORS

if TYPE_CHECKING:
    from matplotlib.figure import Figure

RUN_COLORS = ("#984ea3", "#4daf4a", "#377eb8")  # in the order the runs are given


def ahead_over_time(journal: Iterable[Transition], event_id: str) -> dict[int, int]:
    """For each model second from ``event_id``'s enqueue to its first claim, how many
    messages were still to be claimed before it (each message's first claim counts)."""
    rows = list(journal)
    enqueued = next(r.at for r in rows if r.event_id == event_id and r.reason == "enqueued")
    claim = next(r for r in rows if r.event_id == event_id and r.reason == "claimed")
    first: dict[str, int] = {}
    for row in rows:
        if row.reason == "claimed" and row.seq < claim.seq:
            first.setdefault(row.event_id, row.at)
    return {second: sum(1 for at in first.values() if at >= second)
            for second in range(enqueued, claim.at + 1)}


def plot_wait_behind(journal: Iterable[Transition], event_id: str, *, title: str) -> "Figure":
    """The messages still ahead of ``event_id`` over model time, until its claim, which
    is marked with how long it waited."""
    import matplotlib.pyplot as plt

    ahead = ahead_over_time(journal, event_id)
    seconds, counts = list(ahead), list(ahead.values())
    fig, ax = plt.subplots(figsize=(FIG_WIDTH, 3.6))
    ax.step(seconds, counts, where="post", color=STATE_COLORS[State.READY],
            label=f"messages still to be claimed before {event_id}")
    ax.fill_between(seconds, counts, step="post", color=STATE_COLORS[State.READY], alpha=0.15)
    claimed, waited = seconds[-1], seconds[-1] - seconds[0]
    ax.plot(claimed, 0, marker="o", markersize=9, color=STATE_COLORS[State.LEASED],
            markeredgecolor="black", ls="", label=f"{event_id} claimed at t={claimed}")
    ax.annotate(f"{event_id} waited {waited} s", (claimed, 0), xytext=(-14, 22),
                textcoords="offset points", ha="right", fontsize=9,
                bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": "0.6"})
    ax.set_xlim(seconds[0], claimed + max(1, waited // 20))
    ax.set_ylim(0, max(counts) * 1.1 + 1)
    ax.set_xlabel("model time (s)")
    ax.set_ylabel("messages ahead of it")
    ax.set_title(title, fontsize=10)
    ax.legend(loc="upper right", fontsize=9)
    ax.grid(color="0.9")
    fig.tight_layout()
    return fig


def oldest_due(samples: Iterable[Metrics], priority: int) -> dict[int, float]:
    """The age of the oldest due message of ``priority`` at each sample (NaN where none
    of that priority is due: a gap in the line, not an age of 0)."""
    ages: dict[int, float] = {}
    for metrics in samples:
        figures = metrics.priorities.get(priority)
        age = None if figures is None else figures.oldest_ready_age
        ages[metrics.at] = float("nan") if age is None else float(age)
    return ages


def plot_oldest_due(runs: Mapping[str, Sequence[Metrics]], panels: Mapping[int, str], *,
                    title: str, bounds: Mapping[int, float] | None = None) -> "Figure":
    """One panel per priority of ``panels`` (priority: what its messages are): the age of
    its oldest due message over model time, a line per run; a dashed line at the bound
    of ``bounds``, where given."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(panels), 1, figsize=(FIG_WIDTH, 2.2 + 2.3 * len(panels)),
                             sharex=True, squeeze=False)
    for ax, (priority, what) in zip(axes[:, 0], panels.items()):
        for (name, samples), color in zip(runs.items(), RUN_COLORS):
            ages = oldest_due(samples, priority)
            ax.plot(list(ages), list(ages.values()), color=color, lw=2, label=name)
            due = [(at, age) for at, age in ages.items() if age == age]
            if due:  # where the line ends: the last sample with a message of it due
                ax.plot(*due[-1], marker="o", markersize=5, color=color)
        if bounds and priority in bounds:
            ax.axhline(bounds[priority], color="black", ls="--", lw=1,
                       label=f"bound (wait_bound): {bounds[priority]:g} s")
        # a line at 0 stays in sight above the axis, a bound's line below the frame
        top = max(ax.get_ylim()[1], 10, 1.1 * bounds[priority] if bounds and priority in bounds
                  else 0)
        ax.set_ylim(-0.04 * top, top)
        ax.set_ylabel("oldest due message's\nage (model s)")
        ax.set_title(f"priority {priority}: {what}", fontsize=10, loc="left")
        ax.legend(loc="upper left", fontsize=9)
        ax.grid(color="0.9")
    axes[-1, 0].set_xlabel("model time (s)")
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    return fig
