"""Pictures of the queue for the course, drawn from stored values only.

Every figure is built from what the database holds (the transitions
journal, ``Queue.metrics``) or from what worker processes reported, so a
picture can never show a state the queue did not reach. pandas and
matplotlib are imported inside each function: ``import queue_core`` stays
light for workers and the command line.

Moments the journal cannot hold, because nothing was committed (a rejected
ACK, a worker killed before COMMIT), are passed in as ``Mark`` values; take
them with ``mark(queue, event_id, label)`` right when they happen, or, for
one that happened out of sight (inside ``run_scenario``), with
``mark(..., after=seq)`` right after the journal row it followed. A mark
with ``caught=True`` names a step the journal does hold but cannot say whose
it was, after which the audit found something (the explorer's replays).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from ...values import Metrics, State, Transition

if TYPE_CHECKING:  # only for annotations: importing them here would defeat the lazy import
    import pandas as pd
    from matplotlib.figure import Figure

    from ...queue import Queue

STATE_COLORS = {State.READY: "#4C72B0", State.LEASED: "#DD8452",
                State.DONE: "#55A868", State.DEAD: "#C44E52"}
FIG_WIDTH = 9.5  # inches: readable at notebook width without horizontal scrolling
_SPREAD = 0.8  # share of a model second used to spread steps that share that second
TRANSITION_COLUMNS = ["at", "event_id", "from_state", "to_state", "generation", "attempts",
                      "reason"]


@dataclass(frozen=True, slots=True)
class Mark:
    """A moment the journal cannot show: ``label`` on ``event_id`` at model second
    ``at``, drawn after journal row ``after_seq``; ``caught`` if the audit found
    something after it (drawn as a star, not a cross); ``harmless`` for a step that
    changed nothing and broke nothing, a repeat the inbox counted (a grey square)."""

    at: int
    after_seq: int
    event_id: str
    label: str
    caught: bool = False
    harmless: bool = False


def mark(queue: "Queue", event_id: str, label: str, *, after: int | None = None) -> Mark:
    """Record ``label`` for ``event_id`` now, ordered after every journal row so far.

    ``after``: the ``seq`` of the journal row the moment followed instead; the
    mark then takes that row's model second. Raises ``ValueError`` for a
    ``seq`` the journal does not hold.
    """
    journal = queue.transitions()
    if after is None:
        return Mark(queue.clock.now(), journal[-1].seq if journal else 0, event_id, label)
    found = [t for t in journal if t.seq == after]
    if not found:
        raise ValueError(f"the journal holds no row with seq {after!r}")
    return Mark(found[0].at, after, event_id, label)


def transitions_frame(source: "Queue | Iterable[Transition]") -> "pd.DataFrame":
    """The transitions journal as a DataFrame indexed by ``seq``, states as plain text.

    ``from_state`` is missing for the ``enqueued`` row that created a message.
    """
    import pandas as pd

    rows = source.transitions() if hasattr(source, "transitions") else list(source)
    frame = pd.DataFrame(
        [(t.seq, t.at, t.event_id, None if t.from_state is None else str(t.from_state),
          str(t.to_state), t.generation, t.attempts, t.reason) for t in rows],
        columns=["seq", *TRANSITION_COLUMNS])
    return frame.set_index("seq")


def mark_order(marks: Sequence[Mark]) -> list[float]:
    """Where each mark falls in journal order: just after its row, in the order given."""
    return [m.after_seq + 0.5 + n / (2 * len(marks) + 2) for n, m in enumerate(marks)]


def _positions(frame: "pd.DataFrame", marks: Sequence[Mark], *,
               spread: bool = True) -> dict[float, float]:
    """x of each journal row (by seq) and mark (by ``mark_order``): its model second,
    plus (``spread``) its rank among the steps of that second, so order within a
    second shows."""
    keys = [(int(at), float(seq)) for seq, at in zip(frame.index, frame["at"])]
    keys += [(m.at, order) for m, order in zip(marks, mark_order(marks))]
    by_second: dict[int, list[float]] = {}
    for at, order in keys:
        by_second.setdefault(at, []).append(order)
    x: dict[float, float] = {}
    for second, orders in by_second.items():
        for rank, order in enumerate(sorted(orders)):
            x[order] = second + (_SPREAD * rank / len(orders) if spread else 0.0)
    return x


def plot_timeline(source: "Queue | pd.DataFrame", *, marks: Sequence[Mark] = (),
                  title: str = "Each message's state over model time",
                  until: int | None = None, true_time: bool = False) -> "Figure":
    """One lane per event id: coloured by the state entered, claims labelled ``g`` +
    generation, expired leases as ``x``, marks as red crosses with their label.

    By default steps that share a model second are spread out across it in
    journal order, so their ORDER shows. ``true_time=True`` draws every step
    at its model second instead, so DURATIONS can be read off the axis (a
    backoff's wait is labelled in seconds); steps of one second then coincide.
    """
    import matplotlib.pyplot as plt

    frame: pd.DataFrame = source if hasattr(source, "columns") else transitions_frame(source)
    events = sorted(set(frame["event_id"]) | {m.event_id for m in marks})
    x = _positions(frame, marks, spread=not true_time)
    first = min([*frame["at"], *(m.at for m in marks)])
    end = max([*frame["at"], *(m.at for m in marks)]) + 1 if until is None else until
    # keep twenty lanes on one screen; a mark's label needs room between two lanes
    lane_inches = 0.75 if marks else 0.55 if len(events) <= 8 else 0.4
    # at least 2.8 inches high, so the legend beside a single lane still fits
    fig, ax = plt.subplots(figsize=(FIG_WIDTH, max(2.8, 1.3 + lane_inches * len(events))))
    for lane, event_id in enumerate(events):
        rows = frame[frame["event_id"] == event_id]
        starts = [x[float(seq)] for seq in rows.index]
        for (_, row), start, stop in zip(rows.iterrows(), starts, [*starts[1:], end]):
            ax.barh(lane, stop - start, left=start, height=0.5,
                    color=STATE_COLORS[State(row["to_state"])], edgecolor="white")
            _draw_step(ax, lane, start, row)
            if true_time and row["reason"] == "transient_error" and stop - start >= 0.5:
                ax.text((start + stop) / 2, lane, f"waits {stop - start:g} s", ha="center",
                        va="center", fontsize=8, color="white", fontweight="bold")
    labels = [_draw_mark(ax, events.index(m.event_id), x[order], m.label, caught=m.caught,
                         harmless=m.harmless)
              for m, order in zip(marks, mark_order(marks))]
    _timeline_axes(ax, events, int(first), end, title, room_below=bool(marks),
                   true_time=true_time)
    _timeline_legend(ax, expired=bool((frame["reason"] == "lease_expired").any()),
                     marked=any(not m.caught and not m.harmless for m in marks),
                     caught=any(m.caught for m in marks),
                     harmless=any(m.harmless for m in marks))
    fig.tight_layout()
    _keep_inside(fig, ax, labels)
    _keep_apart(fig, labels)
    return fig


_CAUGHT = {"marker": "*", "color": "gold", "markeredgecolor": "black"}
_REJECTED = {"marker": "X", "color": "crimson", "markeredgecolor": "black"}
_HARMLESS = {"marker": "s", "color": "0.75", "markeredgecolor": "black"}


def _draw_mark(ax: Any, lane: int, at: float, label: str, *, caught: bool = False,
               harmless: bool = False) -> Any:
    """A red cross (a gold star if the audit caught the step, a grey square if the
    step was harmless) on the lane; its label centred right under the symbol,
    below the bar."""
    style = _CAUGHT if caught else _HARMLESS if harmless else _REJECTED
    ax.plot(at, lane, markersize=16 if caught else 9 if harmless else 11, **style)
    return ax.annotate(label, (at, lane + 0.25), xytext=(0, -2), textcoords="offset points",
                       ha="center", va="top", fontsize=8,
                       color="0.25" if harmless else "crimson",
                       bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none",
                             "alpha": 0.9})


def _keep_inside(fig: Any, ax: Any, labels: Sequence[Any]) -> None:
    """Shift a label that would stick out of the axes back in, as little as needed."""
    if not labels:
        return
    renderer = fig.canvas.get_renderer()
    frame = ax.get_window_extent(renderer)
    points = 72 / fig.dpi
    for label in labels:
        box = label.get_window_extent(renderer)
        shift = max(0.0, frame.x0 + 2 - box.x0) - max(0.0, box.x1 - frame.x1 + 2)
        if shift:
            label.set_position((shift * points, -2))


def _keep_apart(fig: Any, labels: Sequence[Any]) -> None:
    """Move a label that would overlap an earlier one down, under it, so that two
    marks close together in time keep both labels readable."""
    renderer = fig.canvas.get_renderer()
    points = 72 / fig.dpi
    placed: list[Any] = []
    for label in labels:
        box = label.get_window_extent(renderer)
        while any(box.overlaps(other) for other in placed):
            dx, dy = label.xyann
            label.xyann = (dx, dy - (box.height * points + 1))
            box = label.get_window_extent(renderer)
        placed.append(box)


def _timeline_legend(ax: Any, *, expired: bool, marked: bool, caught: bool = False,
                     harmless: bool = False) -> None:
    """States, then only the symbols this picture uses."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles: list[Any] = [Patch(color=STATE_COLORS[s], label=str(s)) for s in State]
    handles.append(Line2D([], [], ls="", marker="|", color="black", markersize=12,
                          label="claim (gN: generation N)"))
    if expired:
        handles.append(Line2D([], [], ls="", marker="x", color="black",
                              label="expired lease noticed"))
    if marked:
        handles.append(Line2D([], [], ls="", markersize=9, label="rejected or crashed",
                              **_REJECTED))
    if caught:
        handles.append(Line2D([], [], ls="", markersize=13, label="caught by the audit",
                              **_CAUGHT))
    if harmless:
        handles.append(Line2D([], [], ls="", markersize=8, label="a repeat: nothing written",
                              **_HARMLESS))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9)


