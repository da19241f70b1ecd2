"""The figures of ``scale.py``: targets and verdicts, the printed report, the picture."""

from __future__ import annotations

import os
import statistics
from pathlib import Path
from typing import Any

STORES = ("postgres", "sqlite")
NAMES = {"postgres": "PostgreSQL", "sqlite": "SQLite"}
# A message is one durable commit, as a raw commit is; PostgreSQL's single
# message is held to 0.45 of its raw commits in make bench, and here with prune
# beside. SQLite's claim commits without a flush; half the raw rate leaves the
# engine's CPU (parsing, checks, journal) as much time as the flush.
VS_RAW = {"postgres": 0.45, "sqlite": 0.5}
P99_S = 0.1  # claim to ACK; a lease is 30 s, so this is far from a redelivery
RSS_MB = 150.0
FLAT = (2.0, 2)  # the claim's work at the end at most 2x its start, plus 2
FULL_RUN_S = 15 * 60


def bytes_per_event(samples: list[dict[str, Any]], key: str = "file") -> float | None:
    """The steady growth of ``key`` per event done: between the first settled
    sample after the first phase and the last settled one (a control queue's
    first chunk, and its start-up, left out)."""
    settled = [s for s in samples if s["settled"] and s["done"] > 0]
    if len(settled) < 2 or settled[-1]["done"] == settled[0]["done"]:
        return None
    first, last = settled[0], settled[-1]
    return (last[key] - first[key]) / (last["done"] - first["done"])


def claim_ends(samples: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The first and the last sample of the last phase taken while messages were
    ready and its workers ran: the same number of workers and of leases held, the
    events done from about half the run to its end. (A claim's work is judged
    while it has something to claim; the expired-lease read steps over each lease
    held, so phases with other worker counts are not compared.)"""
    last = max((s["phase"] for s in samples), default=0)
    busy = [s for s in samples if s["ready"] > 0 and s["phase"] == last and not s["settled"]]
    busy = busy[1:] or busy  # the first was taken before the workers started
    return (busy[0], busy[-1]) if busy else None


def cpu_ms(phase: dict[str, Any]) -> float:
    """Milliseconds of this machine's CPU (every core, every process on it: the
    workers, the server, the pruner, and whatever else ran) per message."""
    return phase["cpu_busy"] * (os.cpu_count() or 1) * phase["seconds"] / phase["events"] * 1e3


def _flat(start: int, end: int) -> bool:
    return end <= FLAT[0] * start + FLAT[1]


def verdicts(results: dict[str, Any]) -> dict[str, bool | None]:
    """Every target's verdict (``None``: not measured in this run)."""
    judged: dict[str, bool | None] = {}
    for store in STORES:
        found = results.get(store)
        if not found:
            continue
        name = NAMES[store]
        for phase in found["phases"]:
            n = phase["workers"]
            judged[f"{name} {n} worker(s) vs raw commits of {n} client(s) >= "
                   f"{VS_RAW[store]}"] = phase["vs_raw"] >= VS_RAW[store]
            judged[f"{name} {n} worker(s) claim-to-ACK p99 <= {P99_S * 1e3:.0f} ms"] = \
                phase["p99_s"] <= P99_S
        judged[f"{name} worker peak RSS < {RSS_MB:.0f} MB"] = \
            max(p["peak_rss_mb"] for p in found["phases"] + found["control"]) < RSS_MB
        pruned, unpruned = bytes_per_event(found["samples"]), bytes_per_event(
            found["control_samples"])
        judged[f"{name} bytes per event, pruned below not pruned"] = (
            None if pruned is None or not unpruned else pruned < unpruned)
        # The due read steps over what lies before the first ready message, which
        # grows with history if anything does: judged from the run's first claim
        # with messages ready to the last phase's last. The expired-lease read steps
        # over each lease held, so it is judged within the last phase (one worker count).
        ends = claim_ends(found["samples"])
        busy = [s for s in found["samples"] if s["ready"] > 0 and not s["settled"]]
        judged[f"{name} claim's due read flat over the run (end <= {FLAT[0]:g}x start + "
               f"{FLAT[1]})"] = (None if ends is None or not busy
                                 else _flat(busy[0]["claim_due"], ends[1]["claim_due"]))
        judged[f"{name} claim's expired read flat in the last phase (end <= {FLAT[0]:g}x "
               f"start + {FLAT[1]})"] = (None if ends is None else _flat(
                   ends[0]["claim_expired"], ends[1]["claim_expired"]))
        judged[f"{name} prune beside the workers ran to the end"] = \
            "died" not in found.get("prune", {})
        judged[f"{name} audit exact"] = True  # a failed audit raised before any report
    # The 15 minutes are the whole full run's, both stores: a run of one store
    # (``--only``) does not judge them, and one whose PostgreSQL could not start
    # has not measured them
    if results["plan"]["pg_events"] >= 1_000_000:
        if all(results.get(s) for s in STORES):
            judged[f"full run <= {FULL_RUN_S // 60} min"] = results["seconds"] <= FULL_RUN_S
        elif results.get("postgres_skipped"):
            judged[f"full run <= {FULL_RUN_S // 60} min"] = None
    return judged


