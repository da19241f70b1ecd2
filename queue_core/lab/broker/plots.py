"""Pictures of the broker scenarios, drawn from what was stored: the consumers'
log and pending list on the Redis server, the journal and effects of the queue
file (a ``BrokerRun`` holds both). pandas and matplotlib are imported inside
each function, as in ``queue_core.lab.plots``.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from .play import FAILURES
from ..plots.timeline import FIG_WIDTH, STATE_COLORS, Mark
from ...values import State

if TYPE_CHECKING:  # only for annotations: importing them here would defeat the lazy import
    import pandas as pd
    from matplotlib.figure import Figure

    from .play import BrokerRun

STEP_STYLE = {  # marker, face colour, legend text
    "received": ("o", "white", "received (#: delivery counter)"),
    "resumed": (">", "0.55", "resumed after its stall"),
    "committed": ("s", STATE_COLORS[State.DONE], "step committed in the database"),
    "acked": ("D", STATE_COLORS[State.READY], "XACK (-> entries it removed)"),
    "dead_lettered": ("X", STATE_COLORS[State.DEAD], "moved to the dead-letter stream"),
    "exited": ("X", "black", "process killed (os._exit)"),
}
REPEAT_COLOR = STATE_COLORS[State.LEASED]


def steps_frame(run: "BrokerRun") -> "pd.DataFrame":
    """The consumers' log of one run, one row per step, in the order the server saw them."""
    import pandas as pd

    rows = [(s.n, s.consumer, s.step, s.entry, s.event_id, s.delivery, s.detail)
            for s in run.steps]
    return pd.DataFrame(rows, columns=["n", "consumer", "step", "entry", "event_id",
                                       "delivery", "detail"]).set_index("n")


def _label(step: Any) -> str:
    if step.step == "received":
        return f"{step.event_id or f'entry {step.entry}'} #{step.delivery}"
    if step.step == "committed":
        return "repeat" if step.detail.startswith("repeat") else step.detail.split(" ")[-1]
    if step.step == "acked":
        return step.detail.replace("XACK -> ", "XACK\u2192")
    return {"exited": "killed", "resumed": ""}.get(step.step, step.detail)


def plot_deliveries(runs: Mapping[str, "BrokerRun"],
                    title: str = "Who received what, and what each step did") -> "Figure":
    """One panel per run: a lane per consumer, its logged steps in the order the
    broker saw them (a dotted line where a consumer stalled); beside it the
    money the run's effects add up to, against the money expected."""
    import matplotlib.pyplot as plt

    names = list(runs)
    fig, axes = plt.subplots(len(names), 2, figsize=(FIG_WIDTH, 0.6 + 2.1 * len(names)),
                             width_ratios=[4.2, 1], squeeze=False)
    for (ax, bars), name in zip(axes, names):
        _lanes_of(ax, runs[name], name)
        _money(bars, runs[name])
    _legend(axes[0][0])
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def _lanes_of(ax: Any, run: "BrokerRun", name: str) -> None:
    consumers = sorted({s.consumer for s in run.steps})
    for step in run.steps:
        lane = consumers.index(step.consumer)
        marker, face, _ = STEP_STYLE.get(step.step, ("o", "0.5", ""))
        if step.step == "committed" and step.detail.startswith("repeat"):
            face = REPEAT_COLOR
        ax.scatter(step.n, lane, marker=marker, s=70, color=face, edgecolors="black", zorder=3)
        ax.annotate(_label(step), (step.n, lane), xytext=(0, 8 if step.n % 2 else -15),
                    textcoords="offset points", ha="center", fontsize=7)
    for consumer in consumers:  # a stall: from receiving to resuming, the consumer did nothing
        mine = [s for s in run.steps if s.consumer == consumer]
        for got, back in zip(mine, mine[1:]):
            if got.step == "received" and back.step == "resumed":
                lane = consumers.index(consumer)
                ax.plot([got.n, back.n], [lane, lane], ls=":", color="0.35", lw=2, zorder=1)
                ax.text((got.n + back.n) / 2, lane + 0.1, "stalled", ha="center",
                        va="top", fontsize=7, color="0.35")
    ax.set_yticks(range(len(consumers)), [f"consumer {c}" for c in consumers])
    ax.set_ylim(len(consumers) - 0.4, -0.6)
    ax.set_xlim(0.3, len(run.steps) + 0.7)
    ax.set_xticks(range(1, len(run.steps) + 1))
    ax.set_xlabel("step in the order the broker logged it", fontsize=8)
    ax.tick_params(axis="x", labelsize=7)
    ax.set_title(name, fontsize=10, loc="left")
    ax.grid(axis="x", color="0.9")


