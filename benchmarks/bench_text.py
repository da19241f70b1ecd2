"""The words of ``bench.py``'s report: each regime's table, the notes, safety, targets."""

from __future__ import annotations

import statistics
from typing import Any

import bench_idcheck
from bench_report import evaluate, on_disk
from peer_safety import describe
from queue_core.queue import PRUNE_BATCH

WORKER_COUNTS = (1, 2, 4)
MEMORY_LIMIT_MB = 150.0
LEGEND = [
    "consume/s = the consumer side: our claim + ACK through drain (effect and ACK in one "
    "transaction), a peer's get + ack; the queue was filled beforehand",
    "e2e/s = end to end: the same slice with its producer (producer: 1 per commit, or our "
    "JSONL batch of up to 1,000 events per commit); x raw = against the raw commits of the "
    "same store measured right around each slice",
    "durability: journal and synchronous setting read back from each connection; FULL* = "
    "ours: every commit a caller is told is durable is fsynced, a claim commits without an "
    "fsync of its own",
]


def regime_table(results: dict[str, Any], title: str) -> list[str]:
    """One row per case of one regime: rates, ratios, fsyncs per message where counted."""
    rates, e2e = results["rates"], results["end_to_end"]
    vs_raw, e2e_raw, flushes = results["vs_raw"], results["e2e_vs_raw"], results["flushes"]
    raw_ms = 1000 / rates["raw"]
    low, high = results["raw_range"]
    lines = [f"regime: {title}; a raw SQLite commit took {raw_ms:.2f} ms (median), its slices "
             f"ran from {low:.0f} to {high:.0f} commits/s",
             f"{'case':<44}{'durability':<31}{'producer':<13}{'consume/s':>10}{'x raw':>7}"
             f"{'e2e/s':>8}{'x raw':>7}{'fsyncs':>7}{'ours/it':>8}"]
    peer_of = {peer["name"]: peer for peer in results.get("peers", [])}
    same_work = {peer["name"] for peer in results.get("same_work", [])}  # their own table
    for name, rate in rates.items():
        if name in same_work:
            continue
        counted = flushes.get(name)
        theirs = ""
        if name in peer_of:
            ours = ours_beside(peer_of[name], vs_raw)
            if ours in vs_raw:
                theirs = f"{vs_raw[ours] / vs_raw[name]:.2f}"
        lines.append(f"{results['labels'][name][:43]:<44}{results['durability'][name][:30]:<31}"
                     f"{results['producers'][name]:<13}{rate:>10.0f}{vs_raw[name]:>7.2f}"
                     f"{e2e[name]:>8.0f}{e2e_raw[name]:>7.2f}"
                     f"{'' if counted is None else f'{counted:.2f}':>7}{theirs:>8}")
    if "pg_raw" in rates:
        lines.append(f"PostgreSQL rows: x raw = against PostgreSQL's own raw commits "
                     f"(synchronous_commit=on; median {rates['pg_raw']:.0f} commits/s); "
                     "ours/it = ours pg single message over the peer, consumer side")
    return lines


SAME_WORK_LEGEND = [
    "same work: a peer's consumer gets a message, commits its effect in the application's own "
    "database (an effects table keyed by the event id: INSERT ... ON CONFLICT DO NOTHING, a "
    "commit of its own; SQLite: a file of its own, WAL, synchronous=FULL; PostgreSQL: a table "
    "in the same database, on a connection of its own), then acks; ours is the worker loop, "
    "whose effect is in the ACK's transaction",
    "durability alike: every commit a caller relies on waits for a flush on both sides (ours "
    "FULL*; a peer's queue at FULL or synchronous_commit=on, and its effects' commit too), "
    "read back from each connection; ours/it = our worker loop on that store over the peer on "
    "the same work, consumer side",
    "guarantee: exactly once = the effect and the ACK in one transaction, fenced by the lease; "
    "at least once, deduped = the effect commits before the ack, so a consumer that dies "
    "between them has the message delivered again and the effect's key adds nothing; at most "
    "once = the library deletes the message before the work runs, so a crash after the get "
    "loses it",
]
OURS_SAME_WORK = {"single": "ours, the worker loop", "pg_single_1": "ours pg, the worker loop"}


