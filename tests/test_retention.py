"""``prune``: old done messages lose their payload and journal, and keep their key,
digest, effect and a compacted record; a replay is answered as before, forever."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from queue_core import (BatchConflict, Handler, LeaseLost, ModelClock, Queue, audit, drain)
from queue_core.crashpoints import CRASH_EXIT_CODE, LIFETIME_POINTS
from queue_core.values import Compacted

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "data" / "demo.jsonl"
E0001 = '{"event_id": "E0001", "payload": {"category": "book", "amount_cents": 10000}}'


def storied(target: str) -> tuple[Queue, ModelClock, dict[str, object]]:
    """E0001, E0002 done; E0003 done after a retry (generation 2); E0004 dead;
    E0005 ready, enqueued last (it owns the journal's last row). 17000 of money."""
    clock = ModelClock(1000)
    queue = Queue(target, clock=clock)
    queue.enqueue_file(DEMO)
    handler = Handler()
    first = queue.claim()
    queue.complete(first, handler)
    queue.complete(queue.claim(), handler)
    queue.fail(queue.claim())                       # E0003: retry at 1002
    queue.fail(queue.claim(), "invalid_payload", permanent=True)  # E0004 dead
    clock.advance(2)
    queue.complete(queue.claim(), handler)          # E0003, generation 2, at 1002
    clock.advance(8)
    queue.enqueue_jsonl('{"event_id": "E0005", "payload": {"category": "pen", "amount_cents": 1}}')
    return queue, clock, {"first": first}


def test_prune_drops_payload_and_journal_of_old_done_messages_and_keeps_the_rest(
        store: str) -> None:
    queue, clock, kept = storied(store)
    before = audit.snapshot(queue.path)
    assert queue.prune(100).messages == 0  # nothing finished 100 s before t=1010
    clock.set(2000)
    pruned = queue.prune(100)
    assert (pruned.messages, pruned.journal_rows, pruned.kept, pruned.batches) == (3, 11, (), 1)
    after = audit.snapshot(queue.path)
    assert audit.check(after) == []
    assert after.status.pruned == 3 and after.money == before.money == 17000
    assert after.effect_rows == before.effect_rows
    assert after.states() == before.states()
    assert {e: m.payload for e, m in after.messages.items() if m.payload is None} == {
        "E0001": None, "E0002": None, "E0003": None}
    for untouched in ("E0004", "E0005"):  # dead and ready keep everything
        assert after.messages[untouched] == before.messages[untouched]
    assert after.digests == before.digests  # every key's digest, forever
    assert after.compacted == {
        "E0001": Compacted("E0001", 1000, 1, 0, 3, "book", 10000),
        "E0002": Compacted("E0002", 1000, 1, 0, 3, "pen", 2000),
        "E0003": Compacted("E0003", 1000, 2, 0, 5, "book", 5000)}
    assert {step.event_id for step in after.journal} == {"E0004", "E0005"}
    assert queue.prune(100).messages == 0  # a second prune finds nothing
    # A stale lease of a pruned message is refused like any stale lease; nothing changes.
    with pytest.raises(LeaseLost) as refused:
        queue.complete(kept["first"], Handler())  # type: ignore[arg-type]
    assert refused.value.code == "not_leased"
    assert audit.snapshot(queue.path) == audit.snapshot(queue.path)
    assert audit.snapshot(queue.path).money == 17000


def test_a_replay_of_a_pruned_event_gets_the_answers_it_got_before_pruning(store: str) -> None:
    queue, clock, _ = storied(store)
    replay_same = E0001.replace('"category": "book", "amount_cents": 10000',
                                '"amount_cents": 10000, "category": "book"')  # same canonical
    conflict = ('{"event_id": "E0006", "payload": {"category": "bag", "amount_cents": 300}}\n'
                '{"event_id": "E0001", "payload": {"category": "book", "amount_cents": 20000}}')
    answers = []
    for prune_first in (False, True):
        if prune_first:
            clock.set(2000)
            assert queue.prune(100).messages == 3
        same = queue.enqueue_jsonl(replay_same)
        with pytest.raises(BatchConflict) as refused:
            queue.enqueue_jsonl(conflict)
        answers.append((same, refused.value.code, refused.value.line))
    assert answers[0] == answers[1]
    assert answers[1][0].inserted == 0 and answers[1][0].duplicates == 1
    snap = audit.snapshot(queue.path)
    assert "E0006" not in snap.messages and snap.money == 17000 and audit.check(snap) == []
    drain(queue, Handler())  # the replay added nothing to process: only E0005
    assert audit.snapshot(queue.path).money == 17001


class ReadsNoted(Queue):
    """A queue that keeps what each of its read transactions returned (``_read``)."""

    def __init__(self, *args: object, **options: object) -> None:
        self.results: list[object] = []
        super().__init__(*args, **options)  # type: ignore[arg-type]

    def _read(self, body):  # type: ignore[no-untyped-def]
        result = super()._read(body)
        self.results.append(result)
        return result


def test_prune_behind_a_backlog_reads_its_messages_rows_alone_by_index_or_span_by_span(
        store: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """PostgreSQL reads the rows of the messages it prunes by the journal's index by
    event; SQLite, which has none, walks the journal a span of sequence numbers per
    read transaction, the database keeping only those messages' rows."""
    from queue_core import retention
    from queue_core.values import Transition

    monkeypatch.setattr(retention, "_WALK_SPAN", 500)  # the backlog spans three

    clock = ModelClock(1000)
    queue = ReadsNoted(store, clock=clock)
    line = '{{"event_id": "E{:04d}", "payload": {{"category": "book", "amount_cents": {}}}}}'
    queue.enqueue_jsonl("\n".join(line.format(n, 100 * n) for n in range(1, 11)))
    backlog = 1200  # queued behind them, never claimed
    for first in range(11, 11 + backlog, 600):  # a batch holds at most 1,000 lines
        queue.enqueue_jsonl("\n".join(line.format(n, 1) for n in range(first, min(
            first + 600, 11 + backlog))))
    assert [o.kind for o in drain(queue, Handler(), max_messages=10)] == ["done"] * 10
    clock.advance(60)
    queue.results.clear()

    pruned = queue.prune(0)

    # E0010 owns the journal's newest row and waits
    pages = [r for r in queue.results if isinstance(r, list) and r is not queue.results
             and all(isinstance(step, Transition) for step in r)]
    assert (pruned.messages, pruned.waiting) == (9, "E0010")
    rows = ([(f"E{n:04d}", "enqueued") for n in range(1, 10)]
            + [(f"E{n:04d}", reason) for n in range(1, 10) for reason in ("claimed", "completed")])
    if queue.store.journal_by_event:  # one read: the 9 messages' rows, nothing of the backlog
        assert [[(s.event_id, s.reason) for s in page] for page in pages] == [rows]
    else:  # seq 1-10 are the 10 enqueued rows, 11-1210 the backlog's, then the claims: the
        # walk to E0009's done row read seq 1-500, 501-1000, 1001-1500 (a read each)
        assert [[(s.event_id, s.reason) for s in page] for page in pages] == [
            rows[:9], [], rows[9:]]
    snap = audit.snapshot(store)
    assert audit.check(snap) == []
    assert (snap.money, len(snap.effect_rows)) == (5500, 10)
    assert snap.status.states == {"ready": backlog, "leased": 0, "done": 10, "dead": 0}


def test_the_message_that_owns_the_journals_last_row_waits_so_no_sequence_number_returns(
        db_path: Path) -> None:
    queue, clock, _ = storied(str(db_path))
    drain(queue, Handler())  # E0005 done: it now owns the journal's last row
    clock.set(5000)
    assert queue.prune(0).messages == 3
    last = max(step.seq for step in queue.transitions())
    queue.enqueue_jsonl('{"event_id": "E0007", "payload": {"category": "pen", "amount_cents": 2}}')
    assert [step.seq for step in queue.transitions("E0007")] == [last + 1]
    assert queue.prune(0).messages == 1  # E0005 now, E0007 owns the last row
    queue.enqueue_jsonl('{"event_id": "E0008", "payload": {"category": "pen", "amount_cents": 3}}')
    assert [step.seq for step in queue.transitions("E0008")] == [last + 2]


def test_pruned_pages_go_back_to_the_file_system(db_path: Path) -> None:
    clock = ModelClock(1000)
    queue = Queue(db_path, clock=clock)
    note = "x" * 2000
    queue.enqueue_jsonl("\n".join(json.dumps({"event_id": f"E{i:04d}", "payload": {
        "category": "book", "amount_cents": i, "note": note}}) for i in range(1, 401)))
    drain(queue, Handler())
    queue.enqueue_jsonl('{"event_id": "E9999", "payload": {"category": "pen", "amount_cents": 1}}')
    size = db_path.stat().st_size
    clock.advance(10)
    pruned = queue.prune(5)
    assert pruned.messages == 400 and pruned.batches == 8
    assert pruned.bytes_freed > 400 * 2000 * 0.9
    assert db_path.stat().st_size <= size - pruned.bytes_freed
    assert audit.findings(db_path) == [] and audit.snapshot(db_path).money == sum(range(1, 401))


TAMPERED = {
    "effect edited": ("UPDATE effects SET amount_cents = 1 WHERE event_id = 'E0001'",
                      "effect_differs"),
    "effect deleted": ("DELETE FROM effects WHERE event_id = 'E0002'", "done_without_effect"),
    "record deleted": ("DELETE FROM compacted WHERE event_id = 'E0003'", "history_missing"),
    "claims edited": ("UPDATE compacted SET claims = 1 WHERE event_id = 'E0003'",
                      "generation_skipped"),
    "generation edited": ("UPDATE messages SET generation = 5 WHERE event_id = 'E0001'",
                          "generation_skipped"),
    "journal written again": (
        "INSERT INTO transitions (at, event_id, from_state, to_state, generation, attempts, "
        "reason) VALUES (2000, 'E0001', 'leased', 'done', 1, 1, 'completed')",
        "journal_disagrees"),
    "payload put back": ("UPDATE messages SET payload = '{\"amount_cents\":10000,"
                         "\"category\":\"book\"}' WHERE event_id = 'E0001'", "journal_disagrees"),
}


@pytest.mark.parametrize("case", list(TAMPERED))
def test_the_audit_still_finds_these_tamperings_on_a_pruned_file(
        case: str, db_path: Path) -> None:
    queue, clock, _ = storied(str(db_path))
    clock.set(2000)
    queue.prune(100)
    assert audit.findings(db_path) == []
    sql, finding = TAMPERED[case]
    with sqlite3.connect(db_path) as conn:
        conn.execute(sql)
    conn.close()
    assert finding in {f.name for f in audit.findings(db_path)}


def test_what_the_audit_cannot_see_on_a_pruned_file(db_path: Path) -> None:
    """The limits notebook 13 states: an effect edited together with its record, and
    an edited digest, pass the audit; the digest shows at the next replay."""
    queue, clock, _ = storied(str(db_path))
    clock.set(2000)
    queue.prune(100)
    with sqlite3.connect(db_path) as conn:
        conn.execute("UPDATE effects SET amount_cents = 1 WHERE event_id = 'E0001'")
        conn.execute("UPDATE compacted SET amount_cents = 1 WHERE event_id = 'E0001'")
        conn.execute("UPDATE messages SET payload_sha256 = zeroblob(32) WHERE event_id = 'E0002'")
    conn.close()
    snap = audit.snapshot(db_path)
    assert audit.check(snap) == [] and snap.money == 17000 - 9999
    with pytest.raises(BatchConflict):
        queue.enqueue_jsonl('{"event_id": "E0002", "payload": {"category": "pen", '
                            '"amount_cents": 2000}}')


def test_a_payload_edited_apart_from_its_digest_is_found(db_path: Path) -> None:
    queue, _, _ = storied(str(db_path))
    with sqlite3.connect(db_path) as conn:
        conn.execute("UPDATE messages SET payload = '{\"amount_cents\":2,\"category\":\"pen\"}' "
                     "WHERE event_id = 'E0005'")
    conn.close()
    assert [f.name for f in audit.findings(db_path)] == ["digest_differs"]


def test_a_message_whose_journal_the_audit_refuses_is_kept_whole(db_path: Path) -> None:
    queue, clock, _ = storied(str(db_path))
    with sqlite3.connect(db_path) as conn:
        conn.execute("DELETE FROM transitions WHERE event_id = 'E0002' AND to_state = 'leased'")
    conn.close()
    clock.set(2000)
    pruned = queue.prune(100)
    assert (pruned.messages, pruned.kept) == (2, ("E0002",))
    assert queue.message("E0002").payload is not None
    assert pruned.lines()[1].startswith("kept whole 1 whose journal the audit does not accept "
                                        "(E0002): run the audit")


def test_a_message_edited_after_it_was_judged_is_left_for_the_next_prune(
        db_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The audit's rules judge a message before the write lock (only the reads that
    # check it is still the row judged, and the writes, hold it): an edit between
    # the judgement and the lock must not be pruned on the strength of the old row.
    from queue_core import retention
    queue, clock, _ = storied(str(db_path))
    clock.set(2000)
    judge = retention._judge

    def then_edited(*args: object) -> object:
        found = judge(*args)  # type: ignore[arg-type]
        with sqlite3.connect(db_path) as other:
            other.execute("UPDATE messages SET payload = '{\"amount_cents\":1,\"category\":"
                          "\"pen\"}' WHERE event_id = 'E0002'")
        other.close()
        return found
    with monkeypatch.context() as edited:
        edited.setattr(retention, "_judge", then_edited)
        first = queue.prune(100)

    assert (first.messages, first.kept, first.skipped) == (2, (), ("E0002",))
    assert queue.message("E0002").payload == '{"amount_cents":1,"category":"pen"}'
    second = queue.prune(100)
    assert (second.messages, second.kept) == (0, ("E0002",))  # judged again: refused
    assert queue.message("E0002").payload is not None
    assert "digest_differs" in [f.name for f in audit.findings(db_path)]


def cli(db: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "queue_core", "--db", str(db), *args],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)


def file_bytes(db: Path) -> dict[str, str]:
    return {path.name: hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(db.parent.iterdir())}


def test_prune_on_the_command_line_says_what_it_dropped_and_refuses_bad_input(
        db_path: Path) -> None:
    storied(str(db_path))
    before = file_bytes(db_path)
    seconds = "invalid_seconds: argument --older-than: expected seconds, a whole number"
    for bad, says in ((["prune"], "missing_option: the following arguments are required: "
                                  "--older-than"),
                      (["prune", "--older-than", "-5"], f"{seconds} from 0 to "),
                      (["prune", "--older-than", "1.5"], "got '1.5'"),
                      (["prune", "--older-than", "soon"], f"{seconds} from 0 to ")):
        done = cli(db_path, "--now", "2000", *bad)
        assert done.returncode == 2 and says in done.stderr, (bad, done.stderr)
        assert "Traceback" not in done.stderr and file_bytes(db_path) == before
    done = cli(db_path, "--now", "2000", "prune", "--older-than", "100")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == ("pruned 3 done messages finished at least 100 s before t=2000: their "
                        "payloads and 11 journal rows dropped, in 1 transaction; keys, digests, "
                        "effects and one compacted record each kept")
    assert " bytes given back to the file system" in lines[1] and len(lines) == 2
    status = cli(db_path, "status").stdout.splitlines()
    assert status[1] == ("pruned:  3 of the done (payload and journal dropped; key, digest, "
                         "effect kept)")
    assert json.loads(cli(db_path, "status", "--json").stdout)["pruned"] == 3
    assert json.loads(cli(db_path, "--now", "2000", "metrics", "--json").stdout)["pruned"] == 3


PRUNE_POINTS = [point for point in LIFETIME_POINTS if point.startswith("prune.")]


@pytest.mark.parametrize("point", PRUNE_POINTS)
def test_a_prune_killed_at_each_point_leaves_a_consistent_queue(point: str,
                                                                db_path: Path) -> None:
    queue, clock, _ = storied(str(db_path))
    child = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
        import sys
        from queue_core import ModelClock, Queue, crashpoints
        crashpoints.arm({point!r})
        Queue(sys.argv[1], clock=ModelClock(2000)).prune(100)
        """), str(db_path)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert child.returncode == CRASH_EXIT_CODE, child.stderr
    snap = audit.snapshot(db_path)
    assert audit.check(snap) == [] and snap.money == 17000
    assert snap.status.pruned == (3 if point == "prune.after_commit" else 0)
    clock.set(2000)
    queue.prune(100)
    snap = audit.snapshot(db_path)
    assert audit.check(snap) == [] and snap.status.pruned == 3 and snap.money == 17000


def test_a_worker_beside_a_prune_loop_loses_nothing_and_doubles_nothing(db_path: Path) -> None:
    count = 300
    queue = Queue(db_path, clock=ModelClock(1000))
    queue.enqueue_jsonl("\n".join(json.dumps({"event_id": f"E{i:04d}", "payload": {
        "category": "pen", "amount_cents": i}}) for i in range(1, count + 1)))
    worker = subprocess.Popen([sys.executable, "-m", "queue_core", "--db", str(db_path),
                               "--now", "1000", "work"], cwd=ROOT, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    pruner = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import sys
        from queue_core import ModelClock, Queue
        queue = Queue(sys.argv[1], clock=ModelClock(1000))
        pruned = 0
        for _ in range(2000):
            pruned += queue.prune(0, batch_size=20).messages
            if queue.status().states["ready"] + queue.status().states["leased"] == 0:
                break
        print(pruned)
        """), str(db_path)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, worker_err = worker.communicate(timeout=300)
    pruned_out, pruner_err = pruner.communicate(timeout=300)
    assert worker.returncode == 0 and pruner.returncode == 0, (worker_err, pruner_err)
    assert int(pruned_out) > 0
    queue.prune(0)
    snap = audit.snapshot(db_path)
    assert audit.check(snap) == []
    assert snap.status.states == {"ready": 0, "leased": 0, "done": count, "dead": 0}
    assert snap.money == count * (count + 1) // 2 and snap.status.effects == count
    assert snap.status.pruned == count - 1  # the owner of the journal's last row waits


def test_prune_names_the_message_that_waits_because_it_owns_the_journals_newest_row(
        db_path: Path) -> None:
    queue = Queue(db_path, clock=ModelClock(1000))
    queue.enqueue_jsonl(E0001)
    drain(queue, Handler())
    queue.clock.set(9000)  # type: ignore[attr-defined]
    pruned = queue.prune(60)
    assert (pruned.messages, pruned.waiting) == (0, "E0001")
    assert pruned.lines()[:2] == [
        "pruned nothing: no other done message finished at least 60 s before t=9000",
        "E0001 waits for a later prune: it owns the journal's newest row, which is kept so "
        "that no journal number is ever used twice"]
    assert queue.message("E0001").payload is not None and audit.findings(db_path) == []


def test_free_pages_go_back_a_full_step_at_a_time_on_every_python(db_path: Path) -> None:
    # Python 3.11's sqlite3 stepped ``PRAGMA incremental_vacuum(N)`` once (one page
    # given back per call) where 3.12 steps it to the end (N pages): the pruned file's
    # size, printed in notebook 13, differed between the two.
    from queue_core.retention import VACUUM_PAGES, _give_back
    queue = Queue(db_path, clock=ModelClock(1000))
    queue.enqueue_jsonl(E0001)
    raw = sqlite3.connect(db_path, isolation_level=None)
    raw.execute("CREATE TABLE scratch (blob BLOB)")
    raw.executemany("INSERT INTO scratch VALUES (?)", [(bytes(900),)] * 150)
    raw.execute("DROP TABLE scratch")
    free, pages = (raw.execute(f"PRAGMA {name}").fetchone()[0]
                   for name in ("freelist_count", "page_count"))
    assert free >= 2 * VACUUM_PAGES + 1

    with queue.session():
        _give_back(queue, quiet_since=None)

    left = free % VACUUM_PAGES
    assert (raw.execute("PRAGMA freelist_count").fetchone()[0],
            raw.execute("PRAGMA page_count").fetchone()[0]) == (left, pages - (free - left))
    raw.close()
    assert queue.status().states["ready"] == 1 and audit.findings(db_path) == []


def test_a_postgresql_prune_skips_a_row_another_session_holds_and_prunes_the_rest(
        pg_dsn: str) -> None:
    import psycopg

    queue, clock, _ = storied(pg_dsn)
    clock.set(2000)
    with psycopg.connect(pg_dsn) as outside:  # its transaction stays open until rollback
        outside.execute("SELECT event_id FROM messages WHERE event_id = 'E0002' FOR UPDATE")
        pruned = queue.prune(100)
        assert (pruned.messages, pruned.skipped, pruned.kept) == (2, ("E0002",), ())
        outside.rollback()
    assert pruned.lines() == [
        "pruned 2 done messages finished at least 100 s before t=2000: their payloads and 8 "
        "journal rows dropped, in 1 transaction; keys, digests, effects and one compacted "
        "record each kept",
        "skipped 1 that another transaction holds or has just changed (E0002): a later prune "
        "takes it",
        "the space freed is reused for new rows once (auto)vacuum has run"]
    snap = audit.snapshot(queue.path)
    assert snap.messages["E0002"].payload is not None and snap.status.pruned == 2
    assert snap.money == 17000 and audit.check(snap) == []
    assert queue.prune(100).messages == 1  # once released, the next prune takes it
    assert audit.snapshot(queue.path).status.pruned == 3


def test_a_postgresql_prune_speaks_of_a_sequence_and_vacuum_not_of_sqlites_file(
        pg_dsn: str) -> None:
    queue = Queue(pg_dsn, clock=ModelClock(1000))
    queue.enqueue_jsonl(E0001)
    drain(queue, Handler())
    queue.clock.set(9000)  # type: ignore[attr-defined]
    said = " ".join(queue.prune(60).lines())
    assert "E0001 waits for a later prune" in said
    for sqlite_only in ("file system", "pages", "journal number is ever used twice"):
        assert sqlite_only not in said


def a_long_wal(db_path: Path, clock: ModelClock) -> tuple[Queue, sqlite3.Connection]:
    """400 done orders of 2 KB, old enough to prune, on a file whose -wal has grown past
    ``WAL_TRUNCATE_BYTES``; a second connection stays open (as a worker's does), so the
    -wal is not removed when the queue's own connections close."""
    from queue_core.retention import WAL_TRUNCATE_BYTES
    queue = Queue(db_path, clock=clock)
    other = sqlite3.connect(db_path, isolation_level=None)
    other.execute("CREATE TABLE beside (n INTEGER)")
    note = "x" * 2000
    queue.enqueue_jsonl("\n".join(json.dumps({"event_id": f"E{i:04d}", "payload": {
        "category": "book", "amount_cents": i, "note": note}}) for i in range(1, 401)))
    drain(queue, Handler())
    queue.enqueue_jsonl('{"event_id": "E9999", "payload": {"category": "pen", "amount_cents": 1}}')
    clock.advance(10)
    assert Path(f"{db_path}-wal").stat().st_size > WAL_TRUNCATE_BYTES
    return queue, other


def committing_beside(monkeypatch: pytest.MonkeyPatch, other: sqlite3.Connection) -> None:
    """After each of the prune's batches commits, ``other`` commits a row: the prune
    runs beside a writer, as beside a worker."""
    from queue_core import retention
    point = retention.crash_point

    def and_another_commit(name: str) -> None:
        point(name)
        if name == "prune.after_commit":
            other.execute("INSERT INTO beside VALUES (1)")
    monkeypatch.setattr(retention, "crash_point", and_another_commit)


def test_a_quiet_prune_truncates_a_long_wal_and_one_beside_a_writer_leaves_it(
        db_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Beside running workers a truncation holds their write lock for a whole
    # checkpoint: truncating after every prune of a loop cost the worker beside
    # it more than half its rate.
    wal = Path(f"{db_path}-wal")
    queue, other = a_long_wal(db_path, ModelClock(1000))
    size = wal.stat().st_size
    with monkeypatch.context() as beside:
        committing_beside(beside, other)
        busy = queue.prune(5)

    assert busy.messages == 400 and wal.stat().st_size >= size
    queue.enqueue_jsonl('{"event_id": "E9998", "payload": {"category": "pen", "amount_cents": 2}}')
    drain(queue, Handler())
    queue.clock.advance(10)

    quiet = queue.prune(5)

    assert quiet.messages == 1 and wal.stat().st_size == 0
    other.close()
    assert audit.findings(db_path) == [] and audit.snapshot(db_path).money == sum(
        range(1, 401)) + 1 + 2


def test_a_wal_grown_past_twice_its_checkpoints_size_is_truncated_even_beside_a_writer(
        db_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from queue_core.sqlite import CHECKPOINT_PAGES
    wal = Path(f"{db_path}-wal")
    queue, other = a_long_wal(db_path, ModelClock(1000))
    reader = sqlite3.connect(db_path, isolation_level=None)
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM messages").fetchone()  # holds the -wal's start
    page = other.execute("PRAGMA page_size").fetchone()[0]
    other.execute("CREATE TABLE scratch (blob BLOB)")
    other.executemany("INSERT INTO scratch VALUES (?)",
                      [(bytes(page * 8),)] * (2 * CHECKPOINT_PAGES // 8 + 64))
    other.execute("DROP TABLE scratch")
    reader.execute("COMMIT")
    reader.close()
    assert wal.stat().st_size > 2 * CHECKPOINT_PAGES * page
    committing_beside(monkeypatch, other)

    pruned = queue.prune(5)

    assert pruned.messages == 400 and wal.stat().st_size == 0
    other.close()
    assert audit.findings(db_path) == [] and audit.snapshot(db_path).money == sum(range(1, 401))
