"""The course's pictures show exactly what the database holds.

Each figure is checked against the journal or the samples it was drawn from:
lanes, colours, counts and labels, so a plot that drifts from the data fails.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
from typing import Any, Iterator

import matplotlib.pyplot as plt
import pandas as pd
import pytest
from matplotlib.colors import to_hex
from matplotlib.text import Annotation

from conftest import ROOT
from queue_core import Effect, Handler, LeaseLost, ModelClock, Outcome, Queue
from queue_core.lab.plots.timeline import (STATE_COLORS, Mark, arrow_counts, mark, metrics_frame,
                                  plot_metrics, plot_state_machine, plot_timeline,
                                  transitions_frame)
from queue_core.lab.plots.workers import (consumer_turns, consumers_frame, plot_consumers,
                                          plot_sequence)

TWO_ORDERS = "\n".join([
    '{"event_id": "E0001", "payload": {"category": "book", "amount_cents": 10000}}',
    '{"event_id": "E0002", "payload": {"category": "toy", "amount_cents": 3000}}',
])


@pytest.fixture(autouse=True)
def close_figures() -> Iterator[None]:
    yield
    plt.close("all")


@pytest.fixture
def stale_story(queue: Queue, model_clock: ModelClock, handler: Handler) -> tuple[Queue, Mark]:
    """E0001: claimed, expired, claimed again, a stale ACK rejected, done; then E0002: dead."""
    first, second = TWO_ORDERS.splitlines()
    queue.enqueue_jsonl(first)
    stale = queue.claim()
    model_clock.set(1002)
    fresh = queue.claim()
    with pytest.raises(LeaseLost) as lost:
        queue.complete(stale, handler)
    assert lost.value.code == "stale_generation"
    rejected = mark(queue, "E0001", "stale ACK rejected")
    queue.complete(fresh, handler)
    queue.enqueue_jsonl(second)
    dead = queue.claim()
    queue.fail(dead, "invalid_payload", permanent=True)
    return queue, rejected


def test_importing_the_package_and_its_plots_loads_neither_pandas_nor_matplotlib() -> None:
    probe = ("import sys, queue_core, queue_core.lab.plots.timeline; "
             "print(sorted(m for m in ('pandas', 'matplotlib') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            cwd=ROOT, check=True)
    assert result.stdout.strip() == "[]"


def test_transitions_frame_holds_the_journal_row_for_row(stale_story: tuple[Queue, Mark]) -> None:
    queue, _ = stale_story
    frame = transitions_frame(queue)
    journal = queue.transitions()
    assert list(frame.index) == [t.seq for t in journal]
    assert list(frame.columns) == ["at", "event_id", "from_state", "to_state", "generation",
                                   "attempts", "reason"]
    rows = [(r.at, r.event_id, None if pd.isna(r.from_state) else r.from_state, r.to_state,
             r.generation, r.attempts, r.reason) for r in frame.itertuples()]
    assert rows == [(t.at, t.event_id, t.from_state, t.to_state, t.generation, t.attempts,
                     t.reason) for t in journal]
    assert frame["reason"].tolist() == ["enqueued", "claimed", "lease_expired", "claimed",
                                        "completed", "enqueued", "claimed", "invalid_payload"]


def test_a_mark_is_ordered_after_the_last_journal_row_at_the_moment_it_is_taken(
        stale_story: tuple[Queue, Mark]) -> None:
    _, rejected = stale_story
    assert (rejected.at, rejected.after_seq, rejected.event_id) == (1002, 4, "E0001")


def test_timeline_has_one_lane_per_event_ending_in_the_colour_of_its_final_state(
        stale_story: tuple[Queue, Mark]) -> None:
    queue, rejected = stale_story
    fig = plot_timeline(queue, marks=[rejected])
    ax = fig.axes[0]
    assert [label.get_text() for label in ax.get_yticklabels()] == ["E0001", "E0002"]
    for lane, final in ((0, "done"), (1, "dead")):
        bars = [p for p in ax.patches if p.get_y() + p.get_height() / 2 == lane]
        last = max(bars, key=lambda p: p.get_x())
        assert to_hex(last.get_facecolor()) == to_hex(STATE_COLORS[final])
    texts = [t.get_text() for t in ax.texts]
    assert sorted(t for t in texts if t.startswith("g")) == ["g1", "g1", "g2"]
    assert "stale ACK rejected" in texts
    assert "model time" in ax.get_xlabel()


def test_timeline_places_a_mark_between_the_rows_it_happened_between(
        stale_story: tuple[Queue, Mark]) -> None:
    queue, rejected = stale_story
    ax = plot_timeline(queue, marks=[rejected]).axes[0]
    crosses = [line for line in ax.lines if line.get_marker() == "X"]
    assert len(crosses) == 1
    x = crosses[0].get_xdata()[0]
    e0001_bars = sorted(p.get_x() for p in ax.patches if p.get_y() + p.get_height() / 2 == 0)
    second_claim, completed = e0001_bars[-2], e0001_bars[-1]  # leased g2, then done
    assert second_claim < x < completed


def test_timeline_legend_names_only_the_symbols_the_picture_uses(queue: Queue,
                                                                  handler: Handler) -> None:
    queue.enqueue_jsonl(TWO_ORDERS)
    queue.complete(queue.claim(), handler)
    labels = [t.get_text() for t in plot_timeline(queue).axes[0].get_legend().get_texts()]
    assert labels == ["ready", "leased", "done", "dead", "claim (gN: generation N)"]


def test_a_caught_mark_is_a_star_with_its_own_legend_entry_beside_a_crossed_one(
        stale_story: tuple[Queue, Mark]) -> None:
    queue, rejected = stale_story
    caught = Mark(1002, rejected.after_seq, "E0001", "W1 ACKs (g1); audit: a finding", caught=True)
    ax = plot_timeline(queue, marks=[rejected, caught]).axes[0]
    assert [line.get_marker() for line in ax.lines if line.get_marker() in ("X", "*")] == ["X", "*"]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend[-2:] == ["rejected or crashed", "caught by the audit"]
    only_caught = plot_timeline(queue, marks=[caught]).axes[0]
    assert "rejected or crashed" not in [t.get_text() for t in only_caught.get_legend().get_texts()]


def test_a_harmless_mark_is_a_grey_square_with_its_own_legend_entry_and_no_cross(
        stale_story: tuple[Queue, Mark]) -> None:
    queue, rejected = stale_story
    repeat = Mark(1002, rejected.after_seq, "E0001", "a repeat", harmless=True)
    ax = plot_timeline(queue, marks=[repeat]).axes[0]
    assert [line.get_marker() for line in ax.lines if line.get_marker() in ("X", "*", "s")] == ["s"]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend[-1] == "a repeat: nothing written" and "rejected or crashed" not in legend


def test_two_marks_close_together_keep_their_labels_apart(stale_story: tuple[Queue, Mark]) -> None:
    queue, rejected = stale_story
    first = Mark(1002, rejected.after_seq, "E0001", "a first label, long enough to reach over")
    second = Mark(1002, rejected.after_seq, "E0001", "a second label just after it")
    fig = plot_timeline(queue, marks=[first, second])
    ax = fig.axes[0]
    renderer = fig.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in ax.texts
             if t.get_text() in (first.label, second.label)]
    assert len(boxes) == 2 and not boxes[0].overlaps(boxes[1])
    assert boxes[1].y1 <= boxes[0].y0 + 1  # the later label moved down, under the earlier one


def test_state_machine_counts_each_arrow_from_the_journal(stale_story: tuple[Queue, Mark]) -> None:
    queue, _ = stale_story
    assert arrow_counts(queue) == {"enqueue": 2, "claim": 3, "complete": 1, "back to ready": 1,
                                   "to dead": 1, "redrive": 0}
    texts = " | ".join(t.get_text() for t in plot_state_machine(queue).axes[0].texts)
    for expected in ("enqueue (2×)", "claim (3×)", "complete (1×):", "back to ready (1×):",
                     "to dead (1×):", "redrive (0×):"):
        assert expected in texts
    plain = " | ".join(t.get_text() for t in plot_state_machine().axes[0].texts)
    assert "×" not in plain


def test_state_machine_labels_keep_clear_of_the_state_boxes(
        stale_story: tuple[Queue, Mark]) -> None:
    fig = plot_state_machine(stale_story[0])
    fig.canvas.draw()  # places each state's box around its name
    renderer = fig.canvas.get_renderer()
    texts = [t for t in fig.axes[0].texts if t.get_text()]  # not the arrows' empty annotations
    boxes = [t.get_bbox_patch().get_window_extent(renderer) for t in texts
             if t.get_bbox_patch() is not None]
    labels = [t.get_window_extent(renderer) for t in texts if t.get_bbox_patch() is None]
    assert len(boxes) == 4 and len(labels) == 6
    # 4 pixels apart at least: a label that touches a box reads as part of the state's name
    touching = [(label, box) for label in labels for box in boxes
                if label.overlaps(box.padded(4))]
    assert touching == []


def test_a_mark_after_a_journal_row_takes_that_rows_second_and_place(
        stale_story: tuple[Queue, Mark]) -> None:
    queue, _ = stale_story
    first_claim = queue.transitions("E0001")[1]
    placed = mark(queue, "E0001", "died after the first claim", after=first_claim.seq)
    assert placed == Mark(1000, first_claim.seq, "E0001", "died after the first claim")
    with pytest.raises(ValueError):
        mark(queue, "E0001", "nowhere", after=999)


def _outcomes() -> dict[str, list[Outcome]]:
    return {"consumer 1": [Outcome("E0100", "done", 1, effect=Effect("book", 100)),
                           Outcome("E0102", "done", 1, effect=Effect("bag", 300))],
            "consumer 2": [Outcome("E0101", "done", 1, effect=Effect("pen", 200))]}


def test_consumers_frame_lists_each_report_with_its_money() -> None:
    frame = consumers_frame(_outcomes())
    assert frame[["consumer", "nth", "event_id", "amount_cents"]].values.tolist() == [
        ["consumer 1", 1, "E0100", 100], ["consumer 1", 2, "E0102", 300],
        ["consumer 2", 1, "E0101", 200]]


def three_done(queue: Queue, handler: Handler) -> None:
    """E0100, E0101, E0102 (100, 200, 300 cents) claimed and completed in order."""
    queue.enqueue_jsonl("\n".join(
        f'{{"event_id": "{e}", "payload": {{"category": "book", "amount_cents": {a}}}}}'
        for e, a in (("E0100", 100), ("E0101", 200), ("E0102", 300))))
    for _ in range(3):
        queue.complete(queue.claim(), handler)


def test_consumer_plot_draws_each_consumers_money_and_every_journal_step(
        queue: Queue, handler: Handler) -> None:
    three_done(queue, handler)
    fig = plot_consumers(_outcomes(), transitions_frame(queue))
    money = sorted(p.get_width() for p in fig.axes[1].patches)
    assert money == [200, 400]
    steps = fig.axes[2]
    assert sum(len(c.get_offsets()) for c in steps.collections) == 6  # 3 claims + 3 ACKs
    assert "commit order" in steps.get_xlabel()


def test_metrics_frame_and_plot_follow_the_samples(queue: Queue, model_clock: ModelClock,
                                                   handler: Handler) -> None:
    queue.enqueue_jsonl(TWO_ORDERS)
    samples = [queue.metrics()]
    model_clock.set(1003)
    samples.append(queue.metrics())
    queue.complete(queue.claim(), handler)
    queue.fail(queue.claim(), "invalid_payload", permanent=True)
    samples.append(queue.metrics())
    frame = metrics_frame(samples)
    assert list(frame.index) == [1000, 1003, 1003]
    assert frame[["ready", "done", "dead", "dead_attempts"]].values.tolist() == [
        [2, 0, 0, 0], [2, 0, 0, 0], [0, 1, 1, 1]]
    assert frame["oldest_ready_age"].tolist()[:2] == [0, 3]
    assert pd.isna(frame["oldest_ready_age"].iloc[2])
    depth, ages = plot_metrics(samples).axes
    assert [t.get_text() for t in depth.get_legend().get_texts()] == ["ready", "leased", "done",
                                                                     "dead"]
    assert len(ages.lines) == 3
    assert ages.get_xlabel() == "model time (s)"
    age = ages.lines[0].get_ydata()
    assert list(age[:2]) == [0, 3] and pd.isna(age[2])  # no message due: a gap, not 0
    assert [t.get_text() for t in ages.texts] == ["none\ndue"]  # once per stretch, shaded
    assert [t.get_fontsize() >= 9 for t in ages.texts] == [True]
    assert [(p.get_x(), p.get_width()) for p in ages.patches] == [(1003, 0.5)]
    assert any(t.get_text().startswith("none due") for t in ages.get_legend().get_texts())


def test_a_true_time_axis_shows_each_backoff_wait_in_whole_seconds(
        queue: Queue, model_clock: ModelClock) -> None:
    queue.enqueue_jsonl(TWO_ORDERS.splitlines()[0])
    while (lease := queue.claim()) is not None:
        outcome = queue.fail(lease, "transient_error")
        if outcome.available_at is not None:
            model_clock.set(outcome.available_at)
    ready = to_hex(STATE_COLORS["ready"])
    true_ax = plot_timeline(queue, true_time=True).axes[0]
    waits = [(p.get_x(), p.get_width()) for p in true_ax.patches
             if to_hex(p.get_facecolor()) == ready and p.get_x() > 1000 - 1e-9]
    assert [w for _, w in waits if w > 0] == [1, 2]  # after the enqueue's zero-width wait
    assert [t.get_text() for t in true_ax.texts if t.get_text().startswith("waits")] == [
        "waits 1 s", "waits 2 s"]
    assert "true scale" in true_ax.get_xlabel()
    spread_ax = plot_timeline(queue).axes[0]
    assert "journal order" in spread_ax.get_xlabel()
    assert not any(t.get_text().startswith("waits") for t in spread_ax.texts)


def test_a_marks_label_is_centred_under_its_cross_and_inside_the_axes(
        stale_story: tuple[Queue, Mark]) -> None:
    queue, rejected = stale_story
    late = Mark(1003, rejected.after_seq + 100, "E0002", "a long label near the right edge")
    fig = plot_timeline(queue, marks=[rejected, late], until=1004)
    ax = fig.axes[0]
    renderer = fig.canvas.get_renderer()
    frame = ax.get_window_extent(renderer)
    crosses = [line for line in ax.lines if line.get_marker() == "X"]
    labels = {t.get_text(): t for t in ax.texts if t.get_text() in (rejected.label, late.label)}
    assert len(crosses) == 2 and set(labels) == {rejected.label, late.label}
    for cross, drawn, lane in zip(crosses, (rejected, late), (0, 1)):  # E0001's lane, E0002's
        label, at = labels[drawn.label], cross.get_xdata()[0]
        assert (cross.get_ydata()[0], label.xy) == (lane, (at, lane + 0.25))  # anchored at it
        box = label.get_window_extent(renderer)
        x = ax.transData.transform((at, 0))[0]
        assert frame.x0 <= box.x0 and box.x1 <= frame.x1
        assert box.x0 <= x <= box.x1  # the label lies right under its cross


def test_the_sequence_diagram_draws_each_step_of_the_slow_worker_story(
        stale_story: tuple[Queue, Mark]) -> None:
    queue, rejected = stale_story
    fig = plot_sequence(queue, "E0001", {1: "worker A", 2: "worker B"},
                        marks=[("worker A", rejected)], lease_seconds=2)
    ax = fig.axes[0]
    texts = [t.get_text() for t in ax.texts if t.get_text()]
    assert texts[:4] == ["clock", "worker A", "worker B", "SQLite"]
    assert "claim -> g1, lease until 1002" in texts and "claim -> g2, lease until 1004" in texts
    assert "g1's lease expired: back to ready" in texts
    assert "complete(g2): effect + ACK" in texts and "stale ACK rejected" in texts
    assert "lease g1 ends" in texts and "stalled" in texts
    bars = lease_bars(ax)
    assert [round(x) for x, _, _ in bars] == [1, 2]  # worker A's lease, then worker B's
    assert ax.get_ylim()[0] > ax.get_ylim()[1]  # time runs down


def exercise_4_story(queue: Queue, handler: Handler) -> list[tuple[str, Mark]]:
    """Exercise 4's story on E0004 (toy): W1 stalls past its lease, W2 takes over and
    sends it dead, W1's late ACK refused; a redrive, W3 claims, W1 refused again, W3
    finishes. Every step after W1's claim happens at model second 1002."""
    queue.enqueue_jsonl(TWO_ORDERS.splitlines()[1].replace("E0002", "E0004"))
    w1 = queue.claim()
    queue.clock.set(1002)  # type: ignore[attr-defined]
    w2 = queue.claim()
    marks = []
    with pytest.raises(LeaseLost):
        queue.complete(w1, handler)
    marks.append(("W1", mark(queue, "E0004", "W1's late ACK refused")))
    queue.fail(w2, "invalid_payload", permanent=True)
    queue.redrive("E0004")
    newer = handler.supporting("toy")
    w3 = queue.claim()
    with pytest.raises(LeaseLost):
        queue.complete(w1, newer)
    marks.append(("W1", mark(queue, "E0004", "W1's late ACK refused again")))
    queue.complete(w3, newer)
    return marks