def same_work_table(results: dict[str, Any], title: str) -> list[str]:
    """One row per peer on the same work as ours (its effect committed, then acked),
    beside our worker loop on each store; what each then guarantees."""
    peers = results.get("same_work", [])
    if not peers:
        return []
    rates, e2e = results["rates"], results["end_to_end"]
    vs_raw, e2e_raw, flushes = results["vs_raw"], results["e2e_vs_raw"], results["flushes"]
    lines = [f"peers on the same work, regime: {title} (each peer also commits the effect, then "
             "acks)",
             f"{'case':<34}{'queue durability':<27}{'effects':<12}{'consume/s':>10}{'x raw':>7}"
             f"{'e2e/s':>8}{'x raw':>7}{'fsyncs':>7}{'ours/it':>8}  guarantee"]

    def row(name: str, label: str, queue: str, effects: str, ours: str, guarantee: str) -> str:
        counted = flushes.get(name)
        theirs = f"{vs_raw[ours] / vs_raw[name]:.2f}" if ours in vs_raw and ours != name else ""
        return (f"{label[:33]:<34}{queue[:26]:<27}{effects[:11]:<12}{rates[name]:>10.0f}"
                f"{vs_raw[name]:>7.2f}{e2e[name]:>8.0f}{e2e_raw[name]:>7.2f}"
                f"{'' if counted is None else f'{counted:.2f}':>7}{theirs:>8}  {guarantee}")
    for store, ours in (("sqlite", "single"), ("postgres", "pg_single_1")):
        beside = [peer for peer in peers if peer["store"] == store]
        if not beside:
            continue
        if ours in rates:
            lines.append(row(ours, OURS_SAME_WORK[ours], results["durability"][ours],
                             "in its ACK", ours, "exactly once"))
        for peer in beside:
            queue = peer["durability"].split("; effects")[0]
            lines.append(row(peer["name"], peer["label"], queue,
                             f"{peer['effects_journal_mode']}, {peer['effects_synchronous']}",
                             ours, peer["guarantee"]))
    return lines


def same_work_notes(results: dict[str, Any]) -> list[str]:
    """What each peer's guarantee on the same work rests on, with this run's crash probe."""
    peers = {peer["peer"]: peer for peer in results.get("same_work", [])}
    if not peers:
        return []
    probes = {**results.get("safety", {}), **results.get("pg_safety", {})}
    lines = ["", *SAME_WORK_LEGEND, "what each peer on the same work guarantees, and why:"]
    for name, peer in peers.items():
        crash = probes.get(name, {}).get("crash")
        seen = f" (this run's crash probe, a consumer killed between get and ack: {crash})" \
            if crash else ""
        lines.append(f"  {name}: {peer['guarantee']}: {peer['guarantee_why']}{seen}")
    return lines


def ours_beside(peer: dict[str, Any], vs_raw: dict[str, float]) -> str:
    """Our case at the peer's durability: single message on its store, NORMAL beside NORMAL."""
    if peer.get("store", "sqlite") == "postgres":
        return "pg_single_1"
    return "single_normal" if peer["synchronous"] == "NORMAL" and "single_normal" in vs_raw \
        else "single"


