"""Every commit of three messages, consumed with claim then complete and
with the worker loop: the pages each writes and whether it waits for an
fsync, read from the WAL as the power-loss sweep reads it."""

from __future__ import annotations

from queue_core.lab.speed import commits


def test_the_worker_loop_commits_once_per_message_where_claim_then_ack_commits_twice() -> None:
    ways = commits.consume_transactions()

    each, loop = ways["claim, then ACK"], ways["the worker loop (drain)"]
    assert [(t.claimed, t.acked, t.fsynced, t.pages) for t in each] == [
        (("E0001",), (), False, 3), ((), ("E0001",), True, 4),
        (("E0002",), (), False, 3), ((), ("E0002",), True, 4),
        (("E0003",), (), False, 3), ((), ("E0003",), True, 4)]
    assert [(t.claimed, t.acked, t.fsynced, t.pages) for t in loop] == [
        (("E0001",), (), False, 3), (("E0002",), ("E0001",), True, 4),
        (("E0003",), ("E0002",), True, 4), ((), ("E0003",), True, 4)]
    assert loop[1].label == "ACK E0001\nclaim E0002"
    import matplotlib.pyplot as plt
    figure = commits.plot_transactions(ways)
    assert len(figure.axes[0].patches) == len(each) + len(loop)
    plt.close(figure)
