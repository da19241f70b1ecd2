"""The peer queues of ``make bench``: declared in the bench extra, installed by
``make bench``, driven through the same put / get / ack, and our queue's
safety probe passing."""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))

import bench  # noqa: E402
import peer_safety  # noqa: E402
from bench_cases import CheckFailed  # noqa: E402
from peers import ADAPTERS, PEERS, item_of  # noqa: E402
from test_setup import makefile_targets, requirement  # noqa: E402


def test_the_bench_extra_pins_a_major_range_of_exactly_the_peers_measured() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extra = dict(requirement(spec) for spec in project["optional-dependencies"]["bench"])

    assert set(extra) == {adapter.dist for adapter in PEERS.values()}
    assert all(">=" in spec and ",<" in spec for spec in extra.values()), extra


def test_the_set_up_installs_the_test_and_bench_extras_before_bench_runs() -> None:
    targets = makefile_targets()

    assert targets["bench"][0] == ["$(STAMP)"]
    prerequisites, recipe = targets["$(STAMP)"]
    assert "pyproject.toml" in prerequisites
    installed = [re.fullmatch(r"\$\(PY\) -m pip install --quiet -e '\.\[([a-z,]+)\]'", line)
                 for line in recipe]
    assert {"test", "bench"} <= {extra for found in installed if found
                                 for extra in found.group(1).split(",")}


@pytest.mark.parametrize("name", list(ADAPTERS))
def test_each_queue_hands_out_what_was_put_once_then_nothing(name: str, tmp_path: Path) -> None:
    adapter = ADAPTERS[name]
    assert adapter.installed(), f"{adapter.dist} is missing: make test installs it (.[bench])"
    for variant in adapter.variants:
        queue = adapter(tmp_path / f"{variant}.sqlite3", variant)
        queue.put([item_of(i) for i in range(3)])
        got = []
        while (taken := queue.get()) is not None:
            queue.ack(taken[0])
            got.append(taken[1])
        pragmas = queue.pragmas()
        queue.close()

        assert sorted(got) == ["E0000", "E0001", "E0002"]
        assert pragmas["journal_mode"] in ("WAL", "DELETE", "TRUNCATE", "PERSIST", "MEMORY", "OFF")
        assert pragmas["synchronous"] in ("OFF", "NORMAL", "FULL", "EXTRA")


def test_our_queue_passes_the_two_consumer_and_crash_probes(tmp_path: Path) -> None:
    shared = peer_safety.two_consumers("queue_core", tmp_path, 20, "t")
    crashed = peer_safety.crash_all(["queue_core"], tmp_path)["queue_core"]

    assert (shared["duplicates"], shared["missing"], shared["errors"]) == (0, 0, [])
    assert (crashed["crash"], crashed["others_missing"], crashed["crash_errors"]) == \
        ("redelivered", 0, [])
    assert (shared["journal_mode"], shared["synchronous"]) == ("WAL", "FULL")


def test_a_duplicate_or_a_lost_crash_of_ours_fails_the_run() -> None:
    clean = {"duplicates": [0, 0], "missing": [0, 0], "errors": 0, "crash": "redelivered",
             "others_missing": 0, "n": 20}
    bench.check_our_safety(clean)
    for change in ({"duplicates": [0, 1]}, {"missing": [2, 0]}, {"crash": "lost"}):
        with pytest.raises(CheckFailed):
            bench.check_our_safety(dict(clean, **change))


def test_the_quick_run_keeps_its_keys_and_leaves_the_peers_out() -> None:
    results = bench.run(quick=True)

    assert {"rates", "end_to_end", "vs_raw", "samples", "labels", "sizes", "ratios", "slices",
            "memory", "parent_rss_mb", "raw_range"} <= set(results)
    assert results["peers"] == [] and results["safety"] == {}
    assert not any(name.startswith("peer_") for name in results["rates"])
    assert bench.report(results)