def _mark(ok: bool | None) -> str:
    return {True: "met", False: "MISSED", None: "not measured"}[ok]


def _store_lines(store: str, found: dict[str, Any]) -> list[str]:
    name, unit = NAMES[store], ("buffers" if store == "postgres" else "VM instructions")
    lines = [f"{name}: {sum(p['events'] for p in found['phases']):,} general events, prune "
             "beside the workers",
             "  workers   events    msg/s  raw/s (same clients)  vs raw  x1 worker  CPU busy  "
             "CPU ms/msg  p50 ms  p99 ms  peak RSS MB"]
    one = found["phases"][0]["rate"]
    for p in found["phases"]:
        raw = (p["raw_before"] + p["raw_after"]) / 2
        lines.append(f"  {p['workers']:>7} {p['events']:>8,} {p['rate']:>8,.0f} {raw:>21,.0f} "
                     f"{p['vs_raw']:>7.2f} {p['rate'] / one:>10.2f} {p['cpu_busy']:>9.0%} "
                     f"{cpu_ms(p):>11.2f} "
                     f"{p['p50_s'] * 1e3:>7.1f} {p['p99_s'] * 1e3:>7.1f} "
                     f"{p['peak_rss_mb']:>12.1f}")
    for p in found["control"][:1]:
        rate = sum(c["events"] for c in found["control"]) / sum(c["seconds"]
                                                                for c in found["control"])
        vs = sum(c["vs_raw"] for c in found["control"]) / len(found["control"])
        lines.append(f"  control, no prune: {p['workers']} workers, "
                     f"{sum(c['events'] for c in found['control']):,} events: {rate:,.0f}/s, "
                     f"{vs:.2f} of raw commits")
    worst = max(found["phases"] + found["control"], key=lambda p: p["peak_rss_mb"])
    held = worst["rss_holding_mb"] - worst["rss_before_mb"]
    lines.append(f"  worker memory: peak {worst['peak_rss_mb']:.1f} MB (VmHWM; ru_maxrss says "
                 f"{worst['ru_maxrss_mb']:.1f} MB, the parent's peak carried over exec); "
                 f"{held:.1f} MB more after "
                 f"its loop than before it, holding drain's list of {worst['most_held']:,} "
                 f"outcomes ({held * 2 ** 20 / max(1, worst['most_held']):,.0f} bytes each); "
                 f"{worst['rss_after_mb']:.1f} MB once that list is dropped")
    pruned = bytes_per_event(found["samples"])
    unpruned = bytes_per_event(found["control_samples"])
    for key, label, events in (("relations", "pruned", found["audit"]["events"]),
                               ("control_relations", "not pruned",
                                found["control_audit"]["events"])):
        parts = ", ".join(f"{name} {size / events:,.0f}"
                          for name, size in list(found.get(key, {}).items())[:6])
        lines.append(f"  bytes per event at the end, {label}, by table and index: {parts}")
    last = [s for s in found["samples"] if s["settled"]][-1]
    lines.append(f"  size at the end, pruned: tables {last['table'] / 2 ** 20:,.1f} MB, indexes "
                 f"{last['index'] / 2 ** 20:,.1f} MB, "
                 + (f"file + -wal {last['file'] / 2 ** 20:,.1f} MB" if store == "sqlite"
                    else "together") + f", after {last['done']:,} events")
    lines.append("  bytes per event over the steady part: pruned "
                 + ("n/a" if pruned is None else f"{pruned:,.0f}") + ", not pruned "
                 + ("n/a" if unpruned is None else f"{unpruned:,.0f}"))
    ends = claim_ends(found["samples"])
    busy = [s for s in found["samples"] if s["ready"] > 0]
    if busy:
        lines.append(f"  the claim's reads over the run, {unit} per claim: due "
                     f"{busy[0]['claim_due']} at the start, median "
                     f"{statistics.median(s['claim_due'] for s in busy):g}, max "
                     f"{max(s['claim_due'] for s in busy)}; expired leases "
                     f"{busy[0]['claim_expired']} at the start, median "
                     f"{statistics.median(s['claim_expired'] for s in busy):g}, max "
                     f"{max(s['claim_expired'] for s in busy)}")
    if ends is not None:
        lines.append(f"  in the last phase ({ends[0]['done']:,} -> {ends[1]['done']:,} events "
                     f"done): due {ends[0]['claim_due']} -> {ends[1]['claim_due']}, expired "
                     f"leases {ends[0]['claim_expired']} -> {ends[1]['claim_expired']}")
    if ends is not None and "dead_tuples" in ends[0]:
        lines.append("  messages, last phase: dead row versions not yet vacuumed "
                     f"{ends[0]['dead_tuples']:,} -> {ends[1]['dead_tuples']:,}, vacuums "
                     f"{ends[0]['vacuums']} -> {ends[1]['vacuums']}, messages_live index "
                     f"{ends[0]['live_index_pages']:,} -> {ends[1]['live_index_pages']:,} pages, "
                     f"HOT updates {ends[1]['hot_updates']:,} of {ends[1]['updates']:,}")
        ready = [s for s in busy if not s["settled"]] or ends
        lines.append(f"  messages, whole run: {found['samples'][-1]['vacuums']} vacuums; while "
                     f"messages were ready, dead row versions not yet vacuumed median "
                     f"{statistics.median(s['dead_tuples'] for s in ready):,.0f}, max "
                     f"{max(s['dead_tuples'] for s in ready):,}")
    test = found.get("vacuum_test")
    if test:
        b, v = test["before"], test["after"]
        lines.append(f"  at the end, nothing ready: due read {b['due']} buffers, expired "
                     f"{b['expired']}, with {b['dead_tuples']:,} dead row versions; after "
                     f"VACUUM messages ({test['vacuum_s']:.1f} s): due {v['due']}, "
                     f"expired {v['expired']}, {v['dead_tuples']:,} dead")
    a = found["audit"]
    lines.append(f"  audit: {a['events']:,} events, states {a['states']}, {a['effects']:,} "
                 f"effects, money {a['money']:,} (wanted {a['money_wanted']:,}), "
                 f"{a['pruned']:,} pruned, findings: {a['findings'] or 'none'} "
                 f"({a['seconds']:.1f} s)")
    prune = found.get("prune", {})
    if "died" in prune:
        lines.append(f"  PRUNER DIED after {prune['messages']:,} pruned: {prune['died']}")
    elif prune:
        lines.append(f"  pruner: {prune['messages']:,} pruned in {prune['calls']:,} calls, "
                     f"longest batch {prune['longest_s'] * 1e3:.1f} ms"
                     + (f"; {prune['vacuums']} VACUUM messages, {prune['vacuum_s']:.1f} s in all"
                        if prune.get("vacuums") else ""))
    return lines