def _draw_step(ax: Any, lane: int, start: float, row: Any) -> None:
    if row["reason"] == "claimed":
        ax.plot([start, start], [lane - 0.3, lane + 0.3], color="black", lw=1.5)
        ax.annotate(f"g{row['generation']}", (start, lane - 0.3), xytext=(2, 1),
                    textcoords="offset points", ha="left", va="bottom", fontsize=8)
    elif row["reason"] == "lease_expired":
        ax.plot(start, lane, marker="x", color="black", markersize=9, mew=2)


def _timeline_axes(ax: Any, events: list[str], first: int, end: float, title: str, *,
                   room_below: bool, true_time: bool) -> None:
    ax.set_yticks(range(len(events)), events)
    # room under the last lane for a mark's label
    ax.set_ylim(len(events) - (0.1 if room_below else 0.4), -0.7)
    ax.set_xlim(first - 0.1, end)
    ax.set_xticks(range(first, int(end) + 1))
    ax.set_xlabel("model time (s), true scale: steps of one second share its tick" if true_time
                  else "model time (s); steps within one second are spread out in journal order")
    ax.set_title(title)
    ax.grid(axis="x", color="0.85")
    ax.set_axisbelow(True)


_NODES = {State.READY: (0.0, 0.0), State.LEASED: (4.0, 0.0),
          State.DONE: (8.0, 0.0), State.DEAD: (4.0, -2.6)}