def draw_exercise_4(queue: Queue, handler: Handler) -> Any:
    marks = exercise_4_story(queue, handler)
    return plot_sequence(queue, "E0004", {1: "W1", 2: "W2", 3: "W3"}, marks=marks,
                         lease_seconds=2)


def lease_bars(ax: Any) -> list[tuple[float, float, float]]:
    """(column, top, bottom) of each lease bar, in drawing order."""
    leased = to_hex(STATE_COLORS["leased"])
    return [(p.get_x() + p.get_width() / 2, p.get_y(), p.get_y() + p.get_height())
            for p in ax.patches if to_hex(p.get_facecolor()) == leased]


def arrow_heights(ax: Any) -> list[float]:
    """The height of every call arrow (an annotation), top to bottom."""
    return sorted(a.xy[1] for a in ax.texts if isinstance(a, Annotation))


def band_tops(ax: Any) -> dict[str, float]:
    """The clock column's label of each model second (or wait), by its height."""
    return {t.get_text(): t.get_position()[1] for t in ax.texts
            if t.get_position()[0] == 0 and t.get_text()[:1].isdigit()}


def test_the_sequence_diagram_ends_each_lease_bar_where_that_lease_ended(
        queue: Queue, handler: Handler) -> None:
    ax = draw_exercise_4(queue, handler).axes[0]
    arrows = arrow_heights(ax)
    assert len(arrows) == 7
    claim_1, claim_2, refused_1, dead_2, claim_3, refused_2, done_3 = arrows
    bars = lease_bars(ax)
    assert len(bars) == 3
    (x1, top1, end1), (x2, top2, end2), (x3, top3, end3) = bars
    assert [round(x) for x in (x1, x2, x3)] == [1, 2, 3]
    ends = [t for t in ax.texts if t.get_text().endswith("ends")]
    assert [t.get_text() for t in ends] == ["lease g1 ends"]  # only W1's lease ran out
    assert (top1, end1) == (claim_1, ends[0].get_position()[1])  # W1's: to its expiry
    assert claim_1 < end1 < claim_2  # ... at 1002, before W2's takeover claim
    assert (top2, end2) == (claim_2, dead_2)  # W2's: to its failure, not to 1004
    assert (top3, end3) == (claim_3, done_3)  # W3's: to its ACK


