"""Rate against flush latency: where one fsync per message is the limit.

On a disk whose flush takes a tenth of a millisecond a queue is CPU-bound,
and its ratio to raw commits says little; on a consumer SSD or a cloud
volume a flush takes 1 to 10 ms, and one fsync per message is the physical
limit. ``measure_flush_curve`` measures, in a few seconds, three workloads
in a child process: the worker loop (``drain``: each ACK, with its effect,
claims the next message in the same transaction), the same messages
claimed and then acknowledged in two transactions (``claim``, then
``complete``), and a raw single-row commit. For each it counts CPU seconds
(user + system) and fsyncs per message, and predicts

    rate(L) = 1 / (cpu + fsyncs * L)     for a flush latency L,

then runs the same child again with every flush delayed by 2 ms (the
``slowdisk`` shim), so two measured points sit beside the curve: this
machine's own flush and the slow disk. Without the shim (no C compiler,
not Linux) only this machine's point is measured, and the reason is kept.

    curve = measure_flush_curve()
    print(describe_flush_curve(curve))    # this run's figures, in words
    flush_curve_frame(curve)              # predicted rates and ratio at a few latencies
    plot_flush_curve(curve)               # pandas and matplotlib load only here

Run as ``python -m queue_core.lab.speed.flushcurve FOLDER MESSAGES``, this module is
that child: it prints one JSON line with its measurements.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from ...sqlite import CHECKPOINT_PAGES
from .slowdisk import DELAY_US, NoShim, ROOT, flush_calls, flush_latency, shim_env

WORKLOADS = ("consume", "each", "raw")
LABELS = {"consume": "worker loop (drain)", "each": "claim, then ACK",  # messages per second
          "raw": "raw commit"}
# Frames written before the measured ones: more than the queue's automatic
# checkpoint (``sqlite.CHECKPOINT_PAGES``), so both logs have wrapped and their
# commits overwrite blocks the file already has, as a long-running service's do;
# appending to a growing file costs the file system more per flush, and the two
# logs would not grow alike.
WARM_PAGES = CHECKPOINT_PAGES + 100


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
    """One measured run: its flush latency, each workload's measured rate, and the
    worker loop's ratio to raw commits in each of its slices (its spread)."""

    label: str
    flush_s: float
    rates: dict[str, float]
    fsyncs: dict[str, float | None]
    slice_ratios: tuple[float, ...] = ()  # the worker loop over raw commits, slice by slice

    @property
    def ratio(self) -> float:
        """The worker loop's measured rate over the raw commits'."""
        return self.ratio_of("consume")

    def ratio_of(self, workload: str, over: str = "raw") -> float:
        return self.rates[workload] / self.rates[over]


@dataclass(frozen=True)
class FlushCurve:
    costs: dict[str, Cost]    # from this machine's own flush
    points: tuple[Point, ...]
    delay_s: float            # the shim's added delay
    skipped: str | None       # why the slow-disk point is missing, if it is
    messages: int = 0         # messages of each workload per run, all slices together
    slices: int = 0           # alternating slices per run

    def ratio(self, flush_s: float, workload: str = "consume", over: str = "raw") -> float:
        """Predicted rate of ``workload`` over ``over``'s at flush latency ``flush_s``."""
        return self.costs[workload].rate(flush_s) / self.costs[over].rate(flush_s)


# -- the child ------------------------------------------------------------------