# (from, to, name, what it stands for, curvature, label offset in data units); a count
# goes after the name, so it reads as part of the arrow's name, not of its explanation
_EDGES = [
    (State.READY, State.LEASED, "claim", "", 0.0, (0.0, 0.25)),
    (State.LEASED, State.DONE, "complete", "effect + ACK,\none transaction", 0.0, (0.1, 0.5)),
    (State.LEASED, State.READY, "back to ready", "transient failure (backoff),\nlease expired, "
     "or release", 0.45, (0.0, 1.45)),
    (State.LEASED, State.DEAD, "to dead", "invalid payload,\nor budget spent", 0.0, (0.95, 0.0)),
    (State.DEAD, State.READY, "redrive", "(attempts reset,\ngeneration kept)", 0.25,
     (-1.05, -0.55)),
]
ENQUEUE = "enqueue"


def plot_state_machine(source: "Queue | pd.DataFrame | None" = None,
                       title: str = "The states of a message and who moves it") -> "Figure":
    """The state machine; with a queue or journal frame, each arrow says how often it was taken."""
    import matplotlib.pyplot as plt

    frame = None if source is None else (
        source if hasattr(source, "columns") else transitions_frame(source))
    fig, ax = plt.subplots(figsize=(FIG_WIDTH, 4.6))
    for state, (px, py) in _NODES.items():
        ax.text(px, py, str(state), ha="center", va="center", fontsize=14, color="white",
                fontweight="bold", bbox={"boxstyle": "round,pad=0.6", "fc": STATE_COLORS[state]})
    ax.annotate("", _NODES[State.READY], xytext=(-2.2, 0.0),
                arrowprops={"arrowstyle": "-|>", "color": "0.3", "shrinkB": 30})
    counts = None if frame is None else arrow_counts(frame)
    ax.text(-2.2, 0.18, ENQUEUE + _times(counts, ENQUEUE), fontsize=9)
    for src, dst, name, meaning, curve, (dx, dy) in _EDGES:
        (x0, y0), (x1, y1) = _NODES[src], _NODES[dst]
        ax.annotate("", (x1, y1), xytext=(x0, y0),
                    arrowprops={"arrowstyle": "-|>", "color": "0.3", "lw": 1.4,
                                "shrinkA": 30, "shrinkB": 30,
                                "connectionstyle": f"arc3,rad={curve}"})
        head = name + _times(counts, name) + (":" if meaning else "")
        ax.text((x0 + x1) / 2 + dx, (y0 + y1) / 2 + dy, "\n".join(filter(None, (head, meaning))),
                ha="center", va="center", fontsize=9)
    ax.set_xlim(-2.4, 9.2)
    ax.set_ylim(-3.3, 1.9)
    ax.axis("off")
    counted = "\n(N\u00d7: how often this journal took the arrow)"
    ax.set_title(title + ("" if frame is None else counted))
    fig.tight_layout()
    return fig


