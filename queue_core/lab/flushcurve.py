"""Rate against flush latency: where one fsync per message is the limit.

On a disk whose flush takes a tenth of a millisecond a queue is CPU-bound,
and its ratio to raw commits says little; on a consumer SSD or a cloud
volume a flush takes 1 to 10 ms, and one fsync per message is the physical
limit. ``measure_flush_curve`` measures, in a few seconds, two workloads in
a child process: the worker loop (``drain``: each ACK, with its effect,
claims the next message in the same transaction) and a raw single-row
commit. For each it counts CPU seconds (user + system) and fsyncs per
message, and predicts

    rate(L) = 1 / (cpu + fsyncs * L)     for a flush latency L,

then runs the same child again with every flush delayed by 2 ms (the
``slowdisk`` shim), so two measured points sit beside the curve: this
machine's own flush and the slow disk. Without the shim (no C compiler,
not Linux) only this machine's point is measured, and the reason is kept.

    curve = measure_flush_curve()
    print(describe_flush_curve(curve))    # this run's figures, in words
    flush_curve_frame(curve)              # predicted rates and ratio at a few latencies
    plot_flush_curve(curve)               # pandas and matplotlib load only here

Why one fsync per message: ``consume_transactions`` records every commit
of a small run, consumed with ``claim`` then ``complete`` (two commits per
message) and with ``drain`` (one), with the pages each writes and whether
it waited for an fsync; ``plot_transactions`` draws them.

Run as ``python -m queue_core.lab.flushcurve FOLDER MESSAGES``, this module is
that child: it prints one JSON line with its measurements.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from .slowdisk import DELAY_US, NoShim, ROOT, flush_calls, flush_latency, shim_env

WORKLOADS = ("consume", "raw")
LABELS = {"consume": "worker loop (drain)", "raw": "raw commit"}  # messages per second of each
# Frames written before the measured ones: more than SQLite's automatic checkpoint
# (1,000 pages), so both logs have wrapped and their commits overwrite blocks the
# file already has, as a long-running service's do; appending to a growing file
# costs the file system more per flush, and the two logs would not grow alike.
WARM_PAGES = 1_100


@dataclass(frozen=True)
class Cost:
    """What one message of a workload costs apart from waiting for the disk."""

    workload: str
    cpu_s: float           # user + system CPU seconds per message
    fsyncs: float | None   # fsync + fdatasync calls per message (None: not counted)

    def rate(self, flush_s: float) -> float:
        """Predicted messages per second where one flush takes ``flush_s`` seconds."""
        if self.fsyncs is None:
            raise NoShim("fsyncs per message were not counted: the slow-disk shim is missing")
        return 1.0 / (self.cpu_s + self.fsyncs * flush_s)


@dataclass(frozen=True)
class Point:
    """One measured run: its flush latency and each workload's measured rate."""

    label: str
    flush_s: float
    rates: dict[str, float]
    fsyncs: dict[str, float | None]

    @property
    def ratio(self) -> float:
        return self.rates["consume"] / self.rates["raw"]


@dataclass(frozen=True)
class FlushCurve:
    costs: dict[str, Cost]    # from this machine's own flush
    points: tuple[Point, ...]
    delay_s: float            # the shim's added delay
    skipped: str | None       # why the slow-disk point is missing, if it is

    def ratio(self, flush_s: float) -> float:
        """Predicted consume rate over raw commit rate at flush latency ``flush_s``."""
        return self.costs["consume"].rate(flush_s) / self.costs["raw"].rate(flush_s)


# -- the child ------------------------------------------------------------------

def _probe(folder: Path, messages: int, slices: int = 10) -> dict[str, Any]:
    """Measure both workloads in this process, in alternating slices so that
    both meet the same disk; the shim, if loaded, counts the flushes.

    The flush latency the run met is the raw commits' own: their wall time
    less their CPU time, per flush.
    """
    from ..audit import check, snapshot
    from ..handler import Handler
    from ..queue import Queue
    from ..storage import connect
    from ..worker import drain

    queue, handler = Queue(folder / "queue.sqlite3"), Handler()
    warm = WARM_PAGES // 4  # the worker loop writes 4 or 5 pages a message
    keep = connect(queue.path)  # open throughout: closing the last connection deletes the log
    with Queue(queue.path, synchronous="OFF").session() as unsynced:  # not measured
        unsynced.enqueue_jsonl(_orders(messages, messages + warm))
        drain(unsynced, handler)
    queue.enqueue_jsonl(_orders(0, messages))
    conn = connect(folder / "raw.sqlite3")  # the pragmas the queue uses: WAL, FULL
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("CREATE TABLE raw (id INTEGER PRIMARY KEY, payload TEXT NOT NULL) STRICT")
    conn.execute("PRAGMA synchronous = OFF")
    for _ in range(WARM_PAGES):  # not measured
        conn.execute("INSERT INTO raw (payload) VALUES ('{}')")
    conn.execute("PRAGMA synchronous = FULL")
    per_slice = messages // slices
    totals = {name: {"wall_s": 0.0, "cpu_s": 0.0, "flushes": 0} for name in WORKLOADS}

    def consume() -> None:
        done: list[object] = []
        drain(queue, handler, on_outcome=done.append, stop=lambda: len(done) >= per_slice)

    def commits() -> None:
        for i in range(per_slice):
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO raw (payload) VALUES (?)", (f'{{"n": {i}}}',))
            conn.execute("COMMIT")
    with queue.session():
        for _ in range(slices):
            for name, work in (("consume", consume), ("raw", commits)):
                for key, value in _timed(work).items():
                    totals[name][key] = None if value is None or totals[name][key] is None \
                        else totals[name][key] + value
    conn.close()
    keep.close()
    snap = snapshot(queue.path)
    if snap.status.states["done"] != per_slice * slices + warm or check(snap):
        raise RuntimeError(f"the probe's queue is not exactly once: {snap.status.states}")
    raw = totals["raw"]
    flush_s = ((raw["wall_s"] - raw["cpu_s"]) / raw["flushes"] if raw["flushes"]
               else flush_latency(folder))
    return {"messages": per_slice * slices, "flush_s": flush_s, **totals}