def test_the_sequence_diagram_draws_every_step_inside_its_model_second(
        queue: Queue, handler: Handler) -> None:
    ax = draw_exercise_4(queue, handler).axes[0]
    tops = band_tops(ax)
    assert list(tops) == ["1000", "1001", "1002"]  # 1001: W1 silent, nothing committed
    assert tops["1000"] < tops["1001"] < tops["1002"]
    arrows = arrow_heights(ax)
    assert len(arrows) == 7
    assert tops["1000"] < arrows[0] < tops["1001"]  # W1's claim at 1000
    assert all(tops["1002"] < y for y in arrows[1:])  # the rest at 1002
    assert max(arrows) < ax.get_ylim()[0]  # inside the picture, which has no 1003


def test_the_sequence_diagram_keeps_every_label_inside_the_axes_and_apart(
        queue: Queue, handler: Handler) -> None:
    fig = draw_exercise_4(queue, handler)
    ax = fig.axes[0]
    renderer = fig.canvas.get_renderer()
    frame = ax.get_window_extent(renderer)
    labels = [(t.get_text(), t.get_window_extent(renderer)) for t in ax.texts if t.get_text()]
    assert len(labels) == 20  # 5 heads, 3 seconds, 7 calls, 2 notes, 2 "stalled", 1 end
    outside = [text for text, box in labels if not (frame.x0 <= box.x0 and box.x1 <= frame.x1
                                                    and frame.y0 <= box.y0 and box.y1 <= frame.y1)]
    assert outside == []
    touching = [(a, b) for (a, box_a), (b, box_b) in itertools.combinations(labels, 2)
                if box_a.overlaps(box_b)]
    assert touching == []
    legend = ax.get_legend().get_window_extent(renderer)
    assert [text for text, box in labels if box.overlaps(legend)] == []


