"""The slow-disk shim (every fsync and fdatasync delayed and counted) and the
flush-latency curve built on it. Where no C compiler exists the shim cannot
be built: those tests skip with that reason; anywhere else a shim that does
not delay or count is a failure."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from queue_core.lab.speed import flushcurve, slowdisk

PROBE = """
import json, os, sys, time
from queue_core.lab.speed.slowdisk import flush_calls
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT)
before, started = flush_calls(), time.perf_counter()
for _ in range(5):
    os.write(fd, b"x")
    os.fsync(fd)
    os.fdatasync(fd)
print(json.dumps([(time.perf_counter() - started) / 10, flush_calls() - before]))
"""


def shim_or_skip() -> Path:
    try:
        return slowdisk.shim_library()
    except slowdisk.NoShim as exc:
        if "no C compiler" in str(exc) or "LD_PRELOAD" in str(exc):
            pytest.skip(str(exc))
        raise


def test_the_shim_delays_and_counts_every_fsync_and_fdatasync_of_a_child(tmp_path: Path) -> None:
    shim_or_skip()
    env = slowdisk.shim_env(3000)
    done = subprocess.run([sys.executable, "-c", PROBE, str(tmp_path / "f")], env=env,
                          capture_output=True, text=True, check=True, timeout=60)
    per_flush, counted = json.loads(done.stdout)

    assert counted == 10
    assert per_flush >= 0.003


def test_without_the_shim_a_process_counts_nothing_and_is_not_delayed() -> None:
    assert slowdisk.flush_calls() is None  # the test process was not started with it
    assert "LD_PRELOAD" not in os.environ or "slowsync" not in os.environ["LD_PRELOAD"]


def test_shim_env_keeps_what_was_preloaded_and_sets_the_delay() -> None:
    shim_or_skip()
    env = slowdisk.shim_env(0, base={"LD_PRELOAD": "/other.so", "PATH": "/bin"})

    assert env["LD_PRELOAD"] == f"{slowdisk.LIBRARY} /other.so"
    assert (env["SLOWSYNC_US"], env["PATH"]) == ("0", "/bin")


def test_the_flush_curve_counts_one_fsync_per_message_and_meets_its_slow_point() -> None:
    shim_or_skip()
    curve = flushcurve.measure_flush_curve(messages=60)

    consume, each, raw = curve.costs["consume"], curve.costs["each"], curve.costs["raw"]
    assert raw.fsyncs == 1.0
    assert consume.fsyncs is not None and 1.0 <= consume.fsyncs <= 1.2
    assert each.fsyncs is not None and 1.0 <= each.fsyncs <= 1.2
    assert 0 < raw.cpu_s < consume.cpu_s < 0.05 and 0 < raw.cpu_s < each.cpu_s < 0.05
    fast, slow = curve.points
    assert slow.flush_s >= 0.002 and fast.flush_s > 0  # the shim's 2 ms on top of the disk's
    assert curve.skipped is None
    # as the flush grows, one fsync each: the predicted ratio climbs towards 1
    assert curve.ratio(0.0001) < curve.ratio(0.002) < curve.ratio(0.01) < 1.0
    assert curve.ratio(0.002, "each") < 1.0
    assert (curve.messages, curve.slices) == (60, 10)
    for point in curve.points:  # each slice's ratio kept: the spread the figure comes from
        assert len(point.slice_ratios) == curve.slices and min(point.slice_ratios) > 0
        assert min(point.slice_ratios) - 1e-9 <= point.ratio <= max(point.slice_ratios) + 1e-9
    figure = flushcurve.plot_flush_curve(curve)
    assert len(figure.axes) == 2
    import matplotlib.pyplot as plt
    plt.close(figure)
    frame = flushcurve.flush_curve_frame(curve, latencies_ms=(1, 2))
    assert list(frame.index) == [1, 2] and frame["worker loop / raw"].between(0, 1).all()
    assert list(frame.columns) == ["worker loop (drain)", "claim, then ACK", "raw commit",
                                   "worker loop / raw", "worker loop / claim, then ACK"]
    said = " ".join(flushcurve.describe_flush_curve(curve).split())
    assert (f"Fsyncs per message: worker loop (drain) {consume.fsyncs:.2f}, claim, then ACK "
            f"{each.fsyncs:.2f}, raw commit 1.00.") in said
    assert "2 ms added to every flush" in said


def test_without_the_shim_only_this_machines_point_is_measured_and_the_reason_is_said(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(slowdisk, "LIBRARY", tmp_path / "build" / "slowsync.so")
    monkeypatch.setenv("CC", "no-such-compiler")  # the shim is not built and cannot be
    curve = flushcurve.measure_flush_curve(messages=40)

    assert curve.skipped == "no C compiler (no-such-compiler) to build the slow-disk shim"
    [here] = curve.points
    assert here.fsyncs == {"consume": None, "each": None, "raw": None}
    assert here.rates["consume"] > 0 and here.rates["each"] > 0
    said = " ".join(flushcurve.describe_flush_curve(curve).split())
    assert "No curve and no slow-disk point: no C compiler (no-such-compiler)" in said
    with pytest.raises(slowdisk.NoShim):
        curve.ratio(0.001)  # no fsyncs counted: nothing to predict with
    import matplotlib.pyplot as plt
    figure = flushcurve.plot_flush_curve(curve)
    assert "no C compiler" in figure.get_suptitle()
    plt.close(figure)


@pytest.mark.parametrize("loop_ms, each_ms, says", [
    (0.100, 0.120, "The worker loop spent 0.020 ms less CPU per message than claim then ACK"),
    (0.208, 0.194, "On this run the worker loop's CPU per message came out 0.014 ms above claim "
                   "then ACK's"),
], ids=["saved", "swapped-by-load"])
def test_the_flush_curve_says_what_the_fused_step_saved_here_or_that_the_load_hid_it(
        loop_ms: float, each_ms: float, says: str) -> None:
    assert flushcurve._fused_gap(loop_ms / 1000, each_ms / 1000).startswith(says)
