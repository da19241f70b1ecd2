"""Pictures of workers: who finished what in a race, and one event's story
as a sequence diagram of workers, the database and the clock.

Drawn from what the database holds (the transitions journal) and what the
worker processes reported; pandas and matplotlib are imported inside each
function, as in ``plots``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

from ..values import Outcome, State
from .plots import FIG_WIDTH, STATE_COLORS, Mark, mark_order, transitions_frame

if TYPE_CHECKING:  # only for annotations: importing them here would defeat the lazy import
    import pandas as pd
    from matplotlib.figure import Figure

    from ..queue import Queue


def consumers_frame(results: Mapping[str, Iterable[Outcome]]) -> "pd.DataFrame":
    """What each consumer reported, one row per outcome, in the order it reported them."""
    import pandas as pd

    rows = [(name, n, o.event_id, o.kind, o.generation,
             None if o.effect is None else o.effect.category,
             0 if o.effect is None else o.effect.amount_cents)
            for name, outcomes in results.items() for n, o in enumerate(outcomes, start=1)]
    return pd.DataFrame(rows, columns=["consumer", "nth", "event_id", "kind", "generation",
                                       "category", "amount_cents"])


def plot_consumers(results: Mapping[str, Iterable[Outcome]],
                   journal: "pd.DataFrame | None" = None,
                   title: str = "Which consumer finished which event") -> "Figure":
    """One row per consumer, one column per event id: who finished what, and how much.

    With the race's ``journal`` (``transitions_frame``), a second panel shows every
    claim and ACK in the order the single writer committed them, on the lane of the
    consumer that reported that event.
    """
    import matplotlib.pyplot as plt

    frame = consumers_frame(results)
    events = sorted(set(frame["event_id"]))
    names = list(results)
    colors = [plt.get_cmap("tab10")(i) for i in range(10)]
    mosaic: list[Any] = [["who", "money"]] + ([["steps", "steps"]] if journal is not None else [])
    height = (2.0 + 0.5 * len(names)) * len(mosaic)
    fig: Figure
    fig, axes = plt.subplot_mosaic(mosaic, figsize=(FIG_WIDTH, height), width_ratios=[3, 1])
    ax, bars = axes["who"], axes["money"]
    lanes = [f"{name}\n({int((frame['consumer'] == name).sum())} events)" for name in names]
    for lane, name in enumerate(names):
        mine = frame[frame["consumer"] == name]
        ax.scatter([events.index(e) for e in mine["event_id"]], [lane] * len(mine), s=90,
                   marker="s", color=colors[lane % 10])
        bars.barh(lane, int(mine["amount_cents"].sum()), color=colors[lane % 10])
    ax.set_xticks(range(len(events)), events, rotation=90, fontsize=8)
    _lanes(ax, lanes)
    _lanes(bars, [""] * len(names))
    fig.suptitle(title)
    ax.set_title("event ids each consumer finished", fontsize=10)
    bars.set_xlabel("cents added")
    bars.set_title("money per consumer", fontsize=10)
    if journal is not None:
        _plot_steps(axes["steps"], journal, frame, names, lanes)
    fig.tight_layout()
    return fig


def _lanes(ax: Any, labels: list[str]) -> None:
    ax.set_yticks(range(len(labels)), labels)
    ax.set_ylim(len(labels) - 0.5, -0.5)


def _plot_steps(ax: Any, journal: "pd.DataFrame", frame: "pd.DataFrame", names: list[str],
                lanes: list[str]) -> None:
    """Each claim and ACK in commit order, on the lane of the consumer that did it."""
    from matplotlib.lines import Line2D

    owner = dict(zip(frame["event_id"], frame["consumer"]))
    steps = journal[journal["event_id"].isin(owner.keys()) & journal["from_state"].notna()]
    for order, (_, row) in enumerate(steps.iterrows(), start=1):
        state = State(row["to_state"])
        ax.scatter(order, names.index(owner[row["event_id"]]), s=40, color=STATE_COLORS[state],
                   marker="o" if state == State.LEASED else "s")
    _lanes(ax, lanes)
    ax.set_xlabel("step in commit order (journal); every step at the same model second")
    turns = consumer_turns(journal, frame)
    said = (f"{turns} change{'' if turns == 1 else 's'} of turn" if turns else
            "no change of turn: one process won the lock first and kept it to the end")
    ax.set_title(f"one writer at a time, in the order SQLite committed: {said}", fontsize=10)
    ax.legend(handles=[Line2D([], [], ls="", marker="o", color=STATE_COLORS[State.LEASED],
                              label="claim (to leased)"),
                       Line2D([], [], ls="", marker="s", color=STATE_COLORS[State.DONE],
                              label="ACK (to done)")],
              loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9)


def consumer_turns(journal: "pd.DataFrame", frame: "pd.DataFrame") -> int:
    """How often the writer changed from one consumer to the other, in commit order
    (``frame``: ``consumers_frame``, saying which consumer reported each event)."""
    owner = dict(zip(frame["event_id"], frame["consumer"]))
    steps = journal[journal["event_id"].isin(owner.keys()) & journal["from_state"].notna()]
    who = [owner[e] for e in steps["event_id"]]
    return sum(a != b for a, b in zip(who, who[1:]))


def plot_sequence(source: "Queue | pd.DataFrame", event_id: str, workers: Mapping[int, str], *,
                  marks: Sequence[tuple[str, Mark]] = (), lease_seconds: int | None = None,
                  title: str = "Who talks to SQLite, and when") -> "Figure":
    """A sequence diagram of one message: clock, each worker, SQLite.

    Model time runs down. Every journal row of ``event_id`` is an arrow from the
    worker holding that generation (``workers``: generation -> name) to SQLite,
    or a note on SQLite's line (an expired lease it noticed, a redrive). A
    worker's lease is a bar on its line until ``lease_until``; ``marks`` are
    ``(worker, Mark)`` pairs for what the journal cannot hold (a rejected ACK).
    """
    import matplotlib.pyplot as plt

    frame: pd.DataFrame = source if hasattr(source, "columns") else transitions_frame(source)
    rows = frame[frame["event_id"] == event_id]
    names = list(dict.fromkeys(workers.values()))
    columns = {"clock": 0.0, **{n: 1.0 + i for i, n in enumerate(names)}, "SQLite": 1.0 + len(names)}
    rows = rows[rows["from_state"].notna()]  # the enqueue is no worker's step
    only = [m for _, m in marks]
    y = _sequence_heights(rows, only)
    lease = lease_seconds if lease_seconds is not None else 0
    span = max([*rows["at"], *(m.at for m in only)]) - min(rows["at"])
    fig, ax = plt.subplots(figsize=(FIG_WIDTH, 2.0 + 0.85 * span))
    for name, cx in columns.items():
        ax.text(cx, -0.35 + min(rows["at"]), name, ha="center", va="bottom", fontsize=11,
                fontweight="bold")
        ax.axvline(cx, color="0.75", ls="--", lw=1, zorder=0)
    sqlite = columns["SQLite"]
    for seq, row in rows.iterrows():
        at = y[float(seq)]
        who = workers.get(int(row["generation"]))
        if row["reason"] == "claimed" and who is not None:
            until = row["at"] + lease
            ax.add_patch(plt.Rectangle((columns[who] - 0.06, at), 0.12, until - at,
                                       color=STATE_COLORS[State.LEASED], alpha=0.45, lw=0))
            _arrow(ax, columns[who], sqlite, at, f"claim -> g{row['generation']}, lease until "
                                               f"{until}" if lease else f"claim -> g{row['generation']}",
                   "black")
            ax.text(columns["clock"] + 0.05, until, f"{until}: lease g{row['generation']} ends",
                    va="center", fontsize=8, color=STATE_COLORS[State.LEASED])
        elif row["reason"] == "completed" and who is not None:
            _arrow(ax, columns[who], sqlite, at, f"complete(g{row['generation']}): effect + ACK",
                   STATE_COLORS[State.DONE])
        elif who is not None and row["from_state"] == str(State.LEASED) \
                and row["reason"] != "lease_expired":
            _arrow(ax, columns[who], sqlite, at, f"{row['reason']} (g{row['generation']}) -> "
                                               f"{row['to_state']}", STATE_COLORS[State(row["to_state"])])
        else:
            note = _NOTES.get(row["reason"], "{reason}: g{generation} -> {to_state}")
            ax.text(sqlite + 0.08, at, note.format(**row), va="center", fontsize=8,
                    color=STATE_COLORS[State(row["to_state"])])
    for (who, m), order in zip(marks, mark_order(only)):
        claims = rows[(rows["reason"] == "claimed") & (rows["generation"].map(workers) == who)]
        if len(claims):  # the worker was silent from its last claim to this moment
            since = y[float(claims.index[-1])]
            ax.plot([columns[who]] * 2, [since, y[order]], color="0.35", lw=2.5, ls=":")
            ax.text(columns[who] - 0.08, (since + y[order]) / 2, "stalled", rotation=90,
                    ha="right", va="center", fontsize=8, color="0.35")
        _arrow(ax, columns[who], sqlite, y[order], m.label, "crimson", rejected=True)
    from matplotlib.patches import Patch
    ax.legend(handles=[Patch(color=STATE_COLORS[State.LEASED], alpha=0.45,
                             label="lease held (until lease_until)")],
              loc="lower right", fontsize=8, frameon=False)
    ax.set_xlim(-0.4, sqlite + 1.6)
    top, bottom = min(rows["at"]) - 0.5, max([*rows["at"], *(m.at for m in only)]) + 1.2
    ax.set_ylim(bottom, top)
    ax.set_yticks(range(int(min(rows["at"])), int(bottom) + 1))
    ax.set_ylabel("model time (s), running down")
    ax.set_xticks([])
    for side in ("top", "right", "bottom"):
        ax.spines[side].set_visible(False)
    ax.set_title(title)
    fig.tight_layout()
    return fig


_NOTES = {"lease_expired": "g{generation}'s lease expired: back to ready",
          "redrive": "redrive: dead -> ready (generation kept)"}


def _sequence_heights(rows: "pd.DataFrame", marks: Sequence[Mark]) -> dict[float, float]:
    """y of each journal row and mark: its model second, then a quarter second
    down for each earlier step of that second, in journal order."""
    keys = [(int(at), float(seq)) for seq, at in zip(rows.index, rows["at"])]
    keys += [(m.at, order) for m, order in zip(marks, mark_order(marks))]
    y: dict[float, float] = {}
    for second in sorted({at for at, _ in keys}):
        same = sorted(order for at, order in keys if at == second)
        y.update({order: second + 0.25 * rank for rank, order in enumerate(same)})
    return y


def _arrow(ax: Any, x0: float, x1: float, y: float, label: str, color: Any, *,
           rejected: bool = False) -> None:
    """A message from one line to another at height ``y``, labelled above it."""
    ax.annotate("", (x1, y), xytext=(x0, y),
                arrowprops={"arrowstyle": "-|>", "color": color, "lw": 1.5,
                            "ls": "--" if rejected else "-"})
    ax.text((x0 + x1) / 2, y - 0.04, label, ha="center", va="bottom", fontsize=8, color=color)
    if rejected:
        ax.plot(x1 - 0.08, y, marker="X", color="crimson", markersize=10, markeredgecolor="black")