def arrow_counts(source: "Queue | pd.DataFrame") -> dict[str, int]:
    """How many journal rows took each arrow of the state machine, by the arrow's
    name as ``plot_state_machine`` writes it: ``enqueue``, ``claim``, ..."""
    frame = source if hasattr(source, "columns") else transitions_frame(source)
    arrows = [(ENQUEUE, None, State.READY)] + [(name, src, dst) for src, dst, name, *_ in _EDGES]
    counts = {}
    for name, src, dst in arrows:
        same_src = frame["from_state"].isna() if src is None else frame["from_state"] == str(src)
        counts[name] = int((same_src & (frame["to_state"] == str(dst))).sum())
    return counts


def _times(counts: dict[str, int] | None, name: str) -> str:
    """`` (N×)`` after an arrow's name, when the picture counts."""
    return "" if counts is None else f" ({counts[name]}\u00d7)"


def _none_due(seconds: Sequence[int], age: Any) -> list[tuple[float, float]]:
    """The stretches of model time in which no message was due (age NaN), each
    from its first such sample to the next sample; one that runs to the last
    sample ends there, or half a second after it if it is that sample alone."""
    gaps: list[tuple[float, float]] = []
    start = None
    for n, (second, value) in enumerate(zip(seconds, age)):
        missing = value != value  # NaN: no message was due at this second
        if missing and start is None:
            start = second
        if start is not None and (not missing or n == len(seconds) - 1):
            stop = second if not missing or second > start else second + 0.5
            gaps.append((float(start), float(stop)))
            start = None
    return gaps


def metrics_frame(samples: Iterable[Metrics]) -> "pd.DataFrame":
    """``Queue.metrics`` samples as rows indexed by model second ``at``."""
    import pandas as pd

    rows = [{"at": m.at, **{str(s): m.depth.get(str(s), 0) for s in State},
             "oldest_ready_age": m.oldest_ready_age, "expired_leases": m.expired_leases,
             "dead_attempts": sum(m.dead_attempts.values())} for m in samples]
    return pd.DataFrame(rows).set_index("at").astype("Int64")


def plot_metrics(samples: Iterable[Metrics],
                 title: str = "Queue metrics over model time") -> "Figure":
    """Depth by state (stacked) above; below, the age of the oldest due message, the
    attempts spent by dead messages and the expired leases no claim has noticed yet.
    While no message is due (``oldest_ready_age`` is ``None``) the age line has a
    gap, shaded and labelled "none due" once per stretch (and named in the legend):
    an age of 0 would claim a message just arrived."""
    import matplotlib.pyplot as plt

    frame = metrics_frame(samples)
    fig, (depth, ages) = plt.subplots(2, 1, figsize=(FIG_WIDTH, 6.2), sharex=True,
                                      height_ratios=[3, 2])
    seconds = list(frame.index)
    depth.stackplot(seconds, *[frame[str(s)].to_numpy(dtype=float) for s in State],
                    labels=[str(s) for s in State], colors=[STATE_COLORS[s] for s in State],
                    step="post")
    depth.set_ylabel("messages")
    depth.set_title(title)
    depth.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9)
    age = frame["oldest_ready_age"].to_numpy(dtype=float, na_value=float("nan"))
    ages.step(seconds, age, where="post", color=STATE_COLORS[State.READY],
              label="age of oldest due message (s)")
    gaps = _none_due(seconds, age)
    for start, stop in gaps:
        ages.axvspan(start, stop, color=STATE_COLORS[State.READY], alpha=0.12, lw=0)
        ages.text((start + stop) / 2, 0.96, "none\ndue", transform=ages.get_xaxis_transform(),
                  ha="center", va="top", fontsize=9, fontweight="bold",
                  color=STATE_COLORS[State.READY])
    ages.step(seconds, frame["dead_attempts"].to_numpy(dtype=float), where="post",
              color=STATE_COLORS[State.DEAD], label="attempts spent by dead messages")
    ages.step(seconds, frame["expired_leases"].to_numpy(dtype=float), where="post",
              color=STATE_COLORS[State.LEASED], ls="--", label="expired leases not yet noticed")
    ages.set_ylabel("seconds, or count")
    ages.set_xlabel("model time (s)")
    ages.set_xticks(seconds)
    handles, _ = ages.get_legend_handles_labels()
    if gaps:
        from matplotlib.patches import Patch

        handles.append(Patch(color=STATE_COLORS[State.READY], alpha=0.12,
                             label="none due: no message due,\nso no age (a gap, not 0)"))
    ages.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9)
    if gaps:
        ages.set_xlim(right=max(max(seconds), gaps[-1][1]))
    for ax in (depth, ages):
        ax.grid(axis="y", color="0.85")
    fig.tight_layout()
    return fig