def test_consumer_turns_count_each_change_of_writer_in_commit_order(
        queue: Queue, handler: Handler) -> None:
    three_done(queue, handler)
    journal = transitions_frame(queue)
    assert consumer_turns(journal, consumers_frame(_outcomes())) == 2  # 1, 2, then 1 again
    alone = {"consumer 1": [o for os in _outcomes().values() for o in os], "consumer 2": []}
    assert consumer_turns(journal, consumers_frame(alone)) == 0
    title = plot_consumers(alone, journal).axes[2].get_title()
    assert "the write lock never changed hands" in title


THROUGHPUT_PEERS = [{"name": "persist", "synchronous": "FULL"}, {"name": "lite_full",
                                                                "synchronous": "FULL"},
                    {"name": "huey", "synchronous": "FULL"}, {"name": "lite", "synchronous": "NORMAL"}]
THROUGHPUT_RATIOS = {
    # every dot between 0.5 and 1.8: the log axis holds a single decade (1), the case in
    # which matplotlib labels every minor tick (2x10^-1, 3x10^-1, ...) and they overlap
    "one-decade": {"single": 0.76, "batch_1": 0.6, "batch_10": 4.0, "batch_100": 14.0,
                   "single_normal": 1.8, "persist": 0.7, "lite_full": 0.5, "huey": 0.9,
                   "lite": 1.6},
    "wide": {"single": 0.05, "batch_1": 0.03, "batch_10": 0.3, "batch_100": 2.0,
             "single_normal": 40.0, "persist": 0.02, "lite_full": 0.04, "huey": 0.1,
             "lite": 30.0},
    "this-kind-of-run": {"single": 0.70, "batch_1": 0.69, "batch_10": 4.0, "batch_100": 13.7,
                         "single_normal": 3.66, "persist": 0.69, "lite_full": 0.40, "huey": 1.04,
                         "lite": 3.46},
}


