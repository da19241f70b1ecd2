"""Which durability each kind of transaction commits with, read from the very
connection the queue uses for it.

A claim commits without an fsync of its own (``synchronous=NORMAL`` for that
one transaction), and so does each transaction of a prune, which promises
nothing a power loss could take back; everything a caller is told is durable
(enqueue, the ACK with its effect, the worker loop's ACK that claims the
next, fail, release, redrive) commits at ``FULL``. The level is read inside
each transaction, on its own connection: through the public ``transaction``
hook, through a handler that asks the ACK's connection, and, in a session,
by replaying the statements the session's connection ran.
"""

from __future__ import annotations

import sqlite3
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from queue_core import Effect, Handler, ModelClock, Queue, audit

FULL, NORMAL = 2, 1  # what ``PRAGMA synchronous`` answers
BATCH = "".join(f'{{"event_id": "E000{i}", "payload": {{"category": "book", "amount_cents": {i}00}}}}\n'
                for i in (1, 2, 3))
KINDS = ("enqueue", "claim", "complete_and_claim", "release", "claim_batch", "complete_batch",
         "fail", "redrive", "claim recovering an expired lease", "complete", "prune")
# what commits without an fsync of its own: the claims, and prune's one batch here
RELAXED = {"claim", "claim_batch", "claim recovering an expired lease", "prune"}


class Probe(Queue):
    """The queue, unchanged, but each committed transaction's ``synchronous``
    level is read on its own connection, inside the transaction."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.levels: list[int] = []

    def transaction(self, *, relaxed: bool = False) -> AbstractContextManager[sqlite3.Connection]:
        return self._probed(super().transaction(relaxed=relaxed))

    @contextmanager
    def _probed(self, inner: AbstractContextManager[sqlite3.Connection]
                ) -> Iterator[sqlite3.Connection]:
        with inner as conn:
            level = conn.execute("PRAGMA synchronous").fetchone()[0]
            yield conn
        self.levels.append(level)  # only a transaction that committed gets here


class AckAtNormal(Probe):
    """A contrast: every transaction relaxed, the ACK included."""

    def transaction(self, *, relaxed: bool = False) -> AbstractContextManager[sqlite3.Connection]:
        return super().transaction(relaxed=True)


class AskingHandler(Handler):
    """Asks the ACK's own connection for its level while writing the effect."""

    def __init__(self) -> None:
        super().__init__()
        self.levels: list[int] = []

    def apply(self, conn: sqlite3.Connection, event_id: str, payload: Any) -> Effect:
        self.levels.append(conn.execute("PRAGMA synchronous").fetchone()[0])
        return super().apply(conn, event_id, payload)


def every_kind(queue: Probe, clock: ModelClock, handler: Handler) -> dict[str, list[int]]:
    """Run each kind of transaction once; the levels its commits ran at, by kind."""
    levels: dict[str, list[int]] = {}

    def run(kind: str, step: Callable[[], Any]) -> Any:
        before = len(queue.levels)
        result = step()
        levels[kind] = queue.levels[before:]
        return result

    run("enqueue", lambda: queue.enqueue_jsonl(BATCH))
    first = run("claim", queue.claim)
    _, ahead = run("complete_and_claim", lambda: queue.complete_and_claim(first, handler))
    run("release", lambda: queue.release(ahead))
    second, third = run("claim_batch", lambda: queue.claim_batch(2))
    run("complete_batch", lambda: queue.complete_batch([second], handler))
    run("fail", lambda: queue.fail(third, "bad_input", permanent=True))
    run("redrive", lambda: queue.redrive("E0003"))
    abandoned = queue.claim()
    clock.set(abandoned.lease_until)  # its holder never came back
    recovered = run("claim recovering an expired lease", queue.claim)
    assert (recovered.event_id, recovered.generation) == ("E0003", abandoned.generation + 1)
    run("complete", lambda: queue.complete(recovered, handler))
    pruned = run("prune", lambda: queue.prune(0))  # E0001 and E0002; E0003 owns the last row
    assert (pruned.messages, pruned.batches) == (2, 1)
    return levels


