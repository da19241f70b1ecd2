"""Priorities in ``bench.py``: what they cost a claim, and how long a low one waits.

- What they cost (``step_costs``): two queues of one store hold the same
  events, with the same payloads, each enqueued in a commit of its own: on
  one, each event at the priority ``mixed_priority`` gives it (0 to 9 in turn
  over the backlog, so a message's neighbours in the table have other
  priorities), on the other every one at 0. One process consumes both with
  the worker loop's step (``worker.finish_and_claim``: the ACK of one message
  and the claim of the next in one transaction, fsynced as every ACK is),
  a step on one queue, then a step on the other, turn and turn about, so
  that both meet the disk in the same state; each round's figure is the
  time the steps at priority 0 took over the time those with priorities
  took (throughput with priorities over without), and the median of the
  rounds is the target's (``bench_report``). The disk here changes speed
  several times within a second, so slices of a hundred messages each,
  even side by side, differ by tens of percent; alternating step by step
  leaves both the same disk.
- How long a low priority waits (``starvation``): on a model clock, workers
  that finish ``rate`` messages a second, a steady urgent load of ``rate``
  messages of priority 9 every second (the workers' whole rate: the load at
  which strict priority has no bound), and a message of priority 0 every
  ``LOW_EVERY`` seconds. Each low message's wait, from the second it became
  due to the second a claim took it, is set against the bound the engine
  states for it (``priority.wait_bound``, with the messages keyed before it
  when it became due, read from the file). For contrast, the same arrivals in
  a model of strict priority (the highest priority first): the model, run in
  the head-start order, must claim every message in the second the engine
  did, so that only the order differs between the two figures.

The model clock decides every figure here, not this machine: the starvation
figures are the same on every run. Each run is checked like the slices: the
audit clean, effects and money exact for the messages done.
"""

from __future__ import annotations

import heapq
import json
import math
import sqlite3
import statistics
import time
from pathlib import Path
from typing import Any, Callable

from bench_cases import CATEGORIES, IDS_PER_FILE, CheckFailed, Keeper, amount_of, payload_of

from queue_core import Handler, ModelClock, Queue, audit, drain
from queue_core.worker import finish_and_claim
from queue_core.priority import (CLAIM_ORDER, DEFAULT_PRIORITY, HEAD_START_SECONDS, HIGHEST,
                                 LOWEST, PRIORITIES, head_start, wait_bound)

URGENT, LOW = HIGHEST, LOWEST
MIXED, PLAIN = "mixed", "plain"  # the queue with priorities 0-9, the one all at 0
LOW_MESSAGES = 5    # low-priority messages, one every LOW_EVERY seconds of the load
LOW_EVERY = 60
FIRST_LOW = 30      # the first becomes due after this many seconds of the urgent load
START = 1_000_000   # the model clock's first second

Arrival = tuple[str, int, int]  # event id, priority, index (its payload's)
Key = Callable[[int, int, str], tuple[Any, ...]]  # (due second, priority, event id) -> order


# -- what priorities cost the worker loop's step ------------------------------------

def mixed_priority(i: int) -> int:
    """The i-th event's priority on the mixed queue: 0 to 9 in turn."""
    return PRIORITIES[i % len(PRIORITIES)]


def fill(db: str, count: int, mixed: bool) -> dict[int, int]:
    """``count`` events, each enqueued in a commit of its own (not timed: without
    waiting for a flush), at ``mixed_priority`` or all at 0; the done messages
    per priority ``Status.priorities`` will then show (none while all are at 0)."""
    queue = Queue(db, synchronous="NORMAL")
    with queue.session():
        for i in range(count):
            line = json.dumps({"event_id": f"E{i:04d}", "payload": json.loads(payload_of(i))})
            queue.enqueue_jsonl(line, priority=mixed_priority(i) if mixed else DEFAULT_PRIORITY)
    counts: dict[int, int] = {}
    for i in range(count if mixed else 0):
        counts[mixed_priority(i)] = counts.get(mixed_priority(i), 0) + 1
    return dict(sorted(counts.items()))