@pytest.mark.parametrize("ratios", THROUGHPUT_RATIOS.values(), ids=THROUGHPUT_RATIOS.keys())
def test_the_throughput_figure_labels_no_minor_tick_and_keeps_its_tick_labels_apart(
        ratios: dict[str, float]) -> None:
    from queue_core.lab.speed import plot_throughput

    fig = plot_throughput({"vs_raw": ratios, "peers": THROUGHPUT_PEERS},
                          ours={"single": "ours: the worker loop", "single_normal": "ours, NORMAL"},
                          peers={p["name"]: p["name"] for p in THROUGHPUT_PEERS})
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            minor = [t.get_text() for t in axis.get_minorticklabels() if t.get_text()]
            assert minor == [], f"{ax.get_title()}: minor tick labels {minor}"
            shown = [t for t in axis.get_majorticklabels() if t.get_text() and t.get_visible()
                     and _inside(ax, axis, t)]
            boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in shown]
            assert [(a, b) for (a, box_a), (b, box_b) in itertools.combinations(boxes, 2)
                    if box_a.overlaps(box_b)] == [], ax.get_title()
        labels = [t.get_text() for t in ax.xaxis.get_majorticklabels()
                  if t.get_text() and _inside(ax, ax.xaxis, t)]
        assert len(labels) >= 2, f"{ax.get_title()}: only {labels} to read the axis by"


