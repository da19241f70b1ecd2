"""The crash sweep: every step of the protocol survives a real crash, and the
same sweep reports each deliberately broken protocol at the step it breaks."""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from queue_core import ModelClock, Queue
from queue_core.lab.story.child import run_child
from queue_core.crashpoints import POINTS, arm, armed
from queue_core.lab.story.contrasts import PROTOCOLS, REAL
from queue_core.lab.sweeps.sweep import (BATCH, EXPECTED_TOTAL, LEASE_SECONDS, MIXED_PRIORITIES,
                                         START, STEPS, SweepRow, audit, current_handler,
                                         enqueue_batch, plot_sweep, run_sweep, run_to_completion,
                                         sweep_frame)

from conftest import ROOT, read_back


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], SweepRow]:
    rows = run_sweep(workdir=tmp_path_factory.mktemp("sweep"), jobs=2)
    return {(row.protocol, row.step): row for row in rows}


def outcomes(sweep: dict[tuple[str, str], SweepRow], protocol: str) -> dict[str, str]:
    return {step: row.outcome for (name, step), row in sweep.items() if name == protocol}


def test_the_sweep_covers_every_named_crash_point_and_every_protocol(sweep):
    assert set(POINTS) <= set(STEPS)
    assert {name for name, _ in sweep} == set(PROTOCOLS)
    assert len(sweep) == len(PROTOCOLS) * len(STEPS)


def test_a_crash_at_every_step_of_the_protocol_leaves_each_effect_once_and_no_message_lost(sweep):
    steps = outcomes(sweep, "protocol")
    assert steps == {step: ("n/a" if step == "complete.between_transactions" else "ok")
                     for step in STEPS}
    for step in REAL.points:
        assert sweep["protocol", step].total == EXPECTED_TOTAL == 20000


def test_the_sweep_reports_mark_then_write_losing_money_once_the_mark_has_committed(sweep):
    bad = {s: o for s, o in outcomes(sweep, "mark then write").items() if o not in ("ok", "n/a")}
    assert bad == {"complete.between_transactions": "lost money",
                   "complete.after_insert": "lost money"}
    assert sweep["mark then write", "complete.after_insert"].total == 17000  # toy 3000 lost


def test_the_sweep_reports_write_then_mark_doubling_money_before_the_mark_commits(sweep):
    bad = {s: o for s, o in outcomes(sweep, "write then mark").items() if o not in ("ok", "n/a")}
    assert bad == {"complete.between_transactions": "doubled money",
                   "complete.before_commit": "doubled money"}
    assert sweep["write then mark", "complete.before_commit"].total == 23000


def test_the_sweep_reports_a_missing_generation_check_when_a_slow_worker_wakes_up(sweep):
    bad = {s: o for s, o in outcomes(sweep, "no generation check").items()
           if o not in ("ok", "n/a")}
    assert bad == {"stale.ack": "stale ACK accepted", "stale.fail": "lost money"}
    assert sweep["no generation check", "stale.fail"].total == 17000
    assert "slow worker: dead invalid_payload" in sweep["no generation check", "stale.fail"].detail
    assert "slow worker: lost stale_generation" in sweep["protocol", "stale.fail"].detail


def test_a_queue_left_with_an_abandoned_lease_is_reported_stuck_until_a_worker_recovers_it(
        db_path: Path):
    clock = ModelClock(START)
    queue = Queue(db_path, clock=clock, lease_seconds=LEASE_SECONDS)
    queue.enqueue_jsonl(BATCH)
    child = run_child(db_path, now=START, lease_seconds=LEASE_SECONDS, crash_at="claim.after_commit")
    assert child.crashed
    assert read_back(db_path, "SELECT event_id, state FROM messages WHERE state != 'ready'") == [
        ("E0001", "leased")]
    assert audit(db_path)[0] == "stuck"
    assert run_to_completion(queue, clock, current_handler())
    assert audit(db_path) == ("ok", 20000, "every effect once: 20000")
    assert clock.now() == START + 2  # the abandoned lease (2 s) had to expire first