def _probe(folder: Path, messages: int, slices: int = 10) -> dict[str, Any]:
    """Measure the workloads in this process, in alternating slices so that
    all meet the same disk; the shim, if loaded, counts the flushes. The two
    ways of consuming take turns at one queue.

    The flush latency the run met is the raw commits' own: their wall time
    less their CPU time, per flush.
    """
    from ...audit import check, snapshot
    from ...handler import Handler
    from ...queue import Queue
    from ...sqlite import connect
    from ...worker import drain, finish, finish_and_claim, process_one

    queue, handler = Queue(folder / "queue.sqlite3"), Handler()
    warm = WARM_PAGES // 4  # the worker loop writes 4 or 5 pages a message
    keep = connect(queue.path)  # open throughout: closing the last connection deletes the log
    keep.execute("SELECT count(*) FROM sqlite_master").fetchone()  # it counts once it has read
    with Queue(queue.path, synchronous="OFF").session() as unsynced:  # not measured
        for first in range(2 * messages + 1, 2 * messages + 1 + warm, 1000):  # 1000 a batch
            unsynced.enqueue_jsonl(_orders(first, min(first + 1000, 2 * messages + 1 + warm)))
        drain(unsynced, handler)
    queue.enqueue_jsonl(_orders(0, 2 * messages + 1))
    conn = connect(folder / "raw.sqlite3")  # the pragmas the queue uses: WAL, FULL
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("CREATE TABLE raw (id INTEGER PRIMARY KEY, payload TEXT NOT NULL) STRICT")
    conn.execute("PRAGMA synchronous = OFF")
    for _ in range(WARM_PAGES):  # not measured
        conn.execute("INSERT INTO raw (payload) VALUES ('{}')")
    conn.execute("PRAGMA synchronous = FULL")
    per_slice = messages // slices
    totals = {name: {"wall_s": 0.0, "cpu_s": 0.0, "flushes": 0} for name in WORKLOADS}
    walls: dict[str, list[float]] = {name: [] for name in WORKLOADS}  # slice by slice
    held: list[Any] = []  # the lease the worker loop's last ACK claimed: the next slice goes on

    def consume() -> None:  # drain's steady state: each ACK claims the next message
        lease = held.pop() if held else queue.claim()
        for _ in range(per_slice):
            _, lease = finish_and_claim(queue, lease, handler)
        held.append(lease)

    def each() -> None:  # the course's loop: claim, then complete
        for _ in range(per_slice):
            process_one(queue, handler)

    def commits() -> None:
        for i in range(per_slice):
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO raw (payload) VALUES (?)", (f'{{"n": {i}}}',))
            conn.execute("COMMIT")
    with queue.session():
        for _ in range(slices):
            for name, work in (("consume", consume), ("each", each), ("raw", commits)):
                timed = _timed(work)
                walls[name].append(timed["wall_s"] or 0.0)
                for key, value in timed.items():
                    totals[name][key] = None if value is None or totals[name][key] is None \
                        else totals[name][key] + value
        finish(queue, held.pop(), handler)  # not measured: the last lease, acknowledged
    conn.close()
    keep.close()
    snap = snapshot(queue.path)
    if snap.status.states["done"] != 2 * per_slice * slices + 1 + warm or check(snap):
        raise RuntimeError(f"the probe's queue is not exactly once: {snap.status.states}")
    raw = totals["raw"]
    flush_s = ((raw["wall_s"] - raw["cpu_s"]) / raw["flushes"] if raw["flushes"]
               else flush_latency(folder))
    return {"messages": per_slice * slices, "slices": slices, "flush_s": flush_s,
            "walls": walls, **totals}


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
        done = subprocess.run([sys.executable, "-m", "queue_core.lab.speed.flushcurve", tmp,
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
    return FlushCurve(costs, points, delay_us / 1e6, skipped, first["messages"], first["slices"])


def _point(label: str, run: dict[str, Any]) -> Point:
    n = run["messages"]
    return Point(label, run["flush_s"], {name: n / run[name]["wall_s"] for name in WORKLOADS},
                 {name: None if run[name]["flushes"] is None else run[name]["flushes"] / n
                  for name in WORKLOADS},
                 tuple(raw / consume for consume, raw in zip(run["walls"]["consume"],
                                                             run["walls"]["raw"])))


def flush_curve_frame(curve: FlushCurve,
                      latencies_ms: Sequence[float] = (0.1, 0.5, 1, 2, 5, 10)) -> Any:
    """Predicted messages per second of each workload, and the worker loop's
    ratio to the others, at a few latencies."""
    import pandas as pd

    return pd.DataFrame([{"flush ms": ms,
                          **{LABELS[name]: round(curve.costs[name].rate(ms / 1000))
                             for name in WORKLOADS},
                          "worker loop / raw": round(curve.ratio(ms / 1000), 3),
                          "worker loop / claim, then ACK": round(
                              curve.ratio(ms / 1000, over="each"), 3)}
                         for ms in latencies_ms]).set_index("flush ms")


def describe_flush_curve(curve: FlushCurve) -> str:
    """This run's figures in sentences: costs per message, each point, the prediction."""
    here, costs = curve.points[0], curve.costs
    said = [f"A raw commit here waited {here.flush_s * 1000:.2f} ms for its flush (its time off "
            "the CPU). CPU per message: " + ", ".join(
                f"{LABELS[name]} {costs[name].cpu_s * 1000:.3f} ms" for name in WORKLOADS) + "."]
    if curve.skipped is not None:
        return "\n".join(said + [
            f"At this machine's flush the worker loop reached {here.ratio:.2f} of the raw "
            f"commit rate, claim then ACK {here.ratio_of('each'):.2f}.",
            f"No curve and no slow-disk point: {curve.skipped}. The fsyncs per message "
            "were not counted, and the curve needs them. With a C compiler (cc, or the one "
            "$CC names) the next run builds the shim into build/, as make bench does."])
    said.append("Fsyncs per message: " + ", ".join(
        f"{LABELS[name]} {costs[name].fsyncs:.2f}" for name in WORKLOADS) + ".")
    said.append(_fused_gap(costs["consume"].cpu_s, costs["each"].cpu_s))
    for point in curve.points:
        said.append(f"{point.label[0].upper()}{point.label[1:]} ({point.flush_s * 1000:.2f} ms "
                    f"a flush): the worker loop reached {point.ratio:.2f} of the raw commit "
                    f"rate ({curve.ratio(point.flush_s):.2f} predicted), claim then ACK "
                    f"{point.ratio_of('each'):.2f} ({curve.ratio(point.flush_s, 'each'):.2f}).")
    said.append("Predicted at 0.1, 1 and 10 ms a flush: the worker loop at " + ", ".join(
        f"{curve.ratio(ms / 1000):.2f}" for ms in (0.1, 1, 10)) + " of the raw commit rate, "
        "and at " + ", ".join(f"{curve.ratio(ms / 1000, over='each'):.2f}" for ms in (0.1, 1, 10))
        + " times the rate of claim then ACK: "
        + ("the slower the flush, the more one fsync per message is the whole price."
           if curve.ratio(0.0001) < curve.ratio(0.001) < curve.ratio(0.01) else
           "on this run the CPU costs did not order as they usually do; run it again."))
    above = [f"{LABELS[name]} {point.ratio_of(name):.2f} {point.label}" for point in curve.points
             for name in ("consume", "each") if point.ratio_of(name) > 1]
    if above:
        said.append(f"Measured above the raw commit rate: {', '.join(above)}. No workload that "
                    "fsyncs at least once a message can beat the raw commit for long; a point "
                    "above it is a slice the machine's other work favoured.")
    return "\n".join(textwrap.fill(line, 100) for line in said)


def _fused_gap(loop_s: float, each_s: float) -> str:
    """What this run measured the fused step to save, in CPU per message."""
    gap_ms = (each_s - loop_s) * 1000
    if gap_ms > 0:
        return (f"The worker loop spent {gap_ms:.3f} ms less CPU per message than claim then "
                "ACK: that is what the fused step saves (a transaction's begin, commit and "
                "pages), and the gap between their lines where a flush is quick.")
    return (f"On this run the worker loop's CPU per message came out {-gap_ms:.3f} ms above "
            "claim then ACK's: the machine's other work moved the measurement by more than the "
            "fused step saves, so the lines below cross or swap; run it again on a quieter "
            "machine to see the saving.")


def plot_flush_curve(curve: FlushCurve, title: str = "Rate against flush latency") -> Any:
    """Predicted rates (lines) and measured points of each workload; the two
    ways of consuming over raw commits beside."""
    import matplotlib.pyplot as plt
    import numpy as np

    low = min(0.05, min(p.flush_s for p in curve.points) * 1000 / 2)
    ms = np.geomspace(low, 20, 200)
    counted = curve.skipped is None  # without the shim: the measured points only, no curve
    colours = {"raw": "tab:red", "each": "tab:orange", "consume": "tab:blue"}
    fig, (rates, ratio) = plt.subplots(1, 2, figsize=(11, 4.4))
    for name, colour in colours.items():
        if counted:
            rates.plot(ms, [curve.costs[name].rate(x / 1000) for x in ms], color=colour,
                       label=f"{LABELS[name]}, predicted")
        rates.plot([p.flush_s * 1000 for p in curve.points],
                   [p.rates[name] for p in curve.points], "o", color=colour,
                   label=f"{LABELS[name]}, measured")
        if name == "raw":
            continue
        if counted:
            ratio.plot(ms, [curve.ratio(x / 1000, name) for x in ms], color=colour,
                       label=f"{LABELS[name]}, predicted")
        ratio.plot([p.flush_s * 1000 for p in curve.points],
                   [p.ratio_of(name) for p in curve.points], "o", color=colour,
                   label=f"{LABELS[name]}, measured")
    for point in curve.points:
        ratio.annotate(point.label, (point.flush_s * 1000, min(point.ratio_of("each"),
                                                             point.ratio)),
                       fontsize="small", textcoords="offset points", xytext=(0, -16), ha="center")
    ratio.axhline(1, color="grey", linestyle=":", label="as fast as raw commits")
    top = max(1.15, *(1.1 * p.ratio_of(name) for p in curve.points for name in ("each", "consume")))
    rates.set(xscale="log", yscale="log", xlabel="flush latency (ms)",
              ylabel="messages per second", title="Messages per second")
    ratio.set(xscale="log", ylim=(0, top), xlim=(ms[0], ms[-1]), xlabel="flush latency (ms)",
              ylabel="rate / raw commit rate", title="Consuming, against raw commits")
    for ax, corner in ((rates, "lower left"), (ratio, "lower right")):
        ax.grid(alpha=0.3, which="both")
        ax.xaxis.set_major_formatter(lambda value, _: f"{value:g}")  # 0.1, 1, 10
        ax.legend(fontsize="small", loc=corner)
    fig.suptitle(title if counted else f"{title} ({curve.skipped})")
    fig.tight_layout()
    return fig


if __name__ == "__main__":
    print(json.dumps(_probe(Path(sys.argv[1]), int(sys.argv[2]))))
