"""Pictures of workers: who finished what in a race, and one event's story
as a sequence diagram of workers, the database and the clock.

Drawn from what the database holds (the transitions journal) and what the
worker processes reported; pandas and matplotlib are imported inside each
function, as in ``timeline``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

from ...values import Outcome, State
from .timeline import FIG_WIDTH, STATE_COLORS, Mark, mark_order, transitions_frame

if TYPE_CHECKING:  # only for annotations: importing them here would defeat the lazy import
    import pandas as pd
    from matplotlib.figure import Figure

    from ...queue import Queue


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
    said = (f"the write lock changed hands {turns} time{'' if turns == 1 else 's'}" if turns
            else "the write lock never changed hands: one process won it first and kept it to "
                 "the end")
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

    Model time runs down, one band per model second (labelled in the clock
    column); the steps of one second are drawn inside its band, in journal
    order. Every journal row of ``event_id`` is an arrow from the worker
    holding that generation (``workers``: generation -> name) to SQLite, or a
    note on SQLite's line (an expired lease it noticed, a redrive). A worker's
    lease is a bar on its line from its claim to where that lease ended: its
    ACK, its failure, or its expiry at ``lease_until`` (the claim plus
    ``lease_seconds``), which a later claim notices when it takes the message
    over. ``marks`` are ``(worker, Mark)`` pairs for what the journal cannot
    hold (a rejected ACK).
    """
    import matplotlib.pyplot as plt

    frame: pd.DataFrame = source if hasattr(source, "columns") else transitions_frame(source)
    rows = frame[(frame["event_id"] == event_id) & frame["from_state"].notna()]
    if rows.empty:  # the enqueue is no worker's step
        raise ValueError(f"the journal holds no step of {event_id} after its enqueue")
    names = list(dict.fromkeys(workers.values()))
    columns = {"clock": 0.0, **{n: 1.0 + i for i, n in enumerate(names)}, "SQLite": 1.0 + len(names)}
    leases = _lease_spans(rows, workers, lease_seconds)
    lay = _SequenceLayout(rows, [m for _, m in marks], [s.expires for s in leases])
    fig, ax = plt.subplots(figsize=(FIG_WIDTH, 1.3 + 0.34 * (lay.bottom - lay.top)))
    _draw_frame(ax, columns, lay)
    for span in leases:
        _draw_lease(ax, columns[span.worker], span, lay)
    for seq, row in rows.iterrows():
        _draw_step(ax, row, lay.y[float(seq)], workers.get(int(row["generation"])), columns,
                   lease_seconds)
    _draw_marks(ax, marks, rows, workers, columns, lay)
    _sequence_legend(ax)
    ax.set_title(title)
    fig.tight_layout()
    return fig


@dataclass(frozen=True, slots=True)
class _LeaseSpan:
    """One named worker's lease: from its claim row to the journal row that ended
    it (``until_seq``), or to its expiry second (``expires``), or open."""

    worker: str
    generation: int
    claim_seq: float
    until_seq: float | None
    expires: int | None


def _lease_spans(rows: "pd.DataFrame", workers: Mapping[int, str],
                 lease_seconds: int | None) -> list[_LeaseSpan]:
    """Where each named worker's lease began and ended, read from the journal."""
    spans = []
    claims = rows[rows["reason"] == "claimed"]
    for seq, claim in claims.iterrows():
        who = workers.get(int(claim["generation"]))
        if who is None:
            continue
        later = rows[(rows.index > seq) & (rows["from_state"] == str(State.LEASED))
                     & (rows["generation"] == claim["generation"])]
        ended = later.iloc[0] if len(later) else None
        until = None if lease_seconds is None else int(claim["at"]) + lease_seconds
        if ended is not None and ended["reason"] != "lease_expired":
            spans.append(_LeaseSpan(who, int(claim["generation"]), float(seq),
                                    float(later.index[0]), None))
        elif until is not None:   # ran out, noticed by a later claim or not yet
            spans.append(_LeaseSpan(who, int(claim["generation"]), float(seq), None, until))
        else:                     # no deadline known: until the takeover, or open
            spans.append(_LeaseSpan(who, int(claim["generation"]), float(seq),
                                    None if ended is None else float(later.index[0]), None))
    return spans