def _money(ax: Any, run: "BrokerRun") -> None:
    right = run.money == run.expected
    ax.barh(0, run.money, color=STATE_COLORS[State.DONE] if right else STATE_COLORS[State.DEAD])
    ax.axvline(run.expected, color="black", ls="--", lw=1)
    ax.text(max(run.money, run.expected), 0, f" {run.money}", va="center", fontsize=8)
    ax.set_yticks([])
    ax.set_xlim(0, max(run.money, run.expected) * 1.6)
    ax.set_xlabel(f"cents (dashed: {run.expected})", fontsize=8)
    ax.tick_params(axis="x", labelsize=7)
    ax.set_title("money", fontsize=10)


def _legend(ax: Any) -> None:
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], ls="", marker=m, markerfacecolor=c, markeredgecolor="black",
                      color="black", label=text) for m, c, text in STEP_STYLE.values()]
    handles.insert(3, Line2D([], [], ls="", marker="s", markerfacecolor=REPEAT_COLOR,
                             markeredgecolor="black", label="step found a repeat: nothing written"))
    ax.legend(handles=handles, loc="lower left", bbox_to_anchor=(0.0, 1.18), ncol=3,
              fontsize=7, frameon=False)


def plot_redelivery(runs: Mapping[str, Mapping[str, "BrokerRun"]], event_id: str = "E0001",
                    title: str = "E0001 under each failure: deliveries and effects") -> "Figure":
    """Per failure (``runs[failure][keep]``): how often the broker delivered
    ``event_id``, and how many effects the naive and the inbox consumers wrote
    for it; the money of each run under its bars."""
    import matplotlib.pyplot as plt

    failures = list(runs)
    series = [("broker deliveries", "0.6", lambda r: r.deliveries(event_id), None),
              ("effects, naive consumers", STATE_COLORS[State.DEAD],
               lambda r: r.effects_of(event_id), "naive"),
              ("effects, inbox consumers", STATE_COLORS[State.DONE],
               lambda r: r.effects_of(event_id), "inbox")]
    fig, ax = plt.subplots(figsize=(FIG_WIDTH, 4.2))
    width = 0.26
    for k, (label, color, value, keep) in enumerate(series):
        xs, heights = [], []
        for i, failure in enumerate(failures):
            chosen = runs[failure].get(keep) if keep else next(iter(runs[failure].values()))
            if chosen is not None:
                xs.append(i + (k - 1) * width)
                heights.append(value(chosen))
            else:  # a failure run with one kind of consumer only: say so at the empty slot
                ax.text(i + (k - 1) * width, 0.04, f"no {keep}\nrun", ha="center",
                        va="bottom", fontsize=8, color=color)
        ax.bar(xs, heights, width, color=color, label=label, edgecolor="black", lw=0.5)
        for x, h in zip(xs, heights):
            ax.text(x, h + 0.04, str(h), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(failures)), [_failure_label(f, runs[f]) for f in failures],
                  fontsize=8)
    ax.set_yticks([0, 1, 2])
    ax.set_ylim(0, 2.6)
    ax.set_ylabel(f"count for {event_id}")
    ax.legend(loc="upper right", fontsize=8)
    ax.set_title(title)
    fig.tight_layout()
    return fig


