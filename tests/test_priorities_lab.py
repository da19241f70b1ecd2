"""The lab of notebook 15: a bulk import and a stream of urgent refunds played on a real
queue file, one model second at a time, under the package's head start and under the
strict-priority contrast. The figures the chapter prints are pinned here: the refund's
300 s in first-in, first-out order, strict priority's bulk wait that grows with the
stream, and the head start's waits, each within ``priority.wait_bound``."""

from __future__ import annotations

from pathlib import Path

import pytest

from queue_core import ModelClock, Queue
from queue_core.lab.plots import oldest_due
from queue_core.lab.story import (Load, StrictPriority, bulk_import, longest_wait, play_load,
                                  read_waits, refunds)
from queue_core.lab.story.priorities import STRICT_DUE
from queue_core.priority import CLAIM_ORDER, wait_bound
from queue_core.transitions import DUE

STREAM = Load(bulk=60, urgent_per_second=1, seconds=900, rate=1)  # the chapter's stream
RULES = {"head start": Queue, "strict priority": StrictPriority}


def played(folder: Path, rule: str, load: Load) -> tuple[Queue, list]:
    queue = RULES[rule](folder / f"{rule}.sqlite3", clock=ModelClock(1000), synchronous="NORMAL")
    return queue, play_load(queue, load, sample_every=20)


def test_in_fifo_order_the_refund_waits_for_the_whole_import_300_s(tmp_path: Path) -> None:
    queue, _ = played(tmp_path, "head start", Load(bulk=300, urgent_per_second=1, seconds=1,
                                                   rate=1, urgent=0))
    waits = {w.event_id: w for w in read_waits(queue)}
    refund = waits["E1000"]
    assert (refund.priority, refund.due, refund.claimed, refund.ahead, refund.seconds) == (
        0, 1000, 1300, 300, 300)
    assert [waits[f"E{n:04d}"].seconds for n in (1, 2, 300)] == [0, 1, 299]
    status = queue.status()
    assert (status.states, status.effects, dict(status.totals)) == (
        {"ready": 0, "leased": 0, "done": 301, "dead": 0}, 301, {"book": 450000, "refund": 4200})
    assert status.priorities == {}  # every message at the default: nothing per priority


@pytest.mark.parametrize("seconds", [600, 900])
def test_strict_priority_starves_the_bulk_for_as_long_as_the_stream_lasts_the_head_start_does_not(
        tmp_path: Path, seconds: int) -> None:
    load = Load(bulk=60, urgent_per_second=1, seconds=seconds, rate=1)
    strict, _ = played(tmp_path, "strict priority", load)
    head, _ = played(tmp_path, "head start", load)
    strict_waits, head_waits = read_waits(strict), read_waits(head)
    # strict: the last bulk order waits for the whole stream, then for the 59 before it
    assert longest_wait(strict_waits, 0).seconds == seconds + 59
    assert longest_wait(strict_waits, 9).seconds == 0
    # the head start: the same waits whatever the stream's length, each a second under its bound
    assert [longest_wait(head_waits, p).seconds for p in (0, 9)] == [599, 60]
    for waits in (strict_waits, head_waits):
        assert len(waits) == load.messages
    assert strict.status().totals == head.status().totals == {
        "book": 60 * 1500, "refund": seconds * 4200}
    assert strict.status().states["done"] == head.status().states["done"] == load.messages


def test_under_the_head_start_every_wait_is_within_its_bound_and_strict_priority_breaks_it(
        tmp_path: Path) -> None:
    head, head_samples = played(tmp_path, "head start", STREAM)
    strict, strict_samples = played(tmp_path, "strict priority", STREAM)
    u, rate = STREAM.urgent_per_second, STREAM.rate
    bounds = {}
    for priority in (0, 9):
        waits = [w for w in read_waits(head) if w.priority == priority]
        ahead = max(w.ahead for w in waits)
        bounds[priority] = wait_bound(priority, ahead, u, rate)
        assert all(w.seconds <= wait_bound(priority, w.ahead, u, rate) for w in waits)
        assert max(w.seconds for w in waits) <= bounds[priority]
    assert bounds == {0: 600, 9: 61}  # the chapter prints ahead 59 and 60
    assert (longest_wait(read_waits(head), 0).event_id, longest_wait(read_waits(head), 9).event_id
            ) == ("E0060", "E1540")
    # the tie at key 1000 (E1540 is due at 1540 - 540 = 1000): E0060's smaller id goes first,
    # so each longest wait is a second under its bound, as the chapter says
    claimed = {w.event_id: w.claimed for w in read_waits(head)}
    assert (claimed["E0060"], claimed["E1540"]) == (1599, 1600)
    # where the chapter's figure draws each line's end: its last sample with one due
    ends = {rule: {p: [(at, age) for at, age in oldest_due(samples, p).items() if age == age][-1]
                   for p in (0, 9)}
            for rule, samples in (("head start", head_samples), ("strict", strict_samples))}
    assert ends == {"head start": {0: (1580, 580), 9: (1940, 60)},
                    "strict": {0: (1940, 940), 9: (1880, 0)}}
    over = [w for w in read_waits(strict) if w.seconds > wait_bound(w.priority, w.ahead, u, rate)]
    assert {w.priority for w in over} == {0} and len(over) == 60  # every bulk order
    at_1560 = {m.at: m for m in head_samples}[1560]  # the metrics the chapter prints
    assert {p: (dict(f.depth), f.oldest_ready_age) for p, f in at_1560.priorities.items()} == {
        0: ({"ready": 40, "leased": 0, "done": 20, "dead": 0}, 560),
        9: ({"ready": 21, "leased": 0, "done": 540, "dead": 0}, 20)}