def step_costs(dbs: dict[str, str], steps: int, rounds: int,
               say: Callable[[str], None] = lambda text: None) -> dict[str, Any]:
    """The worker loop's step on the queue with priorities (``dbs[MIXED]``) and on
    the one without (``dbs[PLAIN]``), turn and turn about, ``steps`` of each per
    round; each round's time without over its time with, the median, the rates.
    Raises ``CheckFailed`` unless each queue ends with every message done once,
    its effect and the money exact, the done messages of each priority as enqueued."""
    count = steps * rounds + 1  # each step claims the next: one more than the steps
    if count > IDS_PER_FILE:
        raise ValueError(f"{steps} steps in {rounds} rounds: at most {IDS_PER_FILE - 1}")
    say(f"priorities: {rounds} rounds of {steps} worker-loop steps on each of two queues, "
        "turn and turn about")
    wanted = {name: fill(db, count, name == MIXED) for name, db in dbs.items()}
    queues = {name: Queue(db) for name, db in dbs.items()}  # the default durability
    spent: dict[str, list[float]] = {name: [] for name in dbs}
    handler = Handler()
    with queues[MIXED].session(), queues[PLAIN].session():
        leases = {name: queue.claim() for name, queue in queues.items()}
        for _ in range(rounds):
            took = dict.fromkeys(dbs, 0.0)
            for step in range(steps):
                for name in (MIXED, PLAIN) if step % 2 == 0 else (PLAIN, MIXED):
                    lease = leases[name]
                    if lease is None:
                        raise CheckFailed(f"priorities, {name}: nothing claimed at step {step}")
                    started = time.perf_counter()
                    outcome, leases[name] = finish_and_claim(queues[name], lease, handler)
                    took[name] += time.perf_counter() - started
                    if outcome.kind != "done":
                        raise CheckFailed(f"priorities, {name}: {outcome}")
            for name in dbs:
                spent[name].append(took[name])
        for name, lease in leases.items():
            if lease is not None:
                queues[name].complete(lease, handler)
    for name, db in dbs.items():
        checked(db, count, wanted[name])
    ratios = [plain / mixed for plain, mixed in zip(spent[PLAIN], spent[MIXED])]
    return {"steps": steps, "rounds": rounds, "ratios": ratios,
            "ratio": statistics.median(ratios),
            "rates": {name: steps * rounds / sum(spent[name]) for name in dbs}}


def checked(db: str, count: int, priorities: dict[int, int]) -> None:
    """Every one of ``count`` messages done once, its effect and the money exact, the
    done messages of each priority as enqueued (``Keeper``); else ``CheckFailed``."""
    keeper = Keeper(db)
    try:
        keeper.check_exactly_once(count, sum(amount_of(i) for i in range(count)),
                                  priorities=priorities)
    finally:
        keeper.close()


# -- how long a low priority waits ---------------------------------------------------

def head_start_order(due: int, priority: int, event_id: str) -> tuple[Any, ...]:
    """The engine's claim order (``priority.CLAIM_ORDER``, then the event id)."""
    return (due - head_start(priority), event_id)


def strict_order(due: int, priority: int, event_id: str) -> tuple[Any, ...]:
    """Strict priority: the highest first, then the due time, then the event id."""
    return (-priority, due, event_id)


def arrivals(rate: int, seconds: int) -> list[list[Arrival]]:
    """What becomes due in each second: ``rate`` urgent messages, and a low one
    every ``LOW_EVERY`` seconds from ``FIRST_LOW`` on (``LOW_MESSAGES`` in all)."""
    lows = {FIRST_LOW + n * LOW_EVERY: n for n in range(LOW_MESSAGES)}
    found, index = [], 0
    for second in range(seconds):
        due: list[Arrival] = []
        if second in lows:
            due.append((f"low-{lows[second]:02d}", LOW, index))
            index += 1
        for j in range(rate):
            due.append((f"urgent-{second:05d}-{j:03d}", URGENT, index))
            index += 1
        found.append(due)
    return found


def model(load: list[list[Arrival]], rate: int, order: Key) -> dict[str, int]:
    """The second in which workers that take ``rate`` messages a second, in
    ``order``, claim each message of ``load`` (those never claimed are absent)."""
    waiting: list[tuple[tuple[Any, ...], str]] = []
    claimed: dict[str, int] = {}
    for second, due in enumerate(load):
        for event_id, priority, _ in due:
            heapq.heappush(waiting, (order(second, priority, event_id), event_id))
        for _ in range(min(rate, len(waiting))):
            claimed[heapq.heappop(waiting)[1]] = second
    return claimed


def _lines(due: list[Arrival]) -> dict[int, str]:
    """The JSONL of one second's arrivals, one text per priority."""
    texts: dict[int, list[str]] = {}
    for event_id, priority, index in due:
        texts.setdefault(priority, []).append(json.dumps({"event_id": event_id, "payload": {
            "amount_cents": amount_of(index), "category": CATEGORIES[index % 3]}}))
    return {priority: "\n".join(lines) for priority, lines in texts.items()}


AHEAD = (f"SELECT count(*) FROM messages WHERE state = 'ready' AND payload IS NOT NULL "
         f"AND ({CLAIM_ORDER}, event_id) < (SELECT {CLAIM_ORDER}, event_id FROM messages "
         "WHERE event_id = ?)")


