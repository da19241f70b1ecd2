"""Throughput against the number of worker processes, on either store, and what decides it.

``measure_scaling`` enqueues the same batch into a new queue for every
(store, worker count) pair, starts that many real worker processes
(``child``, ``drain`` mode, the model clock fixed so that no lease expires),
lets them go together through a starting gate, and times from the gate's
opening to the last worker's exit. Every run is then audited: each event
done exactly once, reported done by exactly one worker, the money right.
Notebook 10 draws the result with ``plot_scaling``.

Whether more workers help is decided by the machine, so each run also
notes how busy all of its cores were meanwhile (``/proc/stat``, Linux;
``None`` elsewhere); ``machine_busy`` says how busy other programs keep
them, ``commit_cost`` what one single-row commit costs on each store and
how much of it is waiting for the disk's flush, ``pg_round_trips`` how
often the worker loop waits for the server in each transaction (read from
libpq's own trace of the connection), and ``describe_scaling`` puts a
run's figures into sentences.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import textwrap
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from ... import audit
from ...clock import ModelClock
from ...queue import Queue
from ...sqlite import connect, is_connection_string
from ..story.child import collect, open_gate, reap, run_child
from ..story.scenario import START
from .rawcommits import prepare as prepare_raw, raw_rate

if TYPE_CHECKING:
    from ...handler import Handler

LONG_LEASE_SECONDS = 600  # the model clock stands still: no lease expires during a run


@dataclass(frozen=True)
class ScalingRow:
    """One timed run: ``workers`` processes draining ``events`` messages on ``store``."""

    store: str
    workers: int
    events: int
    seconds: float
    done: int
    effects: int
    reported_twice: int
    total: int
    expected_total: int
    findings: tuple[str, ...]
    cpu_busy: float | None = None  # share of all cores busy during the run (any program)

    @property
    def per_second(self) -> float:
        return self.events / self.seconds

    @property
    def exactly_once(self) -> bool:
        return (self.done == self.effects == self.events and self.reported_twice == 0
                and self.total == self.expected_total and not self.findings)


_ORDERS = uuid.UUID("0b7e6f4a-5c1d-4e2a-9f3b-000000000010")  # the general ids' namespace


def scaling_batch(events: int, ids: str = "course") -> tuple[str, int]:
    """``events`` valid orders as JSONL, and the money they add together; under
    the ``general`` id rule their ids are UUIDs (``uuid5``: the same every run)."""
    def event_id(n: int) -> str:
        return f"E{n:04d}" if ids == "course" else str(uuid.uuid5(_ORDERS, str(n)))

    lines = [json.dumps({"event_id": event_id(n),
                         "payload": {"category": "book", "amount_cents": 100 + n}})
             for n in range(1, events + 1)]
    return "\n".join(lines) + "\n", sum(100 + n for n in range(1, events + 1))


def time_workers(db: str, store: str, workers: int, events: int,
                 ids: str = "course") -> ScalingRow:
    """Enqueue ``events`` orders into the new queue ``db`` (made with the id
    rule ``ids``), drain them with ``workers`` processes started together, and
    audit the result."""
    text, expected = scaling_batch(events, ids)
    Queue(db, clock=ModelClock(START), ids=ids).enqueue_jsonl(text)
    with tempfile.TemporaryDirectory(prefix="queue_gate_") as gate:
        procs = [run_child(db, now=START, lease_seconds=LONG_LEASE_SECONDS, mode="drain",
                           gate=gate, wait=False) for _ in range(workers)]
        try:
            open_gate(gate, workers)
            started, ticks = time.perf_counter(), cpu_ticks()
            results = [collect(proc) for proc in procs]  # type: ignore[arg-type]
            seconds, busy = time.perf_counter() - started, busy_share(ticks, cpu_ticks())
        finally:
            reap(procs)  # type: ignore[arg-type]
    reported = Counter(o.event_id for r in results for o in r.outcomes if o.kind == "done")
    snap = audit.snapshot(db)
    return ScalingRow(store, workers, events, seconds,
                      sum(1 for s in snap.states().values() if s == "done"), len(snap.effect_rows),
                      sum(n - 1 for n in reported.values() if n > 1), snap.money, expected,
                      tuple(str(f) for f in audit.check(snap)), busy)


def measure_scaling(new_db: Callable[[str], str], *, stores: Sequence[str] = ("sqlite",),
                    workers: Sequence[int] = (1, 2, 4), events: int = 200,
                    ids: str = "course") -> list[ScalingRow]:
    """``time_workers`` for every store and worker count, on queues of the id
    rule ``ids``; ``new_db(store)`` returns a new, empty queue location of that
    store for each run."""
    return [time_workers(new_db(store), store, n, events, ids)
            for store in stores for n in workers]


@dataclass(frozen=True)
class CurvePoint:
    """One run of ``against_raw_commits``: the queue's run, and the rate of raw
    commits from as many client processes, measured after it."""

    run: ScalingRow
    raw_per_second: float

    @property
    def vs_raw(self) -> float:
        return self.run.per_second / self.raw_per_second


def against_raw_commits(runs: Sequence[ScalingRow], raw_location: Callable[[str], str], *,
                        commits: int = 150) -> list[CurvePoint]:
    """Runs already timed (``measure_scaling``), each beside the rate of
    ``commits`` raw commits from each of as many client processes as it had
    workers, measured now on its store (``raw_location(store)``: one location
    per store for the raw commits' table)."""
    places: dict[str, str] = {}
    points = []
    for run in runs:
        if run.store not in places:
            places[run.store] = raw_location(run.store)
            prepare_raw(places[run.store])
        points.append(CurvePoint(run, raw_rate(places[run.store], run.workers, commits)))
    return points


def describe_curve(points: Sequence[CurvePoint]) -> str:
    """``against_raw_commits``'s points in sentences: each store's rates against its raw
    commits, and how the share of them kept moved as workers were added."""
    said = []
    for store in dict.fromkeys(p.run.store for p in points):
        mine = [p for p in points if p.run.store == store]
        first, last = mine[0], mine[-1]
        said.append(f"{store}: " + "; ".join(
            f"{p.run.workers} worker{'s' * (p.run.workers > 1)} {p.run.per_second:,.0f} "
            f"messages/s, {p.vs_raw:.2f} of {p.raw_per_second:,.0f} raw commits/s"
            + ("" if p.run.cpu_busy is None
               else f" (cores {p.run.cpu_busy:.0%} busy during the queue's run)")
            for p in mine) + ".")
        said.append(f"  From {first.run.workers} to {last.run.workers} workers the raw commits "
                    f"{trend(first.raw_per_second, last.raw_per_second)} "
                    f"(x{step(first.raw_per_second, last.raw_per_second):.2f}) and the queue's "
                    f"rate {trend(first.run.per_second, last.run.per_second)} "
                    f"(x{step(first.run.per_second, last.run.per_second):.2f}), so the share "
                    f"of raw commits it kept went from {first.vs_raw:.2f} to "
                    f"{last.vs_raw:.2f}"
                    + ("" if len(mine) < 3 else " (" + ", ".join(
                        f"{p.vs_raw:.2f}" for p in mine) + " at " + ", ".join(
                        str(p.run.workers) for p in mine) + " workers)") + ".")
        fell = [(a, b) for a, b in zip(mine, mine[1:])
                if trend(a.raw_per_second, b.raw_per_second) == "fell"]
        if fell and store == "postgres":  # its server flushes more clients' commits together
            # (SQLite's clients take one write lock in turn: theirs may fall by themselves)
            a, b = fell[0]
            said.append(f"  But the raw commits fell from {a.run.workers} to {b.run.workers} "
                        f"clients ({a.raw_per_second:,.0f} to {b.raw_per_second:,.0f} a "
                        "second), although more clients let the server flush more commits "
                        "together: their short samples, taken after the queue's runs, moved "
                        "with what else the machine did, so in this run the shares say more "
                        "about that baseline than about the queue (make scale times longer "
                        "samples just before and after each phase).")
    exact = all(p.run.exactly_once for p in points)
    verdict = "each event done exactly once, money exact" if exact else "FAILED"
    said.append(f"Audit of every run: {verdict} ({sum(p.run.events for p in points):,} events "
                f"in {len(points)} queues).")
    return "\n".join(textwrap.fill(line, 100, subsequent_indent="  ") for line in said)


def plot_curve(points: Sequence[CurvePoint], title: str = "Workers against raw commits") -> Any:
    """Left: messages per second (solid) and raw commits per second of as many
    clients (dashed) against worker processes, per store; right: their ratio."""
    import matplotlib.pyplot as plt

    fig, (rates, share) = plt.subplots(1, 2, figsize=(11.5, 3.8))
    for store, (marker, colour) in STORES.items():
        mine = [p for p in points if p.run.store == store]
        if not mine:
            continue
        counts = [p.run.workers for p in mine]
        rates.plot(counts, [p.run.per_second for p in mine], marker, color=colour,
                   label=f"{store}: the queue")
        rates.plot(counts, [p.raw_per_second for p in mine], marker[0] + "--", color=colour,
                   alpha=0.6, mfc="white", label=f"{store}: raw commits")
        share.plot(counts, [p.vs_raw for p in mine], marker, color=colour, label=store)
    counts = sorted({p.run.workers for p in points})
    rates.set(xlabel="worker processes (raw commits: client processes)", ylabel="per second",
              title=title)
    share.set(xlabel="worker processes", ylabel="messages / raw commits",
              title="Share of raw commits the queue keeps",
              # a share can pass 1 (on PostgreSQL a raw commit takes three round trips,
              # the step one: a server far away favours the queue)
              ylim=(0, max(1.05, 1.1 * max(p.vs_raw for p in points))))
    for ax in (rates, share):
        ax.set_xticks(counts)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small", loc="best")
    rates.set_ylim(bottom=0)
    fig.tight_layout()
    return fig


def scaling_frame(rows: Sequence[ScalingRow]) -> Any:
    """The runs as a pandas DataFrame: one row per run, messages per second included."""
    import pandas as pd

    return pd.DataFrame([{"store": r.store, "workers": r.workers, "events": r.events,
                          "seconds": round(r.seconds, 3), "per second": round(r.per_second),
                          "cores busy": None if r.cpu_busy is None else f"{r.cpu_busy:.0%}",
                          "exactly once": r.exactly_once} for r in rows])


STORES = {"sqlite": ("o-", "tab:blue"), "postgres": ("s-", "tab:orange")}  # marker, colour
WHERE_THE_FLUSH_IS = {"sqlite": "held under the file's one write lock",
                      "postgres": "other workers go on meanwhile"}


def plot_scaling(rows: Sequence[ScalingRow], title: str = "Throughput against worker processes",
                 costs: dict[str, CommitCost] | None = None) -> Any:
    """Messages per second against the number of worker processes, one line per
    store; beside it, with ``costs``, one worker's time per message on each
    store and the part of it a commit spends waiting for the disk's flush."""
    import matplotlib.pyplot as plt

    shown = [store for store in STORES if costs and store in costs
             and any(r.store == store and r.workers == 1 for r in rows)]
    fig, axes = plt.subplots(1, 2 if shown else 1, figsize=(11.5 if shown else 6.4, 3.8),
                             squeeze=False, gridspec_kw={"width_ratios": [1, 1.1][:1 + bool(shown)]})
    rate = axes[0][0]
    for store in STORES:
        mine = [r for r in rows if r.store == store]
        if mine:
            rate.plot([r.workers for r in mine], [r.per_second for r in mine],
                      STORES[store][0], color=STORES[store][1], label=store)
    rate.set(xlabel="worker processes", ylabel="messages per second", title=title)
    rate.set_xticks(sorted({r.workers for r in rows}))
    rate.set_ylim(bottom=0)
    rate.grid(alpha=0.3)
    rate.legend(fontsize="small", loc="lower right")
    if shown and costs:
        _plot_waits(axes[0][1], rows, {store: costs[store] for store in shown})
    fig.tight_layout()
    return fig


def _plot_waits(ax: Any, rows: Sequence[ScalingRow], costs: dict[str, CommitCost]) -> None:
    """One worker's milliseconds per message, and a commit's flush, per store."""
    for y, (store, cost) in enumerate(costs.items()):
        one = next(r for r in rows if r.store == store and r.workers == 1)
        message_ms, flush_ms = 1000 / one.per_second, cost.flush_s * 1000
        colour = STORES[store][1]
        ax.barh(y - 0.2, message_ms, height=0.36, color=colour, alpha=0.45)
        ax.barh(y + 0.2, flush_ms, height=0.36, color=colour, hatch="//", edgecolor="white")
        ax.text(message_ms, y - 0.2, f" one message, one worker: {message_ms:.2f} ms",
                va="center", fontsize="small")
        ax.text(flush_ms, y + 0.2, f" a commit's wait for the flush: {flush_ms:.2f} ms\n"
                f" ({WHERE_THE_FLUSH_IS[store]})", va="center", fontsize="small")
    widest = max(1000 / r.per_second for r in rows if r.workers == 1 and r.store in costs)
    ax.set(xlim=(0, 2.2 * max(widest, *(c.flush_s * 1000 for c in costs.values()))),
           xlabel="milliseconds", title="One worker: a message's time, and a commit's flush")
    ax.set_yticks(range(len(costs)), list(costs))
    ax.invert_yaxis()
    ax.grid(alpha=0.3, axis="x")


# -- what decides it -------------------------------------------------------------

def cpu_ticks() -> tuple[int, int] | None:
    """Busy and total clock ticks of all cores since boot (``/proc/stat``), or
    ``None`` where that file does not exist (not Linux)."""
    try:
        first = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    ticks = [int(field) for field in first[1:9]]  # user nice system idle iowait irq softirq steal
    return sum(ticks) - ticks[3] - ticks[4], sum(ticks)


def busy_share(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """The share of all cores' time that was busy between two ``cpu_ticks``."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1])


BUSY_SAMPLE_S = 0.3  # how long ``machine_busy`` watches the cores by default


def machine_busy(seconds: float = BUSY_SAMPLE_S) -> float | None:
    """How busy all cores are while this process sleeps: other programs' share
    of all the cores' time over ``seconds`` (``busy_share``: busy ticks of every
    core over all ticks, from ``/proc/stat``; ``steal``, the time a virtual
    machine's host took back, counts as busy); ``None`` where it cannot be read."""
    before = cpu_ticks()
    time.sleep(seconds)
    return busy_share(before, cpu_ticks())


@dataclass(frozen=True)
class CommitCost:
    """What one single-row commit costs on a store, with and without waiting
    for the disk's flush (medians of interleaved blocks)."""

    store: str
    commit_s: float    # at the queue's durability: FULL, or synchronous_commit on
    unsynced_s: float  # the same commit without waiting for the flush

    @property
    def flush_s(self) -> float:
        return max(0.0, self.commit_s - self.unsynced_s)


def commit_cost(location: str, commits: int = 20) -> CommitCost:
    """Time single-row commits in a new SQLite file or a fresh PostgreSQL
    schema (``location``), in blocks that alternate waiting for the flush
    (as the queue's commits do) and not."""
    if is_connection_string(location):
        import psycopg

        with psycopg.connect(location, autocommit=True) as conn:
            conn.execute("CREATE TABLE commit_probe (id bigint GENERATED ALWAYS AS IDENTITY "
                         "PRIMARY KEY, payload text NOT NULL)")
            timed = _alternate(lambda on: conn.execute(
                f"SET synchronous_commit = {'on' if on else 'off'}"),
                lambda: conn.execute("INSERT INTO commit_probe (payload) VALUES ('{}')"), commits)
            conn.execute("DROP TABLE commit_probe")
        return CommitCost("postgres", *timed)
    conn = connect(location)
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("CREATE TABLE commit_probe (id INTEGER PRIMARY KEY, payload TEXT NOT NULL)")
        conn.execute("PRAGMA synchronous = OFF")
        for _ in range(1_100):  # past the first checkpoint: the log's blocks are reused
            conn.execute("INSERT INTO commit_probe (payload) VALUES ('{}')")
        timed = _alternate(lambda on: conn.execute(
            f"PRAGMA synchronous = {'FULL' if on else 'OFF'}"),
            lambda: conn.execute("INSERT INTO commit_probe (payload) VALUES ('{}')"), commits)
    finally:
        conn.close()
    return CommitCost("sqlite", *timed)


def _alternate(durable: Callable[[bool], object], commit: Callable[[], object],
               commits: int, block: int = 10) -> tuple[float, float]:
    """Median seconds of ``commit`` with ``durable(True)`` and with ``durable(False)``."""
    times: dict[bool, list[float]] = {True: [], False: []}
    for n in range(2 * max(1, commits // block)):
        on = n % 2 == 0
        durable(on)
        for _ in range(block):
            started = time.perf_counter()
            commit()
            times[on].append(time.perf_counter() - started)
    return statistics.median(times[True]), statistics.median(times[False])


@dataclass(frozen=True)
class PgTransactions:
    """The worker loop's transactions on PostgreSQL, from libpq's trace: the
    round trips (the client sent, then waited for the server's answer) of
    each, and its commits, in order."""

    messages: int
    round_trips: tuple[int, ...]
    commits: tuple[int, ...]
    synchronous_commit: str


def pg_round_trips(dsn: str, messages: int = 20, handler: Handler | None = None
                   ) -> PgTransactions:
    """Drain ``messages`` orders from the new queue ``dsn`` (``drain``, the
    worker loop, with ``handler``: the business handler by default) with
    libpq tracing the connection; every transaction's round trips and
    commits. A transaction ends where the server says it is idle again
    (``ReadyForQuery``, status ``I``)."""
    from psycopg.pq import Trace

    from ...handler import Handler
    from ...worker import drain

    queue = Queue(dsn, clock=ModelClock(START), lease_seconds=LONG_LEASE_SECONDS)
    queue.enqueue_jsonl(scaling_batch(messages)[0])
    with queue.session(), tempfile.TemporaryFile("w+") as log:
        raw = queue.connection.raw  # type: ignore[union-attr]
        sync = str(raw.execute("SHOW synchronous_commit").fetchone()[0])
        raw.pgconn.trace(log.fileno())
        raw.pgconn.set_trace_flags(Trace.SUPPRESS_TIMESTAMPS | Trace.REGRESS_MODE)
        done = drain(queue, handler if handler is not None else Handler())
        raw.pgconn.untrace()
        log.seek(0)
        lines = [line.split("\t") for line in log.read().splitlines() if line.strip()]
    if len(done) != messages or any(o.kind != "done" for o in done):
        raise RuntimeError(f"the traced drain did not finish {messages} messages: {done}")
    trips, commits, sent, waited, committed = [], [], False, 0, 0
    for line in lines:
        if line[0] == "F":
            sent = True
        elif line[0] == "B":
            waited, sent = waited + sent, False
            said = line[3].strip() if len(line) > 3 else ""
            committed += line[2] == "CommandComplete" and said == '"COMMIT"'
            if line[2] == "ReadyForQuery" and said == "I":  # idle: the transaction is over
                trips.append(waited)
                commits.append(committed)
                waited = committed = 0
    return PgTransactions(messages, tuple(trips), tuple(commits), sync)


# A step whose ratio, as printed (two decimals), is within this of 1 "stayed level":
# runs on one machine vary that much from one to the next.
LEVEL_BAND = 0.15


def step(before: float, after: float) -> float:
    """The ratio of one rate to the one before it, as the sentences print it."""
    return round(after / before, 2)


def trend(before: float, after: float) -> str:
    """``rose``, ``fell`` or ``stayed level`` (the printed ratio within ``LEVEL_BAND`` of 1)."""
    ratio = step(before, after)
    return "rose" if ratio > 1 + LEVEL_BAND else "fell" if ratio < 1 - LEVEL_BAND else \
        "stayed level"


def describe_scaling(rows: Sequence[ScalingRow], *, cores: int | None,
                     background: float | None, costs: dict[str, CommitCost] | None = None
                     ) -> str:
    """This run's figures in sentences, and whether each store's trend followed
    from what was measured here (the flush to fill, the cores to fill it).
    ``rows``: 1, 2 and 4 workers per store, as ``measure_scaling`` runs them."""
    said = [f"This machine has {cores or 'an unknown number of'} CPU cores; "
            + ("how busy other programs kept them is not measured on this system."
               if background is None else _background(background, cores))]
    said.append(f"A step from one number of workers to the next counts as level when its ratio "
                f"is within {LEVEL_BAND:.0%} of 1 (x{1 - LEVEL_BAND:.2f} to x{1 + LEVEL_BAND:.2f}): "
                "runs on one machine vary that much; above it rose, below it fell.")
    rates = {(r.store, r.workers): r for r in rows}
    for store in dict.fromkeys(r.store for r in rows):
        one, two, four = (rates[store, n].per_second for n in (1, 2, 4))
        said.append(f"{store}: {one:.0f} messages/s with 1 worker; 2 workers: {two / one:.2f} "
                    f"times that, 4 workers: {four / one:.2f} times. From 1 to 2 workers it "
                    f"{trend(one, two)} (x{step(one, two):.2f}), from 2 to 4 it "
                    f"{trend(two, four)} (x{step(two, four):.2f}).")
        cost = (costs or {}).get(store)
        if cost is not None:
            said.append(f"  One {store} worker took {1000 / one:.2f} ms per message; a "
                        f"single-row commit alone {cost.commit_s * 1000:.2f} ms, of which "
                        f"{cost.flush_s * 1000:.2f} ms waiting for the disk's flush.")
    if ("sqlite", 2) in rates:
        said.append(_sqlite_reasons(rates["sqlite", 1], [rates[key] for key in sorted(rates)
                                                         if key[0] == "sqlite" and key[1] > 1]))
    if ("postgres", 2) in rates and costs and "postgres" in costs:
        said += _postgres_reasons(rates["postgres", 1], rates["postgres", 2],
                                  rates.get(("postgres", 4)), cores, costs["postgres"])
    return "\n".join(textwrap.fill(line, 100, subsequent_indent="  " if line[0] == " " else "")
                     for line in said)


def _background(background: float, cores: int | None) -> str:
    """What ``machine_busy`` measured, how, and what it means for the rates after it
    (``background`` as ``machine_busy`` measures it by default)."""
    share = "" if not cores else f", the work of about {background * cores:.1f} of the {cores} cores"
    return (f"before the runs, other programs kept them {background:.0%} busy: for "
            f"{BUSY_SAMPLE_S:g} s, while the measuring process slept, the kernel counted that "
            "share of all the cores' time as busy (/proc/stat, time a virtual machine's host took "
            f"back included){share}. The workers below share the cores with whatever keeps "
            "running, so the busier they are, the more of each run's time is waiting for a core, "
            "which the rates cannot tell apart from the queue's own work; the table's column "
            "\"cores busy\" counts every program during each run, the workers included.")


NOISY = ("On a machine whose cores other programs keep busy, each process also waits for its "
         "turn on a core, which nothing here tells apart from the rest, and one short run per "
         "worker count is noisy: run the cell again, or make bench, which times many "
         "interleaved slices.")


def _sqlite_reasons(one: ScalingRow, more: list[ScalingRow]) -> str:
    """SQLite's trend from 1 worker to more, against its one write lock."""
    words = ("SQLite: a worker keeps the file's one write lock while its commit waits for the "
             "flush, so the commits go one at a time, whatever the number of workers.")
    rose = [row.workers for row in more if trend(one.per_second, row.per_second) == "rose"]
    if rose:
        counts = " and ".join(str(n) for n in rose)
        return (f"{words} It rose here all the same with {counts} workers: what one worker does "
                "outside the lock (its Python code, and on a busy machine its turn waiting for a "
                "core) overlapped another's commit.")
    return f"{words} Here more workers only queued for the lock."


def _postgres_reasons(one: ScalingRow, two: ScalingRow, four: ScalingRow | None,
                      cores: int | None, cost: CommitCost) -> list[str]:
    """Why PostgreSQL's rate rose or not from 1 to 2 workers, and from 2 to 4: waits
    to fill, cores to fill them."""
    waiting = cost.flush_s * one.per_second  # the flush's share of one worker's time
    idle = None if one.cpu_busy is None or not cores else cores * (1 - one.cpu_busy)
    said = [f"PostgreSQL: a second worker gains where the first one waits (for round trips, for "
            f"a commit's flush) and a core is free to run it. Here a commit's flush was "
            f"{waiting:.0%} of one worker's time"
            + ("." if idle is None else f", and about {idle:.1f} of {cores} cores were idle "
               "during its run.")]
    went = trend(one.per_second, two.per_second)
    fillable = waiting >= 0.25 or (idle is not None and idle >= 0.5)
    if went == "rose" and fillable:
        said.append("The second worker filled the first one's waits with work of its own (and the "
                    "server can flush both workers' commits at once)." if waiting >= 0.25 else
                    "The second worker ran on the idle cores.")
    elif went != "rose" and not fillable:
        said.append("Little was left to fill: the flush was short and the cores were busy, so "
                    "the processes took turns on the same cores.")
    else:
        said.append(f"It {went} all the same. {NOISY}")
    if four is not None:
        said.append(_two_to_four(two, four, cores))
    return said


def _two_to_four(two: ScalingRow, four: ScalingRow, cores: int | None) -> str:
    """PostgreSQL from 2 workers to 4: whether the 2-worker run left cores for two
    more workers and their server processes (the waits one worker leaves, two
    already fill in part)."""
    went = trend(two.per_second, four.per_second)
    if two.cpu_busy is None or not cores:
        return (f"From 2 to 4 workers it {went}; how busy the cores were during the 2-worker "
                "run is not measured on this system.")
    idle = cores * (1 - two.cpu_busy)
    during = f"about {idle:.1f} of {cores} cores were idle during the 2-worker run"
    if idle >= 0.5:
        return (f"From 2 to 4 workers it rose as well: {during}, and the further workers ran "
                "on them." if went == "rose" else
                f"From 2 to 4 workers it {went} although {during}: one short run per worker "
                "count is noisy.")
    if went == "rose":
        return (f"From 2 to 4 workers it rose although only {during}: the gain came from waits "
                "(round trips, a commit's flush) the workers filled for one another, or is the "
                "noise of one short run.")
    return (f"From 2 to 4 workers it {went}: only {during}, so the further workers and their "
            "server processes took turns on busy cores, each switch costing time of its own.")