def notes(results: dict[str, Any]) -> list[str]:
    """What the tables mean, and the figures with no target."""
    vs_raw = results["vs_raw"]
    lines = ["", *LEGEND, "fsyncs = fsync + fdatasync calls per consumed message, counted by "
             "the slow-disk shim in the consuming process; ours/it = our single message at the "
             "peer's durability (FULL* beside FULL, NORMAL beside NORMAL) over the peer, "
             "consumer side"]
    lines += scaling(results)
    shim = (results.get("slow") or {}).get("shim")
    if shim:
        lines.append(f"slow-disk shim: an fdatasync took {shim['flush_ms']:.2f} ms under it "
                     f"against {shim['native_ms']:.2f} ms without (delay {shim['delay_ms']:g} ms "
                     f"added), and it counted {shim['per_raw_commit']:.2f} flushes per raw commit")
    if "bare" in vs_raw and "single" in vs_raw:
        lines.append(f"for scale, no target: single-message mode reaches "
                     f"{vs_raw['single'] / vs_raw['bare']:.2f} of the bare two-commit protocol "
                     "(no journal, no CHECKs, no fence read), which reaches "
                     f"{vs_raw['bare']:.2f} of the raw limit")
    if "batch_100" in vs_raw and "single" in vs_raw:
        lines.append(f"for scale, no target: K=100 runs {vs_raw['batch_100'] / vs_raw['single']:.1f}"
                     "x single-message mode on the consumer side")
    if results.get("memory") is not None:
        messages, mb = results["memory"]
        verdict = "ok" if mb < MEMORY_LIMIT_MB else "ABOVE LIMIT"
        lines.append(f"peak RSS of the worker process that claimed and completed all "
                     f"{messages:,} messages of the largest queue: {mb:.0f} MB "
                     f"(limit {MEMORY_LIMIT_MB:.0f} MB) {verdict}; this process (it filled the "
                     f"queues): {results['parent_rss_mb']:.0f} MB")
    slices = results["slices"] + (results.get("slow") or {}).get("slices", 0)
    lines.append(f"exactly-once: checked after each of {slices} slices (ours: the shared audit, "
                 "one effect per done event, each equal to its payload, a legal journal; a peer: "
                 "every item put came back once, on PostgreSQL its own tables count every job "
                 "acknowledged once and none pending, and on the same work the application's "
                 "effects table holds one effect per event put, its category and amount exact)")
    counted = results.get("fsyncs")
    if counted is not None:
        lines.append("fsyncs per message (strace): not counted here (strace is missing or not "
                     "allowed)" if None in counted else
                     f"fsyncs per message (strace, drain one at a time): {counted[0]:.2f} at the "
                     f"default, {counted[1]:.2f} with fsync_claims=True")
    if "single_normal" in vs_raw and "single" in vs_raw:
        lines.append(f"explicit option, not the default: synchronous=NORMAL runs "
                     f"{vs_raw['single_normal'] / vs_raw['single']:.1f}x the default here; in WAL "
                     "mode it skips the fsync at each commit, so a power loss (not a process "
                     "crash) may lose the last commits, acknowledged ones included")
    if results.get("peers_missing"):
        lines.append(f"peers not installed, so not compared: {', '.join(results['peers_missing'])}"
                     " (pip install -e '.[bench]'; make bench does)")
    return lines


def scaling(results: dict[str, Any]) -> list[str]:
    """Rate against worker processes, per store, as multiples of one worker."""
    vs_raw, lines = results["vs_raw"], []
    paired = results.get("paired", {})
    if all(name in paired for name in ("two_workers", "four_workers")):
        lines.append(f"worker processes 1, 2, 4, SQLite, single message: 1.00x, "
                     f"{paired['two_workers']:.2f}x, {paired['four_workers']:.2f}x of one worker "
                     "(each slice over one worker's slices just before and just after it, median)")
    rows = [(f"PostgreSQL, {label}", [f"pg_{name}_{n}" for n in WORKER_COUNTS])
            for label, name in (("single message", "single"), ("K=100", "batch_100"))]
    for label, names in rows:
        if all(name in vs_raw for name in names):
            lines.append(f"worker processes 1, 2, 4, {label}: " + ", ".join(
                f"{vs_raw[name] / vs_raw[names[0]]:.2f}x" for name in names) + " of one worker")
    return lines


