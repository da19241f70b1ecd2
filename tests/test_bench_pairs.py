"""How ``make bench`` compares several workers, and a prune beside one, with one worker:
each such slice between two slices of one worker on the same work, and its rate
over theirs (``bench.interleave``), so that a disk that changes speed from one
second to the next moves both sides of each ratio alike."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))

import bench  # noqa: E402
import bench_report  # noqa: E402
from bench_cases import Case, Slice  # noqa: E402


@dataclass
class Scripted(Case):
    """A case whose slices take the seconds it is given, in turn (no database)."""

    seconds: list[float] = field(default_factory=list, kw_only=True)
    log: list[str] = field(default_factory=list, kw_only=True)

    def slice(self) -> Slice:
        self.log.append(self.name)
        took = self.seconds[len(self.slices) % len(self.seconds)]
        return Slice(100, took, took)


def cases(log: list[str], disk: list[float]) -> tuple[dict[str, Scripted], Scripted]:
    """One worker, 2 and 4 workers, a prune beside one worker, another case, and raw
    commits; ``disk``: how slow each successive slice of one worker is."""
    made = {name: Scripted(name, name, seconds=seconds, log=log) for name, seconds in (
        ("single", disk), ("two_workers", [0.2]), ("four_workers", [0.25]),
        ("single_pruned", [0.4]), ("batch_10", [0.01]))}
    return made, Scripted("raw", "raw", seconds=[0.05], log=[])


def test_each_paired_case_runs_between_two_slices_of_one_worker_in_a_turning_order() -> None:
    log: list[str] = []
    made, raw = cases(log, [0.2])
    order = list(made.values())

    rounds = [[case.name for case in bench.round_order(order, n)] for n in range(3)]

    for names in rounds:
        assert sorted(names) == sorted(["single"] * 4 + ["two_workers", "four_workers",
                                                         "single_pruned", "batch_10"])
        paired = names[:7]
        assert paired[::2] == ["single"] * 4 and "single" not in paired[1::2]
        assert names[7:] == ["batch_10"]
    assert len({tuple(names[1:7:2]) for names in rounds}) == 3  # the paired cases' order turns


def test_a_paired_case_is_judged_against_the_one_worker_just_before_and_after_it() -> None:
    log: list[str] = []
    # one worker's slices alternate 0.2 s and 0.1 s for 100 messages: a disk that
    # doubles its speed from one slice to the next
    made, raw = cases(log, [0.2, 0.1])

    bench.interleave(list(made.values()), {"raw": raw}, rounds=1, budget_s=60.0,
                     say=lambda text: None)

    assert log == ["single", "two_workers", "single", "four_workers", "single",
                   "single_pruned", "single", "batch_10"]
    # each paired slice's rate over the mean of its neighbours' rates (500 and 1000 /s)
    assert made["two_workers"].paired == [500 / 750]
    assert made["four_workers"].paired == [400 / 750]
    assert made["single_pruned"].paired == [250 / 750]
    assert made["single"].paired == [] and made["batch_10"].paired == []
    results = bench_report.summarise(list(made.values()), [raw])
    assert results["paired"] == {"two_workers": 500 / 750, "four_workers": 400 / 750,
                                 "single_pruned": 250 / 750}
    rows = {row["name"]: row for row in bench_report.evaluate(results)}
    assert rows["SQLite 2 worker processes vs 1"]["value"] == 500 / 750
    assert rows["SQLite 4 worker processes vs 1"]["value"] == 400 / 750