def test_the_try_it_load_of_chapter_15_gives_the_waits_and_bounds_its_text_names(
        tmp_path: Path) -> None:
    """Two refunds a second for a worker that takes two: the chapter's "Try it here
    too" tells the learner to expect 569 s and 30 s, against 570.5 s and 31.5 s."""
    load = Load(bulk=60, urgent_per_second=2, seconds=900, rate=2)
    head, _ = played(tmp_path, "head start", load)
    waits = read_waits(head)
    found = {}
    for priority in (0, 9):
        ahead = max(w.ahead for w in waits if w.priority == priority)
        found[priority] = (longest_wait(waits, priority).seconds,
                           wait_bound(priority, ahead, load.urgent_per_second, load.rate))
    assert found == {0: (569, 570.5), 9: (30, 31.5)}
    assert all(w.seconds <= wait_bound(w.priority, w.ahead, 2, 2) for w in waits)
    status = head.status()
    assert (status.states["done"], status.effects, dict(status.totals)) == (
        load.messages, load.messages, {"book": 60 * 1500, "refund": 1800 * 4200})


def test_an_order_due_more_than_nine_minutes_earlier_goes_first_under_the_head_start_only(
        tmp_path: Path) -> None:
    claimed = {}
    for rule, kind in RULES.items():
        clock = ModelClock(1000)
        queue = kind(tmp_path / f"{rule}.sqlite3", clock=clock)
        queue.enqueue_jsonl(bulk_import(1))        # E0001, priority 0, due at 1000
        clock.set(1541)
        queue.enqueue_jsonl(refunds(1), priority=9)  # keyed at 1541 - 540 = 1001
        claimed[rule] = [queue.claim().event_id, queue.claim().event_id]
    assert claimed == {"head start": ["E0001", "E1000"], "strict priority": ["E1000", "E0001"]}


def test_a_retried_urgent_message_waits_out_its_backoff_then_goes_ahead_of_older_orders(
        tmp_path: Path) -> None:
    clock = ModelClock(1000)
    shop = Queue(tmp_path / "backoff.sqlite3", clock=clock)
    shop.enqueue_jsonl(bulk_import(4))
    shop.enqueue_jsonl(refunds(1), priority=9)
    outcome = shop.fail(shop.claim(), "transient_error")
    assert (outcome.event_id, outcome.kind, outcome.available_at) == ("E1000", "retry", 1001)
    assert shop.claim().event_id == "E0001"  # the refund is keyed first, and not due
    figures = shop.metrics().priorities[9]
    assert (dict(figures.depth), figures.oldest_ready_age) == (
        {"ready": 1, "leased": 0, "done": 0, "dead": 0}, None)
    clock.set(1001)
    assert shop.claim().event_id == "E1000"
    assert [m.event_id for m in shop.messages() if m.state == "ready"] == ["E0002", "E0003",
                                                                            "E0004"]
    assert [(t.at, t.event_id, t.reason) for t in shop.transitions() if t.reason != "enqueued"] \
        == [(1000, "E1000", "claimed"), (1000, "E1000", "transient_error"),
            (1000, "E0001", "claimed"), (1001, "E1000", "claimed")]
    assert (shop.message("E1000").priority, shop.message("E1000").generation) == (9, 2)


def test_the_strict_contrast_is_the_packages_read_of_due_messages_with_only_its_order_changed(
        ) -> None:
    assert f"ORDER BY {CLAIM_ORDER}, event_id" in DUE
    assert STRICT_DUE == DUE.replace(f"ORDER BY {CLAIM_ORDER}, event_id",
                                     "ORDER BY priority DESC, available_at, event_id")


@pytest.mark.parametrize("load", [
    dict(bulk=0, urgent_per_second=1, seconds=1, rate=1),
    dict(bulk=1000, urgent_per_second=1, seconds=1, rate=1),
    dict(bulk=1, urgent_per_second=1, seconds=1, rate=0),
    dict(bulk=1, urgent_per_second=10, seconds=901, rate=1),
], ids=["no-bulk", "bulk-into-the-refunds-ids", "no-worker", "more-refunds-than-ids"])
def test_a_load_the_lab_cannot_play_is_refused_before_anything_runs(load: dict) -> None:
    with pytest.raises(ValueError):
        Load(**load)


def test_play_load_refuses_a_queue_on_the_system_clock(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="ModelClock"):
        play_load(Queue(tmp_path / "system.sqlite3"), Load(bulk=1, urgent_per_second=0,
                                                           seconds=0, rate=1))
    assert Queue(tmp_path / "system.sqlite3").status().states["ready"] == 0