def engine(path: Path, load: list[list[Arrival]], rate: int) -> dict[str, Any]:
    """The engine on ``load``, second by second: enqueue what becomes due, then
    ``drain`` at most ``rate`` messages; until every low message is done, or
    the load ends. Returns the second each message was claimed, and for each low message
    the messages keyed before it when it became due."""
    clock = ModelClock(START)
    queue = Queue(path, clock=clock, ids="general", synchronous="OFF")  # only the clock counts
    reader = sqlite3.connect(path)
    claimed: dict[str, int] = {}
    ahead: dict[str, int] = {}
    lows = [a[0] for due in load for a in due if a[1] == LOW]
    handler = Handler()
    try:
        with queue.session():
            for second, due in enumerate(load):
                for priority, text in _lines(due).items():
                    queue.enqueue_jsonl(text, priority=priority)
                for event_id, priority, _ in due:
                    if priority == LOW:
                        ahead[event_id] = reader.execute(AHEAD, (event_id,)).fetchone()[0]
                for outcome in drain(queue, handler, max_messages=rate):
                    if outcome.kind != "done":
                        raise CheckFailed(f"starvation: {outcome.event_id} {outcome.kind}")
                    claimed[outcome.event_id] = second
                if all(low in claimed for low in lows):
                    break
                clock.advance(1)
    finally:
        reader.close()
    return {"claimed": claimed, "ahead": ahead, "seconds": second + 1}


def check(path: Path, load: list[list[Arrival]], claimed: dict[str, int]) -> None:
    """The audit finds nothing; the messages claimed are done, each effect exact."""
    snap = audit.snapshot(path)
    problems = [str(finding) for finding in audit.check(snap)[:3]]
    money = sum(amount_of(index) for due in load for event_id, _, index in due
                if event_id in claimed)
    found = (snap.status.states["done"], snap.status.effects, snap.money)
    if problems or found != (len(claimed), len(claimed), money):
        raise CheckFailed(f"starvation: (done, effects, money) = {found}, expected "
                          f"{(len(claimed), len(claimed), money)}; audit: {problems or 'clean'}")


def starvation(workdir: Path, rate: int, say: Callable[[str], None] = lambda text: None
               ) -> dict[str, Any]:
    """A low priority's waits under a steady urgent load of ``rate`` a second, with
    workers of ``rate`` a second, against each one's stated bound; strict priority's
    for contrast. Raises ``CheckFailed`` where the audit finds anything or the
    model in the head-start order does not claim as the engine did."""
    say(f"starvation: {rate} urgent messages a second, workers at {rate} a second, "
        f"{LOW_MESSAGES} low-priority messages, on a model clock")
    window = (HIGHEST - LOW) * HEAD_START_SECONDS
    # the run stops once every low message is done, well before this
    horizon = FIRST_LOW + LOW_EVERY * LOW_MESSAGES + 4 * window
    load = arrivals(rate, horizon)
    ran = engine(workdir / "starvation.sqlite3", load, rate)
    seconds, claimed = ran["seconds"], ran["claimed"]
    load = load[:seconds]
    check(workdir / "starvation.sqlite3", load, claimed)
    if model(load, rate, head_start_order) != claimed:
        raise CheckFailed("starvation: the model in the head-start order does not claim "
                          "every message in the second the engine did")
    waits = []
    for second, due in enumerate(load):
        for event_id, priority, _ in due:
            if priority != LOW:
                continue
            bound = wait_bound(LOW, ran["ahead"][event_id], rate, rate)
            waited = claimed[event_id] - second if event_id in claimed else None
            waits.append({"event_id": event_id, "due": second, "ahead": ran["ahead"][event_id],
                          "wait": waited, "bound": bound,
                          "waiting": seconds - second if waited is None else None})
    return {"rate": rate, "urgent_per_second": rate, "priority": LOW, "urgent": URGENT,
            "window": window, "seconds": seconds, "lows": waits,
            "strict": [strict_waiting(arrivals(rate, length), rate) for length in
                       (seconds, 2 * seconds)]}


def strict_waiting(load: list[list[Arrival]], rate: int) -> dict[str, Any]:
    """Strict priority on ``load``: the low messages still waiting at its end, and
    the longest any low message waited or has been waiting by then."""
    claimed = model(load, rate, strict_order)
    lows = [(second, event_id) for second, due in enumerate(load)
            for event_id, priority, _ in due if priority == LOW]
    waited = [claimed[event_id] - second if event_id in claimed else len(load) - second
              for second, event_id in lows]
    return {"seconds": len(load), "lows": len(lows),
            "waiting": sum(event_id not in claimed for _, event_id in lows),
            "longest": max(waited)}


def figure(found: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    """The longest wait over its bound, among the low messages (one still waiting
    at the end counts with the time it has waited so far), and that message."""
    def ratio(low: dict[str, Any]) -> float:
        waited = low["wait"] if low["wait"] is not None else low["waiting"]
        return waited / low["bound"] if low["bound"] else math.inf
    worst = max(found["lows"], key=ratio)
    return ratio(worst), worst