def _inside(ax: Any, axis: Any, label: Any) -> bool:
    """Whether a tick label's tick lies within the axis's view (matplotlib keeps
    labels for ticks just outside it, and does not draw them)."""
    low, high = sorted(ax.get_xlim() if axis is ax.xaxis else ax.get_ylim())
    x, y = label.get_position()
    return bool(low <= (x if axis is ax.xaxis else y) <= high)


@pytest.mark.parametrize("ratios", THROUGHPUT_RATIOS.values(), ids=THROUGHPUT_RATIOS.keys())
def test_the_two_figures_at_k_1_are_labelled_apart_inside_the_axes_in_the_order_of_their_points(
        ratios: dict[str, float]) -> None:
    from matplotlib.text import Text

    from queue_core.lab.speed import plot_throughput

    fig = plot_throughput({"vs_raw": ratios, "peers": THROUGHPUT_PEERS},
                          ours={"single": "ours: the worker loop"},
                          peers={p["name"]: p["name"] for p in THROUGHPUT_PEERS})
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    by_k = fig.axes[0]
    labels = [t for t in by_k.texts if ": " in t.get_text()]
    assert [t.get_text() for t in labels] == sorted(
        [f"the worker loop: {ratios['single']:.2f}",
         f"K = 1 (claim, then complete): {ratios['batch_1']:.2f}"],
        key=lambda text: -float(text.rpartition(": ")[2]))  # the higher point's label on top
    boxes = [Text.get_window_extent(t, renderer) for t in labels]  # the text, not its line
    frame, legend = by_k.get_window_extent(renderer), by_k.get_legend().get_window_extent(renderer)
    assert not boxes[0].overlaps(boxes[1]) and boxes[0].y0 > boxes[1].y0
    assert all(frame.x0 <= b.x0 and b.x1 <= frame.x1 and frame.y0 <= b.y0 and b.y1 <= frame.y1
               and not b.overlaps(legend) for b in boxes)
    assert all(t.get_fontsize() >= 10 for t in labels)


