"""The figures of ``bench.py``: medians per case and the targets (``bench_text`` prints them).

Every ratio compares rates measured in the same run, each slice divided by
the raw commits of its own store measured just before and just after it
("x raw"). The consumer side (our claim + ACK through ``drain``, a peer's
get + ack, the queue filled beforehand) is the headline; end to end adds
the producer, whose batching each row names. ``peers`` are the bare
peers (get + ack), ``same_work`` the peers on the same work as ours (get,
the effect's own commit in the application's database, ack).
"""

from __future__ import annotations

import resource
import statistics
from typing import Any, Callable

from bench_cases import Case, QueueSize
from bench_priority import figure as starvation_figure
from queue_core.queue import PRUNE_BATCH
from peers import FSYNCING, PeerCase, SameWorkCase


def summarise(cases: list[Case], raws: list[Case], memory: tuple[int, float] | None = None,
              safety: dict[str, dict[str, Any]] | None = None,
              missing: list[str] | None = None) -> dict[str, Any]:
    """Medians per case, from this run; each case against its own store's raw commits."""
    every = [*raws, *cases]
    vs_raw = {case.name: case.vs_raw() for case in cases}
    e2e_vs_raw = {case.name: case.end_to_end_vs_raw() for case in cases}
    for raw in raws:
        vs_raw[raw.name] = e2e_vs_raw[raw.name] = 1.0

    def entry(case: PeerCase) -> dict[str, Any]:
        return dict(case.info(), name=case.name, label=case.label, durability=case.durability(),
                    rate=case.rate(), e2e=case.end_to_end(), vs_raw=vs_raw[case.name],
                    e2e_vs_raw=e2e_vs_raw[case.name], flushes=flushes_per_message(case))
    bare = [entry(case) for case in cases
            if isinstance(case, PeerCase) and not isinstance(case, SameWorkCase)]
    same_work = [entry(case) for case in cases if isinstance(case, SameWorkCase)]
    raw = raws[0]
    return {
        "rates": {case.name: case.rate() for case in every},
        "end_to_end": {case.name: case.end_to_end() for case in every},
        "vs_raw": vs_raw,
        "e2e_vs_raw": e2e_vs_raw,
        # over one worker's slices just before and just after each (``bench.interleave``)
        "paired": {case.name: statistics.median(case.paired) for case in cases if case.paired},
        "raw_around": {case.name: raw_around(case) for case in cases},
        "flushes": {case.name: flushes_per_message(case) for case in every},
        "samples": {case.name: list(case.relative) for case in cases},
        "labels": {case.name: case.label for case in every},
        "producers": {case.name: producer(case) for case in every},
        "durability": {case.name: durability(case) for case in every},
        "sizes": {case.size: case.name for case in cases if isinstance(case, QueueSize)},
        "slices": sum(len(case.slices) for case in cases),
        "memory": memory,
        "parent_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "raw_range": (min(map(_rate, raw.slices)), max(map(_rate, raw.slices))),
        "peers": bare,
        "same_work": same_work,
        "peers_missing": missing or [],
        "safety": safety or {},
    }


def raw_around(case: Case) -> float:
    """The raw commit rate each slice of ``case`` was divided by (the mean of the
    raw slices just before and just after it), median over its slices."""
    return statistics.median(_rate(s) / r for s, r in zip(case.slices, case.relative))


def flushes_per_message(case: Case) -> float | None:
    """fsync + fdatasync calls per consumed message, where the slow-disk shim counted them."""
    counted = [s for s in case.slices if s.flushes is not None]
    if not counted or len(counted) < len(case.slices):
        return None
    return sum(s.flushes or 0 for s in counted) / sum(s.messages for s in counted)


def producer(case: Case) -> str:
    if isinstance(case, PeerCase) or getattr(case, "producer", "") == "single":
        return "1 per commit"
    return "JSONL batch" if hasattr(case, "producer") else "-"


def durability(case: Case) -> str:
    """What a commit of the case waits for: journal and synchronous setting."""
    if isinstance(case, PeerCase):
        return case.durability()
    if case.baseline == "pg_raw":
        return "LOGGED, on"
    if getattr(case, "sync", "FULL") == "NORMAL":
        return "WAL, NORMAL (option)"
    return "WAL, FULL" if case.name == "raw" else "WAL, FULL*"


def _rate(measured: Any) -> float:
    return float(measured.messages / measured.consume_s)


# -- targets --------------------------------------------------------------------

def fastest(results: dict[str, Any], store: str, durable: bool) -> dict[str, Any] | None:
    """The fastest peer of ``store`` on the consumer side: among those whose every
    commit waits for a flush (``durable``), or those at ``synchronous=NORMAL``."""
    chosen = [peer for peer in results.get("peers", []) if peer.get("store", "sqlite") == store
              and ((peer["synchronous"] in FSYNCING) if durable
                   else peer["synchronous"] == "NORMAL")]
    return max(chosen, key=lambda peer: peer["vs_raw"]) if chosen else None