def safety_lines(results: dict[str, Any]) -> list[str]:
    """The two-consumer and crash probes, and what each queue's ack fences."""
    probes = {**results.get("safety", {}), **results.get("pg_safety", {})}
    if not probes:
        return []
    lines = ["", "two consumer processes (dup = items delivered twice, missing = never, per "
             "round) and a consumer killed between get and ack (crash: redelivered, held = "
             "stored but handed out only by hand, lost); durability read back by the consumer",
             f"{'queue':<16}{'journal':>9}{'sync':>8}  result"]
    for name, probe in probes.items():
        lines.append(f"{name:<16}{str(probe['journal_mode']):>9}{str(probe['synchronous']):>8}  "
                     + describe(probe))
    if results.get("fencing"):
        from fencing import report as fencing_report
        lines += fencing_report(results["fencing"])
    lines.append("what each ack means (read from each library's source):")
    for peer in {peer["peer"]: peer for peer in results.get("peers", [])}.values():
        lines.append(f"  {peer['peer']}: {peer['ack']}")
    return lines


def _mb(count: float) -> str:
    return f"{count / 1e6:.2f} MB"


def lifetime_lines(results: dict[str, Any]) -> list[str]:
    """The queue over its lifetime: the steady load pruned and not, prune beside the
    workers, PostgreSQL's space after prune and VACUUM, migrate beside a running
    worker of the previous engine. Every queue is ours at synchronous=FULL."""
    found = results.get("lifetime") or {}
    if not found:
        return []
    lines = ["", "the queue over its lifetime (every commit synchronous=FULL: each ACK and "
             "enqueue fsynced; claims and prune's transactions without an fsync of their own, "
             "as the package commits them)"]
    steady = found.get("steady")
    if steady:
        files, window = steady["files"], steady["window"]
        live = steady["live_windows"] * window
        lines.append(f"steady load: {steady['events']:,} events of {steady['payload_bytes']:,} "
                     f"bytes, enqueued {window} per window (100 per commit), one window every "
                     f"10 s of a model clock, claimed and ACKed in batches of 50; pruned after "
                     f"each window, keeping the last {steady['live_windows']} windows' "
                     f"{live:,} done messages whole; a connection held open all along")
        for name, label in (("unpruned", "never pruned"), ("pruned", "pruned"),
                            ("limited", "pruned, journal_size_limit")):
            sizes = files[name]
            lines.append(f"  {label:<27} file {_mb(sizes['file']):>9} + -wal "
                         f"{_mb(sizes['wal']):>9} = {_mb(on_disk(sizes)):>9}; "
                         f"after the next commit -wal {_mb(sizes['wal_rest'])}")
        unpruned = on_disk(files["unpruned"])
        lines.append(f"  pruned / never pruned: {on_disk(files['pruned']) / unpruned:.2f} with "
                     f"the -wal at its high-water mark; "
                     f"{on_disk(files['limited'], 'wal_rest') / on_disk(files['unpruned'], 'wal_rest'):.2f} "
                     "after the next commit with journal_size_limit (never pruned: without); "
                     f"{files['pruned']['checkpointed'] / files['unpruned']['checkpointed']:.2f} "
                     f"for the data alone ({_mb(files['pruned']['checkpointed'])} vs "
                     f"{_mb(files['unpruned']['checkpointed'])}, each file once a "
                     "wal_checkpoint(TRUNCATE) copied its -wal in and emptied it)")
        lines.append(f"  the -wal: SQLite writes it from its start again after a checkpoint but "
                     f"never makes it shorter, so it stays at its high-water mark: the pages "
                     f"written between two checkpoints (at most the {steady['checkpoint_pages']:,}-page "
                     f"autocheckpoint, {steady['checkpoint_pages'] * steady['page_size'] // 2**20} MB "
                     "with 1 KB pages, plus the commit that crossed it; here prune's own "
                     "checkpoint after each window comes first). PRAGMA journal_size_limit "
                     f"(not set by the engine; the third file's connections set "
                     f"{steady['wal_limit'] // 1024} KB) truncates it at the first commit after "
                     "a checkpoint to that limit (or that commit's size): it bounds the size "
                     "at rest, not the peak between two checkpoints, and changes no fsync")
        flat = steady["flat"]
        lines.append(f"  once the windows roll: payload text {flat['payload'][0]:,}..{flat['payload'][1]:,} "
                     f"bytes ({live:,} live x {steady['payload_bytes']:,}), journal pages "
                     f"{flat['journal'][0]:,}..{flat['journal'][1]:,} bytes, the live index "
                     f"{flat['index'][0]:,}..{flat['index'][1]:,} bytes: flat at the live window")
        if steady["slope"] is not None:
            lines.append(f"  what every event keeps (its row without payload, key index, "
                         f"effect, record, on pages) grows {steady['slope']:.0f} bytes per "
                         "event (least squares over the rolled windows)")
        kept = steady["kept"]
        pages = ", ".join(f"{name} {count:,}" for name, count in kept["pages"].items())
        lines.append(f"  kept per pruned event after prune(0): {kept['per_event']:.0f} bytes of "
                     f"pages ({pages} bytes for {kept['pruned']:,} pruned), of which "
                     f"{kept['cells_per_event']:.0f} bytes of cells (dbstat); the rest is page "
                     "slack and cell headers")
        prune = steady["prune"]
        lines.append(f"  prune: {prune['messages']:,} messages in {prune['batches']} "
                     f"transactions of at most {PRUNE_BATCH}; the longest took "
                     f"{prune['longest_s'] * 1000:.1f} ms from BEGIN IMMEDIATE to the end of its "
                     f"commit call (each prune call's longest: median "
                     f"{prune['median_call_s'] * 1000:.1f} ms; nothing else wrote, so no wait is "
                     "in it, but a commit that filled the -wal to SQLite's automatic checkpoint "
                     "ran the checkpoint in that call after releasing the lock: an upper bound "
                     "of the hold); giving freed pages back (incremental_vacuum, 64 pages each) "
                     "is separate transactions, not timed here")
        replay = steady["replay"]
        lines.append(f"  a replay of pruned E0000: {replay['same']}; with another payload: "
                     f"{replay['other']}; states, effects and money exact on all three files "
                     "(the shared audit), and on the pruned one again after the replays")
    hold = found.get("hold")
    if hold:
        lines.append(f"prune's hold of the write lock, as a probe beside it met it (a process "
                     f"that takes and releases the lock in a loop, no other writer): during the "
                     f"{hold['batches']} batches of a prune(0) of {hold['messages']:,} done "
                     f"messages of 2 KB the probe waited at most {hold['held_s'] * 1000:.1f} ms "
                     f"for the lock, and at most {hold['give_back_held_s'] * 1000:.1f} ms while "
                     "the freed pages were given back after them (incremental vacuum "
                     "transactions, and the -wal's truncation if it ran: the probe commits "
                     "nothing, so the prune counts as quiet, and the truncation runs where the "
                     "-wal has reached 1 MB and the probe is not in the lock at that moment)")
    beside = found.get("beside")
    paired = results.get("paired", {})
    if beside and "single_pruned" in paired:
        lines.append(f"prune beside the worker: {paired['single_pruned']:.2f}x "
                     f"the worker's rate without it (consumer side, each slice over the worker's "
                     f"alone just before and just after it, median); the pruning "
                     f"process pruned {beside['during']:,} of the {beside['consumed']:,} "
                     f"messages consumed while the worker ran ({beside['pruned']:,} in all, "
                     "once it stopped too); when the worker finished a slice, done messages not "
                     f"yet pruned: median {beside['backlog_median']:g}, at most "
                     f"{beside['backlog_max']} of {beside['consumed'] // beside['slices']} per slice"
                     f"; its longest batch "
                     f"{beside['longest_s'] * 1000:.1f} ms, waiting for the lock included")
        if not beside["kept_up"]:
            lines.append("  the prune did not keep up (it fell further behind than the "
                         f"{beside['bound_min']:.0f} messages the worker finishes in three of "
                         "its 20 ms pauses), so this ratio is not the target's premise: a "
                         "prune that lags holds the lock for fewer messages than the worker "
                         "finished")
    pages = found.get("ack_pages")
    if pages:
        lines.append(f"the worker loop's ACK that claims the next message wrote "
                     f"{', '.join(map(str, pages['fused']))} WAL pages per commit, the last ACK "
                     f"{', '.join(map(str, pages['last']))} (1 KB pages; every ACK fsynced: "
                     f"{all(pages['fsynced'])}); schema 2's finish time is in the row the ACK "
                     "rewrites anyway")
    space = found.get("pg_space")
    if space:
        lines.append(f"PostgreSQL space: {space['events']:,} events of 2 KB processed, then "
                     "prune(0) and VACUUM (not FULL), then as many events again, pruned and "
                     "vacuumed (bytes: table, its indexes, total with TOAST)")
        for table in space["before"]:
            row = "  ".join(f"{stage} {space[stage][table]['heap']:,}/"
                            f"{space[stage][table]['indexes']:,}/{space[stage][table]['total']:,}"
                            for stage in ("before", "after", "again"))
            lines.append(f"  {table:<12} {row}")
        total = {stage: sum(t["total"] for t in space[stage].values())
                 for stage in ("before", "after", "again")}
        lines.append(f"  every table: before {_mb(total['before'])}, after prune + VACUUM "
                     f"{_mb(total['after'])} ({total['after'] / total['before']:.2f}), after as "
                     f"much load again {_mb(total['again'])}: VACUUM makes the space reusable "
                     "inside the tables, it does not give it back to the file system")
    moved = found.get("migrate")
    if moved and "skipped" in moved:
        lines.append(f"migrate: not measured ({moved['skipped']})")
    elif moved:
        for store in ("sqlite", "postgres"):
            if store not in moved:
                continue
            one = moved[store]
            blocked = "-" if one["blocked_s"] is None else f"{one['blocked_s'] * 1000:.0f} ms"
            usual = "-" if one["usual_step_s"] is None else f"{one['usual_step_s'] * 1000:.1f} ms"
            lines.append(f"migrate, {'SQLite' if store == 'sqlite' else 'PostgreSQL'}: "
                         f"{one['messages']:,} messages written by {moved['engine']} "
                         f"in {one['seconds'] * 1000:.0f} ms: "
                         f"{one['waited_s'] * 1000:.0f} ms to begin its step beside the "
                         f"worker, then its transaction held for {one['held_s'] * 1000:.0f} ms "
                         f"({'the write lock, for the rebuild of messages' if store == 'sqlite' else 'its ALTER TABLE waits for, then holds, the exclusive lock'}); "
                         f"a worker of {moved['engine']} running beside it (claim + ACK per "
                         f"step, usually {usual}) took at most {blocked} for a step that "
                         f"overlapped that hold, then {one['worker_end']}; this engine "
                         "finished every message, audited, the money exact")
    return lines