# -- notebook 15: how long a message waits -------------------------------------------------

def _priority_load(tmp_path: Any, rule: Any) -> tuple[Queue, list[Any]]:
    from queue_core.lab.story import Load, play_load

    queue = rule(tmp_path / f"{rule.__name__}.sqlite3", clock=ModelClock(1000),
                 synchronous="NORMAL")
    return queue, play_load(queue, Load(bulk=5, urgent_per_second=1, seconds=30, rate=1),
                            sample_every=5)


def test_the_wait_behind_figure_falls_one_a_claim_from_the_import_to_zero_at_the_claim(
        tmp_path: Any) -> None:
    from queue_core.lab.plots import ahead_over_time, plot_wait_behind
    from queue_core.lab.story import Load, play_load

    fifo = Queue(tmp_path / "fifo.sqlite3", clock=ModelClock(1000), synchronous="NORMAL")
    play_load(fifo, Load(bulk=12, urgent_per_second=1, seconds=1, rate=1, urgent=0))
    ahead = ahead_over_time(fifo.transitions(), "E1000")
    assert ahead == {1000 + n: 12 - n for n in range(13)}
    ax = plot_wait_behind(fifo.transitions(), "E1000", title="FIFO").axes[0]
    line, claim = ax.lines
    assert list(line.get_xdata()) == list(ahead) and list(line.get_ydata()) == list(ahead.values())
    assert (list(claim.get_xdata()), list(claim.get_ydata())) == ([1012], [0])
    assert [t.get_text() for t in ax.texts] == ["E1000 waited 12 s"]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "messages still to be claimed before E1000", "E1000 claimed at t=1012"]
    assert "model time (s)" == ax.get_xlabel() and ax.get_title() == "FIFO"


