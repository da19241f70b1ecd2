"""The benchmark's figure in notebook 08: every rate over the raw commits around it.

``benchmarks/bench.py`` measures; this draws one run of it (``bench.run``'s
results): on the left, claim and complete in batches of K against K, with
the worker loop beside K = 1; on the right, ours beside the peer queues,
grouped by durability. Every figure is a ratio to raw commits of the same
run, so both panels share the limit's red line at 1.

    plot_throughput(results, ours={"single": "ours: the worker loop", ...},
                    peers={"peer_huey_defaults": "huey (its defaults)", ...})
"""

from __future__ import annotations

import math
from typing import Any, Mapping

FSYNCED = "every commit a caller relies on is fsynced"
NORMAL = "synchronous=NORMAL"


def _label_log_axis(axis: Any, low: float, high: float) -> None:
    """Label a log axis in plain numbers (0.1, 1, 10 rather than 10^-1): every
    decade, and 2 and 5 of each as well where the view spans less than three
    decades, so that at least two labels fall inside it. Left to itself,
    matplotlib labels every minor tick of an axis that holds a single decade
    (2x10^-1, 3x10^-1, ...), and the labels run into each other."""
    from matplotlib.ticker import LogLocator

    few = math.log10(high / low) < 3
    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0) if few else (1.0,)))
    axis.set_major_formatter(lambda value, _: f"{value:g}")


def plot_throughput(results: dict[str, Any], ours: Mapping[str, str],
                    peers: Mapping[str, str]) -> Any:
    """Each consume rate over the raw commits measured around it: transactions per
    message on the left; the peers beside ours at the same durability on the right.
    ``ours`` and ``peers`` name each case (``results["vs_raw"]``'s keys) for the picture."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    rel = results["vs_raw"]
    fig, (by_k, beside) = plt.subplots(1, 2, figsize=(12, 4.6),
                                       gridspec_kw={"width_ratios": [1, 1.2]})
    ks = [1, 10, 100]
    by_k.plot(ks, [rel[f"batch_{k}"] for k in ks], "o-", color="tab:blue",
              label="claim_batch + complete_batch, K a transaction")
    by_k.plot([1], [rel["single"]], "*", color="tab:purple", markersize=15,
              label="the worker loop: each ACK claims the next")
    at_one = _label_k_one(by_k, rel["single"], rel["batch_1"])
    by_k.plot(ks, ks, ":", color="grey", label="one fsync per K messages: K x the limit")
    by_k.axhline(1, color="tab:red", linestyle="--", label="raw single-row commit (the limit)")
    by_k.set(xscale="log", yscale="log", xticks=ks, xticklabels=[str(k) for k in ks],
             xlabel="messages per transaction (K)", ylabel="consume rate / raw commit rate",
             title="Fewer transactions per message")
    by_k.set_ylim(bottom=min(rel["single"], rel["batch_1"]) / 2)  # room for the labels at K=1
    by_k.yaxis.set_major_formatter(lambda value, _: f"{value:g}")  # 0.1, 1, 10 rather than 10^-1
    by_k.legend(fontsize="small", loc="upper left")
    groups: dict[str, list[str]] = {FSYNCED: ["single"], NORMAL: ["single_normal"]}
    for peer in results["peers"]:
        groups[NORMAL if peer["synchronous"] == "NORMAL" else FSYNCED].append(peer["name"])
    y, ticks = 0.0, []
    for title, members in groups.items():
        beside.text(0.01, y - 0.6, title, transform=beside.get_yaxis_transform(),
                    fontsize="small", fontweight="bold")
        for name in members:
            beside.plot(rel[name], y, "o", color="tab:blue" if name in ours else "dimgrey",
                        markersize=9)
            beside.annotate(f"{rel[name]:.2f}", (rel[name], y), textcoords="offset points",
                            xytext=(8, -3), fontsize="small")
            ticks.append((y, ours.get(name, peers.get(name))))
            y += 1
        y += 0.9
    beside.axvline(1, color="tab:red", linestyle="--")
    every = [rel[n] for g in groups.values() for n in g]
    beside.set(xscale="log", xlim=(min(min(every), 1) / 3, max(max(every), 1) * 4),
               ylim=(y - 0.6, -1.2), xlabel="consume rate / raw commit rate (log; red: the limit)",
               title="The consumer side, beside queues at the same durability")
    beside.set_yticks([t for t, _ in ticks], [label for _, label in ticks], fontsize="small")
    _label_log_axis(beside.xaxis, *beside.get_xlim())
    for ax in (by_k, beside):
        ax.grid(alpha=0.3, which="both")
        for axis in (ax.xaxis, ax.yaxis):  # minor ticks and their grid stay, unlabelled
            axis.set_minor_formatter(NullFormatter())
    fig.suptitle("Measured in one interleaved run (medians of slices); ours in blue")
    fig.tight_layout()
    _make_room_below(fig, by_k, at_one)
    return fig


def _label_k_one(ax: Any, loop: float, batch_1: float) -> list[Any]:
    """The two figures at K = 1, the worker loop's star and the K = 1 batch's dot,
    which lie too close together for a label beside each: both labels go below
    and to the right of the lower point, one under the other in the order of
    their points (the higher point's label on top), each joined to its point by
    a thin line, in type as large as the axis labels."""
    from matplotlib.text import OffsetFrom

    low = min(loop, batch_1)
    anchor = OffsetFrom(ax.transData, (1, low))  # offsets in points from the lower point
    figures = sorted([(loop, "the worker loop", "tab:purple"),
                      (batch_1, "K = 1 (claim, then complete)", "tab:blue")],
                     key=lambda figure: -figure[0])
    return [ax.annotate(f"{words}: {value:.2f}", (1, value), xytext=(22, -12 - 18 * n),
                        textcoords=anchor, ha="left", va="top", fontsize=10, color=color,
                        bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": "none",
                              "alpha": 0.9},
                        arrowprops={"arrowstyle": "-", "color": color, "lw": 0.8,
                                    "relpos": (0, 0.5), "shrinkA": 1, "shrinkB": 6})
            for n, (value, words, color) in enumerate(figures)]


def _make_room_below(fig: Any, ax: Any, labels: list[Any]) -> None:
    """Lower the log axis's bottom until every label lies inside the axes."""
    from matplotlib.text import Text

    renderer = fig.canvas.get_renderer()
    for _ in range(12):
        frame = ax.get_window_extent(renderer)
        for label in labels:  # where the new limits put it; then its text's box, without its line
            label.update_positions(renderer)
        if all(Text.get_window_extent(label, renderer).y0 >= frame.y0 + 3 for label in labels):
            return
        low, high = ax.get_ylim()
        ax.set_ylim(bottom=low / 1.5, top=high)