def priority_lines(results: dict[str, Any]) -> list[str]:
    """What priorities cost the worker loop's step, and a low priority's waits under a
    steady urgent load beside strict priority's (``bench_priority``)."""
    costs, found = results.get("priority_costs") or {}, results.get("starvation")
    lines = ["", "priorities"] if costs or found else []
    if costs:
        lines.append("  what they cost the worker loop's step (the ACK of one message and the "
                     "claim of the next, one transaction, every ACK fsynced): two queues of the "
                     "same events, each enqueued in a commit of its own, one with each event at "
                     "priority i % 10, one with every event at 0, consumed by one process a step "
                     "on one, then a step on the other, so that both meet the disk in the same "
                     "state (slices side by side differ by tens of percent here)")
        for store, cost in costs.items():
            spread = statistics.quantiles(cost["ratios"], n=4) if len(cost["ratios"]) > 1 \
                else cost["ratios"] * 3
            lines.append(f"    {'SQLite' if store == 'sqlite' else 'PostgreSQL'}: with "
                         f"priorities over without {cost['ratio']:.2f} (median of "
                         f"{cost['rounds']} rounds of {cost['steps']} steps each, quartiles "
                         f"{spread[0]:.2f} and {spread[2]:.2f}); {cost['rates']['mixed']:.0f} "
                         f"and {cost['rates']['plain']:.0f} steps/s over all rounds")
    if found:
        lines.append(f"  a low priority under a steady urgent load, on a model clock (the same "
                     f"figures every run): workers finish {found['rate']} messages a second; "
                     f"{found['urgent_per_second']} of priority {found['urgent']} become due "
                     "every second (the workers' whole rate: strict priority has no bound "
                     f"there), and one of priority {found['priority']} every "
                     f"{found['lows'][1]['due'] - found['lows'][0]['due']} s; only messages due "
                     f"within {found['window']} s after a low one can go before it")
        for low in found["lows"]:
            waited = (f"waited {low['wait']} s" if low["wait"] is not None
                      else f"still waiting after {low['waiting']} s")
            lines.append(f"    {low['event_id']}: due at {low['due']} s with {low['ahead']} "
                         f"keyed before it, {waited}; its bound (priority.wait_bound) "
                         f"{low['bound']:g} s")
        strict = "; ".join(f"after {s['seconds']:,} s {s['waiting']} of {s['lows']} still "
                           f"waiting, the oldest for {s['longest']:,} s" for s in found["strict"])
        lines.append(f"  strict priority on the same arrivals (a model that takes the highest "
                     f"priority first; in the head-start order the same model claims every "
                     f"message in the second the engine did): {strict}: the wait grows with the "
                     "run")
    return lines