def test_the_audit_reports_an_effect_written_behind_the_protocol_as_doubled_money(db_path: Path):
    clock = ModelClock(START)
    queue = Queue(db_path, clock=clock, lease_seconds=LEASE_SECONDS)
    queue.enqueue_jsonl(BATCH)
    assert run_to_completion(queue, clock, current_handler())
    assert audit(db_path)[0] == "ok"
    conn = sqlite3.connect(db_path)
    conn.execute("CREATE TABLE naive_ledger (seq INTEGER PRIMARY KEY, event_id TEXT, "
                 "category TEXT, amount_cents INTEGER)")
    conn.execute("INSERT INTO naive_ledger (event_id, category, amount_cents) "
                 "VALUES ('E0002', 'book', 10000)")
    conn.commit()
    conn.close()
    assert audit(db_path) == ("doubled money", 30000, "E0002 written twice: 30000")


def test_arming_counts_arrivals_and_refuses_unknown_points_and_bad_counts():
    try:
        arm("complete.after_insert", after=3)
        assert armed() == "complete.after_insert"
        with pytest.raises(ValueError):
            arm("complete.after_lunch")
        with pytest.raises(ValueError):
            arm("claim.after_begin", after=0)
    finally:
        arm(None)
    assert armed() is None


def test_a_worker_armed_for_its_third_arrival_finishes_two_messages_before_it_dies(db_path: Path):
    queue = Queue(db_path, clock=ModelClock(START), lease_seconds=LEASE_SECONDS)
    queue.enqueue_jsonl(BATCH)
    child = run_child(db_path, now=START, lease_seconds=LEASE_SECONDS, mode="drain",
                      accept=["toy"], crash_at="complete_and_claim.after_insert", crash_after=3)
    assert child.crashed
    assert [(o.event_id, o.kind) for o in child.outcomes] == [("E0001", "done"), ("E0002", "done")]
    assert read_back(db_path, "SELECT event_id, state FROM messages WHERE state != 'ready'") == [
        ("E0001", "done"), ("E0002", "done"), ("E0003", "leased")]
    assert read_back(db_path, "SELECT sum(amount_cents), count(*) FROM effects") == [(13000, 2)]


def test_the_sweep_table_and_picture_show_steps_down_protocols_across_and_a_legend(sweep):
    rows = list(sweep.values())
    table = sweep_frame(rows)
    assert list(table.index) == list(STEPS)
    assert list(table.columns) == list(PROTOCOLS)
    assert table.loc["complete.before_commit", "write then mark"] == "doubled money"
    fig = plot_sweep(rows)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == list(STEPS)
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "ok", "lost money", "doubled money", "stale ACK accepted", "n/a"]
    import matplotlib.pyplot as plt
    plt.close(fig)


def test_importing_the_sweep_does_not_import_pandas_or_matplotlib():
    code = ("import sys, queue_core.lab.sweeps.sweep, queue_core.lab.story.contrasts, queue_core.lab.sweeps.stress; "
            "print(sorted(m for m in ('pandas', 'matplotlib') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_crash_on_a_later_message_is_recovered_too_and_an_unreached_arrival_is_not_applicable(
        tmp_path: Path):
    rows = run_sweep(protocols=["protocol", "write then mark"], workdir=tmp_path,
                     steps=["complete.before_commit", "fail.before_commit"], crash_after=2)
    assert [(r.protocol, r.step, r.outcome, r.total) for r in rows] == [
        ("protocol", "complete.before_commit", "ok", 20000),  # killed while ACKing E0002
        ("protocol", "fail.before_commit", "ok", 20000),  # killed failing E0005 for good
        ("write then mark", "complete.before_commit", "doubled money", 30000),  # E0002 twice
        ("write then mark", "fail.before_commit", "ok", 20000)]
    third = run_sweep(protocols=["protocol"], steps=["fail.before_commit"], crash_after=3,
                      workdir=tmp_path)
    assert [(r.outcome, r.detail) for r in third] == [("n/a", "reached fewer than 3 times")]