def knee(phases: list[dict[str, Any]]) -> str:
    """Where adding workers stops adding throughput (less than 10 % more)."""
    for before, after in zip(phases, phases[1:]):
        if after["rate"] < 1.1 * before["rate"]:
            return (f"the curve flattens after {before['workers']} worker(s): "
                    f"{after['workers']} give {after['rate'] / before['rate']:.2f}x "
                    f"(CPU {before['cpu_busy']:.0%} -> {after['cpu_busy']:.0%} busy)")
    return "throughput still grows at the largest worker count measured"


def report(results: dict[str, Any], judged: dict[str, bool | None]) -> list[str]:
    events = " and ".join(f"{results['plan'][f'{short}_events']:,} {NAMES[store]}"
                          for store, short in (("postgres", "pg"), ("sqlite", "sqlite"))
                          if results.get(store)) or "no"
    lines = [f"make scale: {events} events, this machine, {results['seconds']:.0f} s in all",
             "every ACK and raw commit is fsynced (SQLite FULL, PostgreSQL synchronous_commit "
             "on); SQLite's claims commit without a flush of their own, as the package does"]
    if results["plan"].get("vacuum_every"):
        lines.append(f"TRIAL, not the package's behaviour: the pruner ran VACUUM messages on "
                     f"PostgreSQL after every {results['plan']['vacuum_every']:,} messages pruned")
    if results.get("naptime"):
        lines.append(f"PostgreSQL's autovacuum_naptime: {results['naptime']['seconds']} s ("
                     + ("set on this run's private server as README advises for a server "
                        "that serves a busy queue; PostgreSQL's default is 60 s"
                        if results["naptime"]["set"] else "the server's own setting") + ")")
    for store in STORES:
        if results.get(store):
            lines += ["", *_store_lines(store, results[store])]
            lines.append(f"  {knee(results[store]['phases'])}")
    if results.get("postgres_skipped"):
        lines += ["", f"PostgreSQL not measured: {results['postgres_skipped']}"]
    lines += ["", "targets:"]
    lines += [f"  {_mark(ok):<12} {name}" for name, ok in judged.items()]
    return lines