class _SequenceLayout:
    """Heights in the picture: one band per model second, its steps one row each.

    ``y`` maps a journal ``seq`` (or a mark's ``mark_order``) to the middle of
    its row; ``band`` maps a second to the top of its band. A second with no
    step gets a thin band, so waiting shows; a long wait is one band.
    """

    ROW, PAD, EMPTY = 1.0, 0.45, 0.9

    def __init__(self, rows: "pd.DataFrame", marks: Sequence[Mark],
                 expiries: Iterable[int | None]) -> None:
        keys = [(int(at), float(seq)) for seq, at in zip(rows.index, rows["at"])]
        keys += [(m.at, order) for m, order in zip(marks, mark_order(marks))]
        busy = sorted({at for at, _ in keys} | {e for e in expiries if e is not None})
        self.y: dict[float, float] = {}
        self.band: dict[int, float] = {}
        self.labels: list[tuple[float, str]] = []
        top = 0.0
        for previous, second in zip([None, *busy], busy):
            if previous is not None and second - previous > 1:   # seconds with nothing
                waited = (f"{previous + 1}" if second - previous == 2
                          else f"{previous + 1}-{second - 1}")
                self.labels.append((top, waited))
                top += self.EMPTY
            self.band[second] = top
            self.labels.append((top, str(second)))
            same = sorted(order for at, order in keys if at == second)
            self.y.update({order: top + self.PAD + self.ROW * (rank + 0.5)
                           for rank, order in enumerate(same)})
            top += self.PAD + self.ROW * len(same) if same else self.EMPTY
        self.top, self.bottom = -1.1, top + 0.2


def _draw_frame(ax: Any, columns: Mapping[str, float], lay: _SequenceLayout) -> None:
    """Column heads and lifelines, a line at the start of each second, the axes."""
    for name, cx in columns.items():
        ax.text(cx, lay.top + 0.25, name, ha="center", va="center", fontsize=11,
                fontweight="bold")
        ax.plot([cx, cx], [lay.top + 0.6, lay.bottom], color="0.75", ls="--", lw=1, zorder=0)
    import matplotlib.pyplot as plt

    tops = [top for top, _ in lay.labels] + [lay.bottom]
    for n, (top, label) in enumerate(lay.labels):   # every other second lightly shaded
        ax.add_patch(plt.Rectangle((-0.5, top), columns["SQLite"] + 2.9, tops[n + 1] - top,
                                   color="0.5" if n % 2 else "1.0", alpha=0.07, lw=0,
                                   zorder=-1))
        ax.text(columns["clock"], top + 0.12, label, ha="center", va="top", fontsize=9,
                color="0.25")
    ax.set_xlim(-0.5, columns["SQLite"] + 2.4)
    ax.set_ylim(lay.bottom, lay.top)   # time runs down
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_ylabel("model time (s), running down")
    for side in ("top", "right", "bottom"):
        ax.spines[side].set_visible(False)


def _draw_lease(ax: Any, cx: float, span: _LeaseSpan, lay: _SequenceLayout) -> None:
    """The lease as a bar on the worker's line; a note where a deadline ran out."""
    import matplotlib.pyplot as plt

    start = lay.y[span.claim_seq]
    if span.until_seq is not None:
        end = lay.y[span.until_seq]
    elif span.expires is not None:
        end = lay.band[span.expires]
        ax.text(cx + 0.1, end, f"lease g{span.generation} ends", ha="left", va="center",
                fontsize=8, color=STATE_COLORS[State.LEASED])
    else:
        end = lay.bottom
    ax.add_patch(plt.Rectangle((cx - 0.06, start), 0.12, end - start,
                               color=STATE_COLORS[State.LEASED], alpha=0.45, lw=0))