@pytest.mark.parametrize("name", [name for name, p in PROTOCOLS.items() if p.broken])
def test_a_broken_protocol_refuses_a_batch_ack_and_changes_nothing(db_path: Path, name: str):
    queue = PROTOCOLS[name].open(db_path, clock=ModelClock(START), lease_seconds=LEASE_SECONDS)
    queue.enqueue_jsonl(BATCH)
    leases = queue.claim_batch(2)
    before = read_back(db_path, "SELECT event_id, state, generation FROM messages ORDER BY 1")

    with pytest.raises(TypeError, match="one lease at a time"):
        queue.complete_batch(leases, current_handler())

    assert read_back(db_path, "SELECT event_id, state, generation FROM messages ORDER BY 1") == before
    assert read_back(db_path, "SELECT count(*) FROM effects") == [(0,)]


def test_notebook_07_explains_every_crash_point_in_its_table_in_the_order_a_message_meets_them():
    cells = json.loads((ROOT / "notebooks" / "07_crash_sweep.ipynb").read_text(encoding="utf-8"))
    table = next("".join(c["source"]) for c in cells["cells"] if c["cell_type"] == "markdown"
                 and "| step | what has happened when the worker dies |" in "".join(c["source"]))
    rows = re.findall(r"^\| `([a-z_.]+)` \|", table, flags=re.MULTILINE)
    assert rows == list(POINTS), "give each crash point its own row in notebook 07's table, in order"


def test_each_outcome_written_in_the_sweep_picture_fits_inside_its_cell(sweep):
    import matplotlib.pyplot as plt

    fig = plot_sweep(list(sweep.values()))
    ax = fig.axes[0]
    renderer = fig.canvas.get_renderer()
    cell_width = abs(ax.transData.transform((0.96, 0))[0] - ax.transData.transform((0, 0))[0])
    written = [t for t in ax.texts if t.get_text()]
    assert {t.get_text().replace("\n", " ") for t in written} == {
        "lost money", "doubled money", "stale ACK accepted"}
    assert all(t.get_window_extent(renderer).width < cell_width for t in written)
    plt.close(fig)


# -- mixed priorities: the same events, claimed in another order -------------------------------

def claim_order(db: Path, priorities: dict[str, int] | None) -> list[str]:
    """The events as a worker claims them, from the journal, once run to completion."""
    clock = ModelClock(START)
    queue = Queue(db, clock=clock, lease_seconds=LEASE_SECONDS)
    enqueue_batch(queue, priorities)
    assert run_to_completion(queue, clock, current_handler())
    assert audit(db) == ("ok", EXPECTED_TOTAL, f"every effect once: {EXPECTED_TOTAL}")
    return [row[0] for row in read_back(db, "SELECT event_id FROM transitions "
                                            "WHERE reason = 'claimed' ORDER BY seq")]


def test_the_mixed_priorities_store_each_priority_and_change_the_order_of_the_claims(
        tmp_path: Path):
    assert claim_order(tmp_path / "one.sqlite3", None) == [
        "E0001", "E0002", "E0003", "E0004", "E0005", "E0003"]
    mixed = tmp_path / "mixed.sqlite3"
    assert claim_order(mixed, MIXED_PRIORITIES) == [
        "E0001", "E0003", "E0004", "E0002", "E0005", "E0003"]
    assert dict(read_back(mixed, "SELECT event_id, priority FROM messages")) == {
        "E0001": 9, "E0002": 0, "E0003": 4, "E0004": 2, "E0005": 0}


def test_with_mixed_priorities_every_protocol_meets_every_step_as_with_one(sweep, tmp_path: Path):
    rows = run_sweep(workdir=tmp_path, priorities=MIXED_PRIORITIES)

    mixed = {(r.protocol, r.step): r for r in rows}
    protocol = {step: r.outcome for (name, step), r in mixed.items() if name == "protocol"}
    assert protocol == {step: ("n/a" if step == "complete.between_transactions" else "ok")
                        for step in STEPS}
    assert {r.total for (name, _), r in mixed.items() if name == "protocol" and
            r.outcome == "ok"} == {EXPECTED_TOTAL}
    assert "slow worker: lost stale_generation" in mixed["protocol", "stale.fail"].detail
    # each broken contrast is caught where, and as, it is with one priority
    assert {cell: (r.outcome, r.total) for cell, r in mixed.items()} == {
        cell: (r.outcome, r.total) for cell, r in sweep.items()}
