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
    for value, words, below in ((rel["single"], "worker loop", rel["single"] < rel["batch_1"]),
                                (rel["batch_1"], "K=1", rel["single"] >= rel["batch_1"])):
        by_k.annotate(f"{words} {value:.2f}", (1, value), textcoords="offset points",
                      xytext=(10, -12 if below else 4), fontsize="small")
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
    return fig