def _orders(first: int, end: int) -> str:
    return "".join(json.dumps({"event_id": f"E{i:04d}", "payload": {
        "category": "book", "amount_cents": 100 + i}}) + "\n" for i in range(first, end))


def _timed(work: Any) -> dict[str, float | None]:
    calls, cpu, started = flush_calls(), time.process_time(), time.perf_counter()
    work()
    wall, cpu_s, calls_after = time.perf_counter() - started, time.process_time() - cpu, flush_calls()
    return {"wall_s": wall, "cpu_s": cpu_s,
            "flushes": None if calls is None or calls_after is None else calls_after - calls}


def _run_child(messages: int, env: dict[str, str]) -> dict[str, Any]:
    env = dict(env, PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [
        env.get("PYTHONPATH")])]))
    with tempfile.TemporaryDirectory(prefix="queue-flush-", dir=_same_disk()) as tmp:
        done = subprocess.run([sys.executable, "-m", "queue_core.lab.flushcurve", tmp,
                               str(messages)], env=env, capture_output=True, text=True,
                              check=False, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"the flush probe failed: {done.stderr.strip()[-500:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _same_disk() -> str | None:
    """The system temp folder if it is on the checkout's disk (not a RAM disk), else the checkout."""
    tmp = tempfile.gettempdir()
    return None if os.stat(tmp).st_dev == os.stat(ROOT).st_dev else str(ROOT)


# -- the curve ------------------------------------------------------------------

def measure_flush_curve(messages: int = 300, delay_us: int = DELAY_US) -> FlushCurve:
    """Measure both workloads at this machine's flush and with ``delay_us`` added.

    CPU seconds and fsyncs per message come from the run at this machine's
    own flush (the shim loaded with no delay, only counting); the second
    run adds the delay to every flush. Both queues are checked exactly once.
    """
    try:
        fast_env, slow_env = shim_env(0), shim_env(delay_us)
        skipped = None
    except NoShim as exc:
        fast_env, slow_env, skipped = dict(os.environ), None, str(exc)
    runs = [("this machine's flush", _run_child(messages, fast_env))]
    if slow_env is not None:
        runs.append((f"{delay_us / 1000:g} ms added to every flush",
                     _run_child(messages, slow_env)))
    points = tuple(_point(label, run) for label, run in runs)
    first = runs[0][1]
    costs = {name: Cost(name, first[name]["cpu_s"] / first["messages"], points[0].fsyncs[name])
             for name in WORKLOADS}
    return FlushCurve(costs, points, delay_us / 1e6, skipped)


def _point(label: str, run: dict[str, Any]) -> Point:
    n = run["messages"]
    return Point(label, run["flush_s"], {name: n / run[name]["wall_s"] for name in WORKLOADS},
                 {name: None if run[name]["flushes"] is None else run[name]["flushes"] / n
                  for name in WORKLOADS})


def flush_curve_frame(curve: FlushCurve,
                      latencies_ms: Sequence[float] = (0.1, 0.5, 1, 2, 5, 10)) -> Any:
    """Predicted messages per second of both workloads, and their ratio, at a few latencies."""
    import pandas as pd

    return pd.DataFrame([{"flush ms": ms,
                          **{LABELS[name]: round(curve.costs[name].rate(ms / 1000))
                             for name in WORKLOADS},
                          "worker loop / raw": round(curve.ratio(ms / 1000), 3)}
                         for ms in latencies_ms]).set_index("flush ms")


def describe_flush_curve(curve: FlushCurve) -> str:
    """This run's figures in sentences: costs per message, each point, the prediction."""
    here, loop, raw = curve.points[0], curve.costs["consume"], curve.costs["raw"]
    said = [f"A raw commit here waited {here.flush_s * 1000:.2f} ms for its flush (its time off "
            f"the CPU); per message the worker loop used {loop.cpu_s * 1000:.3f} ms of CPU, a "
            f"raw commit {raw.cpu_s * 1000:.3f} ms."]
    if curve.skipped is not None:
        return "\n".join(said + [
            f"At this machine's flush the worker loop reached {here.ratio:.2f} of the raw "
            "commit rate.",
            f"No curve and no slow-disk point: {curve.skipped}. The fsyncs per message "
            "were not counted, and the curve needs them. With a C compiler (cc, or the one "
            "$CC names) the next run builds the shim into build/, as make bench does."])
    said.append(f"Fsyncs per message: {loop.fsyncs:.2f} for the worker loop, "
                f"{raw.fsyncs:.2f} for a raw commit.")
    for point in curve.points:
        said.append(f"{point.label[0].upper()}{point.label[1:]} ({point.flush_s * 1000:.2f} ms "
                    f"a flush): the worker loop reached {point.ratio:.2f} of the raw commit "
                    f"rate, {curve.ratio(point.flush_s):.2f} predicted.")
    said.append("Predicted at 0.1, 1 and 10 ms a flush: " + ", ".join(
        f"{curve.ratio(ms / 1000):.2f}" for ms in (0.1, 1, 10)) + " of the raw commit rate; "
        + ("the slower the flush, the more one fsync per message is the whole price."
           if curve.ratio(0.0001) < curve.ratio(0.001) < curve.ratio(0.01) else
           "on this run the CPU cost per message was below the raw commit's, so the ratio "
           "falls as the flush grows; run it again."))
    return "\n".join(said)


def plot_flush_curve(curve: FlushCurve, title: str = "Rate against flush latency") -> Any:
    """Predicted rate (lines) and measured points of both workloads; their ratio beside."""
    import matplotlib.pyplot as plt
    import numpy as np

    low = min(0.05, min(p.flush_s for p in curve.points) * 1000 / 2)
    ms = np.geomspace(low, 20, 200)
    counted = curve.skipped is None  # without the shim: the measured point only, no curve
    fig, (rates, ratio) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, color in (("raw", "tab:red"), ("consume", "tab:blue")):
        cost = curve.costs[name]
        if counted:
            rates.plot(ms, [cost.rate(x / 1000) for x in ms], color=color,
                       label=f"{LABELS[name]}, predicted")
        rates.plot([p.flush_s * 1000 for p in curve.points],
                   [p.rates[name] for p in curve.points], "o", color=color,
                   label=f"{LABELS[name]}, measured")
    if counted:
        ratio.plot(ms, [curve.ratio(x / 1000) for x in ms], color="tab:purple", label="predicted")
    ratio.plot([p.flush_s * 1000 for p in curve.points], [p.ratio for p in curve.points], "o",
               color="tab:purple", label="measured")
    for point in curve.points:
        ratio.annotate(point.label, (point.flush_s * 1000, point.ratio), fontsize="small",
                       textcoords="offset points", xytext=(0, -16), ha="center")
    ratio.axhline(1, color="grey", linestyle=":", label="as fast as raw commits")
    top = max(1.15, *(1.1 * p.ratio for p in curve.points))
    rates.set(xscale="log", yscale="log", xlabel="flush latency (ms)",
              ylabel="messages per second", title="Messages per second")
    ratio.set(xscale="log", ylim=(0, top), xlim=(ms[0], ms[-1]), xlabel="flush latency (ms)",
              ylabel="worker loop rate / raw commit rate",
              title="The worker loop against raw commits")
    for ax, corner in ((rates, "lower left"), (ratio, "lower right")):
        ax.grid(alpha=0.3, which="both")
        ax.xaxis.set_major_formatter(lambda value, _: f"{value:g}")  # 0.1, 1, 10
        ax.legend(fontsize="small", loc=corner)
    fig.suptitle(title if counted else f"{title} ({curve.skipped})")
    fig.tight_layout()
    return fig


# -- the commits of one message --------------------------------------------------

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
    from ..handler import Handler

    queue = open_queue()
    queue.enqueue_jsonl(_orders(1, 4))
    while (lease := queue.claim()) is not None:
        queue.complete(lease, Handler())


def _worker_loop(open_queue: Any, clock: Any) -> None:
    from ..handler import Handler
    from ..worker import drain

    queue = open_queue()
    queue.enqueue_jsonl(_orders(1, 4))
    drain(queue, Handler())


CONSUMERS = {"claim, then ACK": _claim_then_ack, "the worker loop (drain)": _worker_loop}


def consume_transactions() -> dict[str, tuple[Transaction, ...]]:
    """Three orders consumed each way (``CONSUMERS``) on a fresh file at the
    default durability: every commit after the enqueue, in order, read from
    the WAL (checkpoints off) as the power-loss sweep reads it."""
    from ..handler import Handler
    from ..values import State
    from .powerloss import Scenario, record

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


if __name__ == "__main__":
    print(json.dumps(_probe(Path(sys.argv[1]), int(sys.argv[2]))))