def expected(claims: int, others: int) -> dict[str, list[int]]:
    return {kind: [claims if kind in RELAXED else others] for kind in KINDS}


def assert_exactly_once(path: Path) -> None:
    snap = audit.snapshot(path)
    assert audit.check(snap) == []
    assert (snap.status.total, snap.status.effects) == (600, 3)
    assert snap.states() == {"E0001": "done", "E0002": "done", "E0003": "done"}


CONFIGS = {
    "default": ({}, expected(claims=NORMAL, others=FULL)),
    "fsync_claims": ({"fsync_claims": True}, expected(claims=FULL, others=FULL)),
    "synchronous NORMAL": ({"synchronous": "NORMAL"}, expected(claims=NORMAL, others=NORMAL)),
}


@pytest.mark.parametrize("in_session", [False, True], ids=["own connection per call", "session"])
@pytest.mark.parametrize("config", CONFIGS)
def test_claims_and_prune_commit_at_normal_and_every_promise_to_a_caller_at_full(
        db_path: Path, model_clock: ModelClock, config: str, in_session: bool) -> None:
    options, levels = CONFIGS[config]
    queue = Probe(db_path, clock=model_clock, lease_seconds=2, **options)
    handler = AskingHandler()
    if in_session:
        with queue.session():
            seen = every_kind(queue, model_clock, handler)
    else:
        seen = every_kind(queue, model_clock, handler)

    assert seen == levels
    assert handler.levels == [levels["complete"][0]] * 3  # the ACK's own connection, asked directly
    assert_exactly_once(db_path)


@pytest.mark.parametrize("config", CONFIGS)
def test_the_session_connection_commits_each_transaction_at_the_level_its_statements_set(
        db_path: Path, model_clock: ModelClock, config: str) -> None:
    options, levels = CONFIGS[config]
    queue = Probe(db_path, clock=model_clock, lease_seconds=2, **options)
    with queue.session():
        conn = queue.connection
        assert conn is not None
        level = conn.execute("PRAGMA synchronous").fetchone()[0]
        statements: list[str] = []
        conn.set_trace_callback(statements.append)
        every_kind(queue, model_clock, Handler())
        conn.set_trace_callback(None)
        after = conn.execute("PRAGMA synchronous").fetchone()[0]

    at_commit = []
    for statement in statements:  # replay: the level each COMMIT met
        if statement.startswith("PRAGMA synchronous = "):
            level = {"FULL": FULL, "NORMAL": NORMAL}[statement.rsplit(" ", 1)[1]]
        elif statement == "COMMIT":
            at_commit.append(level)
    assert at_commit == queue.levels  # the trace and the probe agree, commit by commit
    before_the_abandoned_claim = KINDS[:KINDS.index("redrive") + 1]
    assert at_commit == [*[level for kind in before_the_abandoned_claim for level in levels[kind]],
                         levels["claim"][0],  # the claim whose holder never came back
                         *levels["claim recovering an expired lease"], *levels["complete"],
                         *levels["prune"]]
    assert after == (NORMAL if config == "synchronous NORMAL" else FULL)  # a relaxed claim restores FULL
    assert_exactly_once(db_path)


def test_a_queue_that_acked_at_normal_fails_the_durability_check(
        db_path: Path, model_clock: ModelClock) -> None:
    queue = AckAtNormal(db_path, clock=model_clock, lease_seconds=2)
    handler = AskingHandler()
    seen = every_kind(queue, model_clock, handler)

    assert seen != CONFIGS["default"][1]
    assert seen["complete"] == seen["complete_batch"] == seen["complete_and_claim"] == [NORMAL]
    assert handler.levels == [NORMAL] * 3
    assert_exactly_once(db_path)  # the same rows: only the durability differs
