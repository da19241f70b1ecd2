"""The reference scenario of SPEC section 6, with its real crashing child
process: every figure the course quotes, and the file read back afterwards."""

from __future__ import annotations

from pathlib import Path

import pytest

from observe import effects, expect, ledger, reasons, row
from queue_core import EnqueueResult
from queue_core.lab.story.demo import DemoReport, run_scenario


def test_the_reference_scenario_reproduces_every_figure_of_the_course(tmp_path: Path) -> None:
    said: list[str] = []

    report = run_scenario(tmp_path, say=said.append)

    assert isinstance(report, DemoReport)
    assert report.first_enqueue == EnqueueResult(inserted=4, duplicates=1)
    assert report.crash_exit_code == 86
    assert report.snapshot.as_dict() == {
        "states": {"ready": 1, "leased": 1, "done": 1, "dead": 1},
        "effects": 1, "totals": {"book": 10000}, "total": 10000, "pruned": 0, "ids": "course"}
    assert report.final.as_dict() == {
        "states": {"ready": 0, "leased": 0, "done": 3, "dead": 1},
        "effects": 3, "totals": {"book": 15000, "pen": 2000}, "total": 17000, "pruned": 0, "ids": "course"}
    assert report.again == EnqueueResult(inserted=0, duplicates=5)
    assert report.after_redrive_without_fix.as_dict() == report.final.as_dict()
    assert report.after_fix.as_dict() == {
        "states": {"ready": 0, "leased": 0, "done": 4, "dead": 0},
        "effects": 4, "totals": {"book": 15000, "pen": 2000, "toy": 3000}, "total": 20000, "pruned": 0, "ids": "course"}
    narrated = [text.split(" (")[0] for text in said
                if text.startswith(("snapshot:", "final:", "after the fix:"))]
    assert narrated == ["snapshot: total=10000", "final: total=17000", "after the fix: total=20000"]


def test_the_scenario_file_read_back_holds_each_effect_once_and_the_right_generations(
        tmp_path: Path) -> None:
    run_scenario(tmp_path, say=lambda text: None)
    db = tmp_path / "demo.sqlite3"

    assert ledger(db) == expect(total=20000, effects=4, done=4)
    assert effects(db) == {"E0001": ("book", 10000), "E0002": ("pen", 2000),
                           "E0003": ("book", 5000), "E0004": ("toy", 3000)}
    generations = {event_id: row(db, event_id)["generation"]
                   for event_id in ("E0001", "E0002", "E0003", "E0004")}
    assert generations == {"E0001": 1, "E0002": 2, "E0003": 2, "E0004": 3}
    assert reasons(db, "E0003") == [
        (None, "ready", 0, "enqueued"),
        ("ready", "leased", 1, "claimed"),  # by the child process that then crashed
        ("leased", "ready", 1, "lease_expired"),
        ("ready", "leased", 2, "claimed"),
        ("leased", "done", 2, "completed")]
    assert [r[3] for r in reasons(db, "E0004")] == [
        "enqueued", "claimed", "invalid_payload", "redrive", "claimed", "invalid_payload",
        "redrive", "claimed", "completed"]


def test_the_scenario_played_again_on_its_queue_is_refused_and_changes_nothing(
        tmp_path: Path) -> None:
    # A second run of notebook 00's cell replayed onto the same file: every line a
    # duplicate, nothing due, and a bare AssertionError from inside the lab.
    run_scenario(tmp_path, say=lambda text: None)
    db = tmp_path / "demo.sqlite3"
    before = db.read_bytes()

    with pytest.raises(ValueError, match=r"^the reference scenario starts on a new, empty queue, "
                       r"and demo\.sqlite3 already holds 4 messages \(the scenario was played "
                       r"on it before\): make a new one"):
        run_scenario(tmp_path, say=lambda text: None)

    assert db.read_bytes() == before
    assert ledger(db) == expect(total=20000, effects=4, done=4)
