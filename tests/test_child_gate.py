"""A starting gate lets real worker processes begin a race together."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import DATA
from queue_core import Queue
from queue_core.lab.story import child
from queue_core.lab.plots import consumer_turns, consumers_frame, transitions_frame
from queue_core.lab.story.child import ChildResult, collect, open_gate, run_child


def race(queue: Queue, gate: Path, *, work_ms: int = 0) -> list[ChildResult]:
    """Two worker processes, released together, drain twenty.jsonl from ``queue``."""
    queue.enqueue_file(DATA / "twenty.jsonl")
    gate.mkdir()
    workers = [run_child(queue.path, now=1000, lease_seconds=2, mode="drain", wait=False,
                         gate=gate, work_ms=work_ms) for _ in range(2)]
    open_gate(gate, len(workers))
    return [collect(worker) for worker in workers]  # type: ignore[arg-type]


def test_two_gated_workers_drain_twenty_events_each_effect_exactly_once(
        queue: Queue, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    results = race(queue, gate)
    assert [r.exit_code for r in results] == [0, 0]
    assert len(list(gate.glob("ready-*"))) == 2 and (gate / "go").exists()
    done = sorted(o.event_id for r in results for o in r.outcomes if o.kind == "done")
    assert done == [f"E{n:04d}" for n in range(100, 120)]
    status = queue.status()
    assert (status.total, status.effects, status.states["done"]) == (21000, 20, 20)


def test_workers_that_work_outside_the_lock_take_turns_and_still_finish_each_event_once(
        queue: Queue, tmp_path: Path) -> None:
    results = race(queue, tmp_path / "gate", work_ms=20)
    reports = {f"consumer {n}": r.outcomes for n, r in enumerate(results, 1)}

    assert consumer_turns(transitions_frame(queue), consumers_frame(reports)) >= 2
    done = sorted(o.event_id for r in results for o in r.outcomes if o.kind == "done")
    assert done == [f"E{n:04d}" for n in range(100, 120)]
    status = queue.status()
    assert (status.total, status.effects, status.states["done"]) == (21000, 20, 20)


def test_open_gate_gives_up_when_too_few_workers_arrive(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(child, "GATE_TIMEOUT_SECONDS", 0.05)
    (tmp_path / "ready-1").touch()
    with pytest.raises(TimeoutError):
        open_gate(tmp_path, 2)
    assert not (tmp_path / "go").exists()


def test_a_drain_worker_that_works_outside_the_lock_runs_the_worker_loop(
        queue: Queue, tmp_path: Path) -> None:
    """Its ACK claims the next message (``complete_and_claim``), as ``queue-core
    work``'s does: the loop's own step is met, the plain ACK's never."""
    queue.enqueue_file(DATA / "twenty.jsonl")
    fused = run_child(queue.path, now=1000, lease_seconds=2, mode="drain", work_ms=1,
                      crash_at="complete_and_claim.after_commit")
    plain = run_child(queue.path, now=1000, lease_seconds=2, mode="drain", work_ms=1,
                      crash_at="complete.after_begin")

    assert fused.crashed  # type: ignore[union-attr]
    assert [o.event_id for o in fused.outcomes] == []  # died holding E0101, having ACKed E0100
    assert not plain.crashed and len(plain.outcomes) == 18  # type: ignore[union-attr]
    assert queue.status().states["done"] == 19 and queue.message("E0101").state == "leased"