def _failure_label(failure: str, by_keep: Mapping[str, "BrokerRun"]) -> str:
    words = FAILURES.get(failure, failure).replace("A is killed ", "killed ")
    lines = _wrap(words, 26)
    money = ", ".join(f"{keep} {run.money}" for keep, run in by_keep.items())
    return "\n".join([*lines, f"money: {money}"])


def _wrap(text: str, width: int) -> list[str]:
    lines: list[str] = [""]
    for word in text.split():
        if lines[-1] and len(lines[-1]) + 1 + len(word) > width:
            lines.append(word)
        else:
            lines[-1] = f"{lines[-1]} {word}".strip()
    return lines


def outcomes(run: "BrokerRun") -> Counter[str]:
    """What became of each entry the consumers took: its last step, and for a stored
    event the state the queue holds it in."""
    last: dict[int, Any] = {}
    for step in run.steps:
        if step.entry and step.step in ("committed", "dead_lettered"):
            last[step.entry] = step
    counted: Counter[str] = Counter()
    for step in last.values():
        if step.step == "dead_lettered":
            counted[f"dead-lettered: {step.detail}"] += 1
        elif step.detail.startswith("repeat"):
            counted["a repeat: counted, not stored"] += 1
        else:
            message = run.snapshot.messages.get(step.event_id)
            state = message.state.value if message else "missing"
            why = f" ({message.last_error})" if message and message.last_error else ""
            counted[f"stored, now {state}{why}"] += 1
    return counted


def plot_refusals(run: "BrokerRun",
                  title: str = "What the inbox consumer did with each entry") -> "Figure":
    """One bar per outcome (``outcomes``): stored, a repeat counted and not stored,
    or moved to the dead-letter stream with its code; longest first."""
    import matplotlib.pyplot as plt

    counted = sorted(outcomes(run).items(), key=lambda item: (_rank(item[0]), item[0]))
    fig, ax = plt.subplots(figsize=(FIG_WIDTH, 0.9 + 0.38 * len(counted)))
    for lane, (what, count) in enumerate(counted):
        ax.barh(lane, count, color=_outcome_color(what), edgecolor="black", lw=0.5)
        ax.text(count, lane, f" {count}", va="center", fontsize=8)
    ax.set_yticks(range(len(counted)), [what for what, _ in counted], fontsize=8)
    ax.set_ylim(len(counted) - 0.4, -0.6)
    ax.set_xlim(0, max(count for _, count in counted) + 1)
    ax.set_xticks(range(max(count for _, count in counted) + 2))
    ax.set_xlabel("entries of the stream")
    ax.set_title(title)
    fig.tight_layout()
    return fig


def _rank(what: str) -> int:
    order = ("stored, now done", "stored", "a repeat")
    return next((n for n, start in enumerate(order) if what.startswith(start)), len(order))


def _outcome_color(what: str) -> Any:
    if what.startswith("stored, now done"):
        return STATE_COLORS[State.DONE]
    if what.startswith("stored"):
        return STATE_COLORS[State.DEAD]
    return REPEAT_COLOR if what.startswith("a repeat") else "0.45"


def repeat_marks(run: "BrokerRun") -> Sequence[Mark]:
    """A mark for each repeat the inbox counted, after the last journal row of its event
    (a repeat comes after the delivery that stored it), for ``plot_timeline``."""
    marks = []
    for step in run.steps:
        if step.step == "committed" and step.detail.startswith("repeat"):
            rows = [t for t in run.snapshot.journal if t.event_id == step.event_id]
            marks.append(Mark(rows[-1].at, rows[-1].seq, step.event_id,
                              f"delivery {step.delivery} ({step.consumer}): repeat, not stored",
                              harmless=True))
    return marks