def shown(value: float, bound: float, at_least: bool, met: bool) -> str:
    """``value`` to two decimals, or as many more as it takes to show which side of
    ``bound`` it is on: 0.9496 against a floor of 0.95 reads "0.9496", not a
    "0.95" marked below target beside another "0.95" marked ok."""
    for digits in (2, 3, 4, 5, 6):
        text = f"{value:.{digits}f}"
        if (float(text) >= bound if at_least else float(text) <= bound) == met:
            return text
    return repr(value)


def target_lines(results: dict[str, Any]) -> list[str]:
    """Every target with this run's figure and its verdict (a benchmark reports, it does not gate)."""
    lines = ["", "targets, from this run (floors unless marked <=):",
             f"  {'figure':<52}{'value':>7}  {'target':<9} verdict"]
    for row in evaluate(results):
        bound = f"{'>=' if row['at_least'] else '<='} {row['bound']:g}"
        if row["value"] is None:
            value, verdict = "-", "not measured in this run"
        else:
            value = shown(row["value"], row["bound"], row["at_least"], row["met"])
            verdict = "ok" if row["met"] else "BELOW TARGET"
            if not row["at_least"] and not row["met"]:
                verdict = "ABOVE TARGET"
        against = f"; against {row['against']}" if row["against"] else ""
        lines.append(f"  {row['name']:<52}{value:>7}  {bound:<9} {verdict}")
        lines.append(f"    ({row['compares']}{against})")
    return lines


def report(results: dict[str, Any]) -> list[str]:
    """The printed tables: each regime, bare and on the same work, the peers' safety, the
    targets."""
    lines = regime_table(results, "this machine's flush")
    same = same_work_table(results, "this machine's flush")
    lines += [""] + same if same else []
    slow = results.get("slow")
    if slow is not None and "rates" not in slow:
        lines += ["", f"slow-disk regime: skipped ({slow['skipped']})"]
    elif slow is not None:
        title = "2 ms added to every flush (slow-disk shim)"
        lines += ["", *regime_table(slow, title)]
        same = same_work_table(slow, title)
        lines += [""] + same if same else []
    lines += notes(results) + same_work_notes(results) + safety_lines(results) \
        + lifetime_lines(results) + priority_lines(results)
    if results.get("id_check"):
        lines += ["", *bench_idcheck.lines(results["id_check"])]
    lines += target_lines(results)
    return lines
