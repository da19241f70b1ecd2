"""The power-loss sweep: every WAL image a power cut can leave is recovered,
audited and finished by a fresh worker; at FULL nothing a caller was told is
lost, at NORMAL an acknowledged ACK can vanish."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from queue_core.lab.sweeps.powerloss import PowerLossReport, run_powerloss
from queue_core.lab.sweeps.wal import Frame, Prefix, prefixes, read_wal, wal_length

REFERENCE_KINDS = ["enqueue", "claim", "ACK", "claim", "fail", "claim", "claim", "fail", "claim",
                   "ACK", "claim", "ACK", "redrive", "claim", "fail", "redrive", "claim", "ACK"]


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> PowerLossReport:
    return run_powerloss(workdir=tmp_path_factory.mktemp("powerloss"))


def test_the_protocol_keeps_every_promise_through_every_power_cut_in_both_scenarios(
        report: PowerLossReport) -> None:
    for scenario, money in (("reference demo", 20000), ("two workers", 20000)):
        rows = report.select(scenario, "FULL")
        assert rows and {row.outcome for row in rows} == {"ok"}
        # every image that holds the messages ends with each of them once and all the money
        assert {row.total for row in rows if row.kept >= 1} == {money}
        assert {row.total for row in rows if row.kept == 0} == {0}
    assert report.violations == []


def test_the_reference_scenario_offers_a_pinned_number_of_images(report: PowerLossReport) -> None:
    commits = report.commits["reference demo", "FULL"]
    assert [c.kind for c in commits] == REFERENCE_KINDS
    assert [c.durable for c in commits] == [kind != "claim" for kind in REFERENCE_KINDS]
    assert not any(c.durable for c in report.commits["reference demo", "NORMAL"])
    # FULL: each cut keeps everything, or also drops the claims since the last fsync
    assert len(report.select("reference demo", "FULL")) == 28
    # NORMAL: any commit boundary up to the cut, 19 * 20 / 2
    assert len(report.select("reference demo", "NORMAL")) == 190
    assert len(report.select("two workers", "FULL")) == 19
    assert len(report.select("two workers", "NORMAL")) == 91


def test_at_normal_an_acknowledged_ack_vanishes_and_the_work_is_done_again(
        report: PowerLossReport) -> None:
    lost = report.select("reference demo", "NORMAL")
    assert report.lost_acks and all(row.synchronous == "NORMAL" for row in report.lost_acks)
    # E0001's ACK returned (3 commits), the image keeps only its claim (2)
    row = next(r for r in lost if (r.cut, r.kept) == (3, 2))
    assert (row.kind, row.durable, row.outcome) == ("claim", False, "lost acknowledged ACK")
    assert row.detail == "returned, then gone: ACK of E0001; the next worker did E0001 again"
    assert row.total == 20000  # one effect each inside the file: the broken promise is outside
    assert [r for r in report.violations if r.synchronous == "NORMAL"] == []


def test_a_cut_never_keeps_less_than_the_last_fsynced_commit() -> None:
    frames = [Frame(2, 0), Frame(5, 5),   # commit 1, fsynced (an enqueue)
              Frame(2, 0), Frame(3, 5),   # commit 2, not fsynced (a claim)
              Frame(4, 6),                # commit 3, fsynced (an ACK)
              Frame(3, 0), Frame(2, 6)]   # commit 4, not fsynced (a claim)
    offered = prefixes(frames, [True, False, True, False])

    assert offered == [Prefix(0, 0, 0), Prefix(1, 1, 2), Prefix(2, 1, 2), Prefix(2, 2, 4),
                       Prefix(3, 3, 5), Prefix(4, 3, 5), Prefix(4, 4, 7)]
    assert all(frames[p.frames - 1].is_commit for p in offered if p.frames)  # whole commits only
    assert Prefix(3, 2, 4) not in offered and Prefix(4, 2, 4) not in offered  # inside an fsync
    with pytest.raises(ValueError):
        prefixes(frames, [True, False])


def test_wal_frames_are_read_from_their_headers(tmp_path: Path) -> None:
    page_size = 512
    header = (0x377F0682).to_bytes(4, "big") + (3007000).to_bytes(4, "big") + \
        page_size.to_bytes(4, "big") + bytes(20)
    frame = lambda page, size: page.to_bytes(4, "big") + size.to_bytes(4, "big") + bytes(16 + page_size)
    wal = tmp_path / "x.sqlite3-wal"
    wal.write_bytes(header + frame(2, 0) + frame(1, 7) + frame(3, 0)[:100])  # a torn last frame

    assert read_wal(wal) == (page_size, [Frame(2, 0), Frame(1, 7)])
    assert wal_length(page_size, 2) == 32 + 2 * (24 + page_size)


def test_the_picture_has_a_row_per_scenario_and_durability_and_the_sweep_loads_no_plotting(
        report: PowerLossReport) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from queue_core.lab.sweeps.powerloss import plot_powerloss, powerloss_frame

    fig = plot_powerloss(report)
    labels = [tick.get_text().split("\n")[0] for tick in fig.axes[0].get_yticklabels()]
    plt.close(fig)
    assert labels == ["reference demo", "reference demo", "two workers", "two workers"]
    assert len(powerloss_frame(report)) == len(report.rows) == 28 + 190 + 19 + 91

    code = ("import sys, queue_core.lab.sweeps.powerloss; "
            "print(sorted(m for m in ('pandas', 'matplotlib') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60)
    assert (result.returncode, result.stdout.strip()) == (0, "[]"), result.stderr