def test_the_oldest_due_figure_draws_each_runs_samples_per_priority_and_its_bound(
        tmp_path: Any) -> None:
    import math

    from queue_core.lab.plots import oldest_due, plot_oldest_due
    from queue_core.lab.story import StrictPriority

    _, strict = _priority_load(tmp_path, StrictPriority)
    _, head = _priority_load(tmp_path, Queue)
    fig = plot_oldest_due({"strict": strict, "head start": head}, {0: "bulk", 9: "refunds"},
                          title="both", bounds={0: 30.0})
    bulk, urgent = fig.axes
    assert [ax.get_title(loc="left") for ax in fig.axes] == ["priority 0: bulk",
                                                              "priority 9: refunds"]
    for ax, priority in ((bulk, 0), (urgent, 9)):
        runs = [line for line in ax.lines if line.get_label() in ("strict", "head start")]
        for line, samples in zip(runs, (strict, head)):
            ages = oldest_due(samples, priority)
            assert list(line.get_xdata()) == list(ages)
            drawn = list(line.get_ydata())
            assert [a for a in drawn if not math.isnan(a)] == \
                [a for a in ages.values() if not math.isnan(a)]
            assert math.isnan(drawn[-1])  # at the end nothing is due: a gap, not an age of 0
        assert "model s" in ax.get_ylabel()
    # strict priority: the bulk orders' oldest age only grows while refunds arrive
    strict_bulk = [a for a in oldest_due(strict, 0).values() if not math.isnan(a)]
    assert strict_bulk == sorted(strict_bulk) and strict_bulk[-1] >= 30
    assert {a for a in oldest_due(strict, 9).values() if not math.isnan(a)} == {0.0}
    dashed = [line for line in bulk.lines if line.get_linestyle() == "--"]
    assert len(dashed) == 1 and list(dashed[0].get_ydata()) == [30.0, 30.0]
    assert "bound (wait_bound): 30 s" in [t.get_text() for t in bulk.get_legend().get_texts()]
    assert not [line for line in urgent.lines if line.get_linestyle() == "--"]
    tight = plot_oldest_due({"head start": head}, {9: "refunds"}, title="near", bounds={9: 61.0})
    assert tight.axes[0].get_ylim()[1] >= 1.1 * 61  # the bound's line clear of the frame
    assert bulk.get_ylim()[0] < 0 and urgent.get_xlabel() == "model time (s)"