def _ratio(results: dict[str, Any] | None, top: str, bottom: str) -> tuple[float | None, str]:
    """One case over another, consumer side, each against its raw commits."""
    vs_raw = (results or {}).get("vs_raw", {})
    return (vs_raw[top] / vs_raw[bottom], "") if top in vs_raw and bottom in vs_raw else (None, "")


def _paired(results: dict[str, Any] | None, name: str) -> tuple[float | None, str]:
    """A case over one worker on the same work, each of its slices over the one
    worker's just before and just after it: the median (``bench.interleave``)."""
    paired = (results or {}).get("paired", {})
    return (paired[name], "median over the rounds, each slice over one worker's slices "
                          "just before and just after it") if name in paired else (None, "")


def _startup(results: dict[str, Any]) -> tuple[float | None, str]:
    """``queue-core --help`` over a bare Python start (``bench.startup``)."""
    times = results.get("startup")
    if not times:
        return None, ""
    return (times["help_s"] / times["bare_s"],
            f"{times['help_s'] * 1000:.0f} ms vs {times['bare_s'] * 1000:.0f} ms")


def _id_check(results: dict[str, Any]) -> tuple[float | None, str]:
    """The general rule's CHECK per PostgreSQL state change, over the bare UPDATE."""
    costs = (results.get("id_check") or {}).get("postgres")
    if not costs:
        return None, ""
    return (costs["general"] / costs["none"],
            f"{costs['general']:+.2f} us on {costs['none']:.2f} us; "
            f"course {costs['course']:+.2f} us")


def _against_peer(results: dict[str, Any] | None, ours: str, durable: bool
                  ) -> tuple[float | None, str]:
    """Our case over the fastest SQLite peer of that durability, consumer side."""
    if not results or ours not in results.get("vs_raw", {}):
        return None, ""
    peer = fastest(results, "sqlite", durable)
    if peer is None:
        return None, ""
    return results["vs_raw"][ours] / peer["vs_raw"], f"{peer['peer']} {peer['synchronous']}"


def fastest_same_work(results: dict[str, Any] | None, store: str) -> dict[str, Any] | None:
    """The fastest peer of ``store`` on the same work as ours, consumer side."""
    chosen = [peer for peer in (results or {}).get("same_work", []) if peer["store"] == store]
    return max(chosen, key=lambda peer: peer["vs_raw"]) if chosen else None


def _against_same_work(results: dict[str, Any] | None, ours: str, store: str
                       ) -> tuple[float | None, str]:
    """Our worker loop over the fastest peer of ``store`` on the same work, consumer side."""
    peer = fastest_same_work(results, store)
    if results is None or peer is None or ours not in results.get("vs_raw", {}):
        return None, ""
    return (results["vs_raw"][ours] / peer["vs_raw"],
            f"{peer['peer']} {peer['synchronous']} + effect {peer['effects_synchronous']}")


def _pg_peer(results: dict[str, Any], name: str) -> tuple[float | None, str]:
    peer = next((p for p in results.get("peers", []) if p["peer"] == name), None)
    if peer is None or "pg_single_1" not in results["e2e_vs_raw"]:
        return None, ""
    return results["e2e_vs_raw"]["pg_single_1"] / peer["e2e_vs_raw"], f"{name} {peer['synchronous']}"


def _fsyncs(results: dict[str, Any]) -> tuple[float | None, str]:
    counted = results.get("fsyncs")
    return (None, "") if not counted or counted[0] is None else (counted[0], "")


def _steady(results: dict[str, Any]) -> dict[str, Any]:
    return dict((results.get("lifetime") or {}).get("steady") or {})


def on_disk(sizes: dict[str, int], wal: str = "wal") -> int:
    """A queue file's bytes on disk: the file and its ``-wal`` (``wal_rest``: after
    the first commit since the last checkpoint)."""
    return int(sizes["file"] + sizes[wal])


def _file_size(results: dict[str, Any]) -> tuple[float | None, str]:
    """The pruned file + its -wal over the unpruned one's, after the same steady load."""
    steady = _steady(results)
    if not steady:
        return None, ""
    files = steady["files"]
    return (on_disk(files["pruned"]) / on_disk(files["unpruned"]),
            f"{on_disk(files['pruned']) / 1e6:.1f} MB vs {on_disk(files['unpruned']) / 1e6:.1f} MB")


def _kept_per_event(results: dict[str, Any]) -> tuple[float | None, str]:
    kept = _steady(results).get("kept")
    return (None, "") if not kept else (kept["per_event"], f"{kept['pruned']:,} pruned")