def picture(results: dict[str, Any], path: Path) -> Path:
    """Throughput and p99 against worker count, and size against events done,
    pruned and not, per store; saved as a PNG at ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stores = [s for s in STORES if results.get(s)]
    fig, axes = plt.subplots(len(stores), 3, figsize=(17, 4.4 * max(1, len(stores))),
                             squeeze=False)
    for row, store in zip(axes, stores):
        found, name = results[store], NAMES[store]
        phases = found["phases"]
        counts = [p["workers"] for p in phases]
        ax = row[0]
        ax.plot(counts, [p["rate"] for p in phases], "o-", color="tab:blue",
                label="queue, prune beside")
        ax.plot(counts, [(p["raw_before"] + p["raw_after"]) / 2 for p in phases], "s--",
                color="tab:gray", label="raw commits, same clients")
        ax.set_xscale("log", base=2)
        ax.set_xticks(counts, [str(n) for n in counts])
        ax.set_xlabel("worker processes")
        ax.set_ylabel("messages (commits) per second")
        ax.set_ylim(bottom=0)
        ax.set_title(f"{name}: throughput and p99 claim-to-ACK")
        twin = ax.twinx()
        twin.plot(counts, [p["p99_s"] * 1e3 for p in phases], "^:", color="tab:red",
                  label="p99 claim to ACK (ms)")
        twin.set_ylabel("p99 claim to ACK, ms", color="tab:red")
        twin.set_ylim(bottom=0)
        # room above the points for the legend: where the rate fell as workers were
        # added, its first points sat at the top left, under the legend
        for axis in (ax, twin):
            axis.set_ylim(0, axis.get_ylim()[1] * 1.3)
        handles = ax.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
        ax.legend(handles, [h.get_label() for h in handles], loc="upper left", fontsize=8)
        ax = row[1]
        for samples, label, style in ((found["samples"], "pruned (retention "
                                       f"{results['plan']['retention_s']} s)", "-"),
                                      (found["control_samples"], "not pruned", "--")):
            xs = [s["done"] for s in samples]
            ax.plot(xs, [(s["table"] + s["index"]) / 2 ** 20 for s in samples], style,
                    label=f"tables + indexes, {label}")
        slope, end = bytes_per_event(found["control_samples"], "table"), found["samples"][-1]
        index_slope = bytes_per_event(found["control_samples"], "index")
        if slope is not None and index_slope is not None:
            ax.plot([0, end["done"]], [0, (slope + index_slope) * end["done"] / 2 ** 20], ":",
                    color="tab:orange", label="not pruned: its measured bytes per event, "
                    "extended")
        ax.set_xlabel("events done")
        ax.set_ylabel("MB")
        ax.set_ylim(bottom=0)
        ax.set_title(f"{name}: size over the run (each phase enqueues first)")
        ax.legend(fontsize=8)
        ax = row[2]
        busy = [s for s in found["samples"] if s["ready"] > 0 and not s["settled"]]
        unit = "buffers" if store == "postgres" else "VM instructions"
        for read, style in (("due", "o-"), ("expired", "s--")):
            ax.plot([s["done"] for s in busy], [s[f"claim_{read}"] for s in busy], style,
                    markersize=3, label=f"{read} read")
        ax.set_xlabel("events done")
        ax.set_ylabel(f"{unit} per claim")
        ax.set_ylim(bottom=0)
        ax.set_title(f"{name}: the claim's reads as events pass")
        ax.legend(fontsize=8)
    fig.suptitle("make scale on this machine (2 cores, shared): figures of one run")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