def _draw_step(ax: Any, row: Any, y: float, who: str | None, columns: Mapping[str, float],
               lease_seconds: int | None) -> None:
    """One journal row: a worker's call as an arrow to SQLite, or a note on SQLite's line."""
    sqlite, generation = columns["SQLite"], row["generation"]
    if row["reason"] == "claimed" and who is not None:
        until = f", lease until {row['at'] + lease_seconds}" if lease_seconds else ""
        _arrow(ax, columns[who], sqlite, y, f"claim -> g{generation}{until}", "black")
    elif row["reason"] == "completed" and who is not None:
        _arrow(ax, columns[who], sqlite, y, f"complete(g{generation}): effect + ACK",
               STATE_COLORS[State.DONE])
    elif who is not None and row["from_state"] == str(State.LEASED) \
            and row["reason"] != "lease_expired":
        _arrow(ax, columns[who], sqlite, y, f"{row['reason']} (g{generation}) -> "
                                            f"{row['to_state']}", STATE_COLORS[State(row["to_state"])])
    else:
        note = _NOTES.get(row["reason"], "{reason}: g{generation} -> {to_state}")
        ax.text(sqlite + 0.08, y, note.format(**row), ha="left", va="center", fontsize=8,
                color=STATE_COLORS[State(row["to_state"])])


def _draw_marks(ax: Any, marks: Sequence[tuple[str, Mark]], rows: "pd.DataFrame",
                workers: Mapping[int, str], columns: Mapping[str, float],
                lay: _SequenceLayout) -> None:
    """Each refused call as a dashed arrow; the silence before it as a dotted line."""
    orders = mark_order([m for _, m in marks])
    calls = rows[rows["reason"] != "lease_expired"]   # a noticed expiry is SQLite's note
    mine = {name: [lay.y[float(seq)] for seq, g in zip(calls.index, calls["generation"])
                   if workers.get(int(g)) == name] for name in workers.values()}
    for (who, m), order in zip(marks, orders):
        y = lay.y[order]
        before = [at for at in mine.get(who, []) if at < y]
        if before:  # the worker was silent from its last call to this moment
            since = max(before)
            ax.plot([columns[who]] * 2, [since, y], color="0.35", lw=2.5, ls=":")
            if y - since >= 2 * lay.ROW:
                ax.text(columns[who] - 0.1, (since + y) / 2, "stalled", rotation=90,
                        ha="right", va="center", fontsize=8, color="0.35")
        mine.setdefault(who, []).append(y)
        _arrow(ax, columns[who], columns["SQLite"], y, m.label, "crimson", rejected=True)


def _sequence_legend(ax: Any) -> None:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    ax.legend(handles=[Patch(color=STATE_COLORS[State.LEASED], alpha=0.45,
                             label="lease held (claim to ACK, failure or expiry)"),
                       Line2D([], [], color="0.35", lw=2.5, ls=":", label="worker silent"),
                       Line2D([], [], color="crimson", lw=1.5, ls="--", marker="X",
                              markeredgecolor="black", label="call refused (not in the journal)")],
              loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=3, fontsize=8, frameon=False)


_NOTES = {"lease_expired": "g{generation}'s lease expired: back to ready",
          "redrive": "redrive: dead -> ready (generation kept)"}


def _arrow(ax: Any, x0: float, x1: float, y: float, label: str, color: Any, *,
           rejected: bool = False) -> None:
    """A message from one line to another at height ``y``, labelled above it."""
    ax.annotate("", (x1, y), xytext=(x0, y),
                arrowprops={"arrowstyle": "-|>", "color": color, "lw": 1.5,
                            "ls": "--" if rejected else "-"})
    ax.text(x0 + 0.12, y - 0.08, label, ha="left", va="bottom", fontsize=8, color=color)
    if rejected:
        ax.plot(x1 - 0.08, y, marker="X", color="crimson", markersize=10, markeredgecolor="black")