def _longest_prune_ms(results: dict[str, Any]) -> tuple[float | None, str]:
    hold = (results.get("lifetime") or {}).get("hold")
    if not hold:
        return None, ""
    return hold["held_s"] * 1000, (
        f"{hold['batches']} batches pruning {hold['messages']:,} messages; while the freed "
        f"pages were given back after them the probe waited at most "
        f"{hold['give_back_held_s'] * 1000:.1f} ms; the batches' longest from BEGIN IMMEDIATE "
        f"to the end of the commit call, a checkpoint run in that call after the lock's "
        f"release included: {hold['longest_call_s'] * 1000:.1f} ms")


def _prune_beside(results: dict[str, Any]) -> tuple[float | None, str]:
    """The worker's rate with the pruning process beside it over without; whether the
    prune kept up while the worker ran (the figure's premise) is said beside it."""
    value, _ = _paired(results, "single_pruned")
    beside = (results.get("lifetime") or {}).get("beside")
    if value is None or not beside:
        return value, ""
    return value, (f"the prune kept up: {'yes' if beside['kept_up'] else 'NO'}, it pruned "
                   f"{beside['during']:,} of the {beside['consumed']:,} messages while the "
                   f"worker ran, at most {beside['backlog_max']:,} behind")


def _step_cost(results: dict[str, Any], store: str) -> tuple[float | None, str]:
    """The worker loop's step with priorities 0-9 over without, on ``store``: the median
    of the rounds (``bench_priority.step_costs``), each rate beside it."""
    found = (results.get("priority_costs") or {}).get(store)
    if not found:
        return None, ""
    rates = found["rates"]
    return found["ratio"], (f"{rates['mixed']:.0f} vs {rates['plain']:.0f} steps/s over all "
                            f"{found['rounds']} rounds of {found['steps']} steps each")


def _starvation(results: dict[str, Any]) -> tuple[float | None, str]:
    """A low priority's longest wait over the bound the engine states for it, on a
    model clock (``bench_priority``); what strict priority gives on the same load."""
    found = results.get("starvation")
    if not found:
        return None, ""
    value, worst = starvation_figure(found)
    waited = (f"{worst['wait']} s" if worst["wait"] is not None
              else f"still waiting after {worst['waiting']} s")
    strict = "; ".join(f"{s['waiting']} of {s['lows']} still waiting after {s['seconds']:,} s "
                       f"(the oldest for {s['longest']:,} s)" for s in found["strict"])
    return value, (f"{found['urgent_per_second']} urgent a second, workers at {found['rate']} a "
                   f"second: {worst['event_id']} waited {waited}, its bound "
                   f"{worst['bound']:g} s; strict priority on the same load: {strict}")


# (name, what it compares, figure, bound, at least (True) or at most (False))
TARGETS: list[tuple[str, str, Callable[[dict[str, Any]], tuple[float | None, str]], float,
                    bool]] = [
    ("SQLite single vs fastest fsyncing peer, 2 ms flush",
     "consumer side, ours FULL* vs a peer whose every commit fsyncs, slow-disk regime",
     lambda r: _against_peer(r.get("slow"), "single", True), 0.97, True),
    ("SQLite single vs fastest fsyncing peer",
     "consumer side, ours FULL* vs a peer whose every commit fsyncs, this machine's flush",
     lambda r: _against_peer(r, "single", True), 0.8, True),
    ("SQLite single NORMAL vs fastest NORMAL peer",
     "consumer side, both synchronous=NORMAL (our option), this machine's flush",
     lambda r: _against_peer(r, "single_normal", False), 1.0, True),
    ("SQLite K=100 vs fastest fsyncing peer",
     "consumer side, ours FULL* batches of 100 vs a peer one at a time, this machine's flush",
     lambda r: _against_peer(r, "batch_100", True), 8.0, True),
    ("SQLite single vs fastest peer, same work, 2 ms flush",
     "consumer side, ours FULL* (the worker loop, the effect in the ACK's commit) vs a peer's "
     "get, its effect's own commit, ack, every commit fsynced, slow-disk regime",
     lambda r: _against_same_work(r.get("slow"), "single", "sqlite"), 1.9, True),
    ("SQLite single vs fastest peer, same work",
     "consumer side, ours FULL* (the worker loop, the effect in the ACK's commit) vs a peer's "
     "get, its effect's own commit, ack, every commit fsynced, this machine's flush",
     lambda r: _against_same_work(r, "single", "sqlite"), 1.4, True),
    ("queue-core --help vs a bare Python start",
     "medians of interleaved starts, this interpreter; the engine is not loaded for --help",
     _startup, 3.0, False),
    ("general id CHECK per state change vs the UPDATE's own work, PostgreSQL",
     "what the CHECK of a general queue's ids adds to an UPDATE of a row's state, over that "
     "UPDATE without it (SQLite never evaluates it there: bench_idcheck)", _id_check, 0.5, False),
    ("fsyncs per consumed message (strace)",
     "drain, one message at a time, FULL*", _fsyncs, 1.05, False),
    ("single consume vs raw commits, 2 ms flush",
     "consumer side, ours FULL* vs one fsynced single-row commit, slow-disk regime",
     lambda r: _ratio(r.get("slow"), "single", "raw"), 0.95, True),
    ("PostgreSQL single vs PostgreSQL raw commits",
     "consumer side, synchronous_commit=on both", lambda r: _ratio(r, "pg_single_1", "pg_raw"),
     0.45, True),
    ("PostgreSQL single vs pgqueuer",
     "end to end, both one job per commit, same server",
     lambda r: _pg_peer(r, "pgqueuer"), 1.3, True),
    ("PostgreSQL single vs procrastinate",
     "end to end, both one job per commit, same server",
     lambda r: _pg_peer(r, "procrastinate"), 1.0, True),
    ("PostgreSQL single vs fastest peer, same work",
     "consumer side, ours vs a peer's get, its effect's own commit in the same database, ack; "
     "synchronous_commit=on, same server", lambda r: _against_same_work(r, "pg_single_1",
                                                                        "postgres"), 1.6, True),
    ("PostgreSQL 2 worker processes vs 1", "consumer side, single message",
     lambda r: _ratio(r, "pg_single_2", "pg_single_1"), 1.8, True),
    # One writer at a time: the commit is the limit, and a waiting writer polls for
    # the lock instead of sleeping in SQLite's busy handler, letting a busy holder go
    # on (``sqlite.connection.begin_immediate``), so more workers neither add nor
    # lose much. 4 processes on 2 cores is the case to watch.
    ("SQLite 2 worker processes vs 1", "consumer side, single message, one writer at a time",
     lambda r: _paired(r, "two_workers"), 0.95, True),
    ("SQLite 4 worker processes vs 1", "consumer side, single message, one writer at a time",
     lambda r: _paired(r, "four_workers"), 0.95, True),
    ("SQLite 100,000 queued vs 1,000", "consumer side, single message",
     lambda r: _ratio(r, "size_100000", "size_1000"), 0.9, True),
    ("file + -wal after a steady load, pruned vs not",
     "the same events of 2 KB processed in rolling windows, pruned after each (the last two "
     "windows kept whole) or never; -wal at its high-water mark, the engine's settings",
     _file_size, 0.25, False),
    ("bytes kept per pruned event (dbstat pages)",
     "key, digest, effect and compacted record: the pages of messages, its key index, effects "
     "and compacted over the messages pruned", _kept_per_event, 200.0, False),
    ("single consume, prune beside vs without",
     "consumer side, ours FULL* with a process running prune(0) every 20 ms beside the worker "
     "vs the same case without it just before and just after", _prune_beside, 0.9, True),
    ("longest prune hold of the write lock, ms",
     f"prune(0) of done messages of 2 KB in batches of at most {PRUNE_BATCH}, committed as the "
     "package commits them (written, not fsynced), no other writer but a probe that takes "
     "and releases the write lock in a loop: the longest the probe waited for the lock while "
     "the batches ran (the hold as a worker beside would meet it; two batches in a row can "
     "make one wait)",
     _longest_prune_ms,
     10.0, False),
    ("SQLite worker-loop step, priorities 0-9 vs all 0",
     "ACK + claim of the next in one transaction, FULL*, on the same events each at priority "
     "i % 10 vs every one at 0, step for step in turn; median of the rounds",
     lambda r: _step_cost(r, "sqlite"), 0.95, True),
    ("PostgreSQL worker-loop step, priorities 0-9 vs all 0",
     "the step function (ACK + claim of the next), synchronous_commit=on, on the same events "
     "each at priority i % 10 vs every one at 0, step for step in turn; median of the rounds",
     lambda r: _step_cost(r, "postgres"), 0.95, True),
    ("longest low-priority wait vs its stated bound",
     "model clock: priority 0 messages under a steady load of priority 9 at the workers' whole "
     "rate; each wait over priority.wait_bound(0, messages keyed before it when due, urgent a "
     "second, rate), the largest", _starvation, 1.0, False),
]


def evaluate(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Every target with its figure from this run (``None``: not measured here)."""
    rows = []
    for name, compares, figure, bound, at_least in TARGETS:
        value, against = figure(results)
        met = None if value is None else (value >= bound if at_least else value <= bound)
        rows.append({"name": name, "compares": compares, "value": value, "bound": bound,
                     "at_least": at_least, "met": met, "against": against})
    return rows
