"""What the course may say about the package, kept in one place and proved
against the package itself.

``FACTS``: things the package has, each with the phrases that would deny
it and a check that runs the package to show it really has it. When the
package grows, add a fact here; ``test_course_facts`` then scans every
notebook, README.md and EXERCISES.md for a sentence that still says the
opposite. When the package loses something, its check fails, and the fact
must go before any chapter may deny it.

``CODE_LISTS``: paragraphs of the README that list error codes as if the
list were complete, with the set of codes each must name, computed from
the package's source (``engine_codes``).
"""

from __future__ import annotations

import ast
import inspect
import re
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from conftest import ROOT
from queue_core import Handler, LeaseLost, ModelClock, Queue, drain

ORDERS = "\n".join(
    f'{{"event_id": "E000{n}", "payload": {{"category": "book", "amount_cents": {n}00}}}}'
    for n in (1, 2, 3))


@dataclass(frozen=True)
class Fact:
    """``says`` holds for the package (``check`` shows it, or raises); a passage that
    matches one of ``denials`` (case-insensitive, markdown emphasis removed) says it does not."""

    says: str
    denials: tuple[str, ...]
    check: Callable[[], None]


@contextmanager
def fresh_queue(orders: str = ORDERS) -> Iterator[tuple[Queue, ModelClock]]:
    with tempfile.TemporaryDirectory() as folder:
        clock = ModelClock(1000)
        queue = Queue(Path(folder) / "facts.sqlite3", clock=clock, lease_seconds=2)
        queue.enqueue_jsonl(orders)
        yield queue, clock


def heartbeat_extends_a_held_lease_and_refuses_a_lost_one() -> None:
    with fresh_queue(ORDERS.splitlines()[0]) as (queue, clock):
        lease = queue.claim()
        clock.set(1001)
        assert queue.extend(lease, 5).lease_until == 1006
        clock.set(1006)
        stale, fresh = lease, queue.claim()
        assert fresh.event_id == "E0001" and fresh.generation == 2
        try:
            queue.extend(stale, 5)
        except LeaseLost as exc:
            assert exc.code == "stale_generation"
        else:
            raise AssertionError("a stale heartbeat was accepted")


def power_loss_is_swept_by_a_test() -> None:
    from queue_core.lab.sweeps.powerloss import SCENARIOS, run_powerloss
    assert callable(run_powerloss) and SCENARIOS
    tests = (ROOT / "tests" / "test_powerloss.py").read_text(encoding="utf-8")
    assert re.search(r"^def test_\w+", tests, re.MULTILINE) and "run_powerloss" in tests


def postgres_is_a_store() -> None:
    from queue_core.stores import open_store
    store = open_store("postgresql://shop@db.example/shop")  # connects only when used
    assert store.name == "postgres" and type(store).__module__ == "queue_core.postgres.store"


def several_hosts_share_the_servers_clock() -> None:
    from queue_core.cli.run import _system_clock
    from queue_core.postgres import DatabaseClock
    assert isinstance(_system_clock("postgresql://shop@db.example/shop"), DatabaseClock)


def an_ack_claims_the_next_message_in_its_own_transaction() -> None:
    with fresh_queue() as (queue, _):
        effect, following = queue.complete_and_claim(queue.claim(), Handler())
        assert effect.amount_cents == 100 and following is not None
        journal = [(t.event_id, t.reason) for t in queue.transitions()][3:]
        assert journal == [("E0001", "claimed"), ("E0001", "completed"), ("E0002", "claimed")]


def a_stop_gives_back_what_was_claimed_ahead() -> None:
    with fresh_queue() as (queue, _):
        seen: list[object] = []  # a stop asked for once the first message is reported
        drain(queue, Handler(), on_outcome=seen.append, stop=lambda: bool(seen))
        assert [str(m.state) for m in queue.messages()] == ["done", "ready", "ready"]
        assert queue.transitions("E0002")[-1].reason == "released"
        assert queue.message("E0002").attempts == 0
        assert [o.event_id for o in drain(queue, Handler(), max_messages=1)] == ["E0002"]
    from queue_core.cli import build_parser
    assert build_parser().parse_args(["work", "--max", "2"]).max_messages == 2


def postgres_sessions_bound_lock_waits_and_stalled_transactions() -> None:
    from queue_core.postgres.session import SESSION_SETTINGS, TRANSACTION_TIMEOUT_SINCE, session_options
    options = session_options("")
    assert "-c lock_timeout=" in options and "-c idle_in_transaction_session_timeout=" in options
    assert "-c tcp_keepalives_idle=" in options and SESSION_SETTINGS["tcp_user_timeout"]
    assert TRANSACTION_TIMEOUT_SINCE == 170000  # transaction_timeout is set where it exists
    reading = session_options("", reading=True)
    assert "-c idle_in_transaction_session_timeout=0" in reading
    assert "-c default_transaction_read_only=on" in reading and "-c lock_timeout=" in reading
    tests = (ROOT / "tests" / "test_hostage.py").read_text(encoding="utf-8")
    assert "hold_hostage" in tests and re.search(r"^def test_\w+", tests, re.MULTILINE)


def a_lost_connection_is_one_line_whose_outcome_is_unknown() -> None:
    from queue_core.errors import ConnectionLost
    text = str(ConnectionLost("postgresql://db.example/shop", "server closed the connection"))
    assert "\n" not in text and "committed is unknown" in text and "the queue settles it" in text
    tests = (ROOT / "tests" / "test_network_sweep.py").read_text(encoding="utf-8")
    assert "run_network_sweep" in tests


def real_time_varies_in_some_notebooks() -> None:
    from queue_core.lab.story import run_child
    assert "work_ms" in inspect.signature(run_child).parameters  # 05's fifth race sleeps
    assert (ROOT / "notebooks" / "08_throughput.ipynb").exists()  # and 08 times the disk
    from queue_core.lab.sweeps import hold_hostage  # 14 times a stalled worker's message
    assert "watch_seconds" in inspect.signature(hold_hostage).parameters


def prune_keeps_every_key_so_a_late_replay_is_a_duplicate() -> None:
    from queue_core import audit
    with fresh_queue(ORDERS.splitlines()[0]) as (queue, clock):
        drain(queue, Handler())
        queue.enqueue_jsonl(ORDERS.splitlines()[1])  # the journal's newest row waits
        clock.advance(3600)
        assert queue.prune(60).messages == 1 and queue.message("E0001").payload is None
        replay = queue.enqueue_jsonl(ORDERS.splitlines()[0])
        assert (replay.inserted, replay.duplicates) == (0, 1)
        assert audit.snapshot(queue.path).money == 100
    from queue_core.cli import build_parser
    assert build_parser().parse_args(["prune", "--older-than", "60"]).command == "prune"


def migrate_upgrades_each_schema_version_in_its_own_transaction() -> None:
    from queue_core import migrate
    from queue_core.sqlite import SCHEMA_VERSION
    from queue_core.sqlite.migrations import STEPS
    assert SCHEMA_VERSION >= 2 and sorted(STEPS) == list(range(1, SCHEMA_VERSION))
    with fresh_queue() as (queue, _):
        assert migrate(queue.path).steps == ()  # a current file: nothing to do
    from queue_core.cli import build_parser
    assert build_parser().parse_args(["migrate"]).command == "migrate"


def a_priority_is_a_head_start_and_every_wait_has_a_bound() -> None:
    from queue_core.priority import CLAIM_ORDER, HEAD_START_SECONDS, wait_bound
    refund = '{"event_id": "E0009", "payload": {"category": "pen", "amount_cents": 900}}'
    with fresh_queue() as (queue, clock):  # E0001 to E0003 at priority 0, due at 1000
        clock.advance(HEAD_START_SECONDS * 9 - 1)  # the refund comes 8 min 59 s later
        queue.enqueue_jsonl(refund, priority=9)
        assert [queue.claim().event_id for _ in range(4)] == ["E0009", "E0001", "E0002", "E0003"]
        assert queue.message("E0009").priority == 9 and queue.metrics().priorities
    assert CLAIM_ORDER == "available_at - 60 * priority"
    assert (wait_bound(0, 59, 1, 1), wait_bound(9, 60, 1, 1)) == (600, 61)
    from queue_core.cli import build_parser
    assert build_parser().parse_args(["enqueue", "--priority", "9", "f.jsonl"]).priority == 9


def drain_takes_turns_on_the_wal_across_its_steps() -> None:
    import fcntl
    import os
    from queue_core.sqlite import turns
    assert turns.TURN_SECONDS == 0.01 and turns.IDLE_SECONDS == 0.05
    held: list[bool] = []
    with fresh_queue() as (queue, _):
        wal = queue.path + "-wal"

        def look(outcome: object) -> None:  # between two steps: is the -wal's flock taken?
            probe = os.open(wal, os.O_RDONLY)
            try:
                fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held.append(False)
            except BlockingIOError:
                held.append(True)
            finally:
                os.close(probe)

        real, turns.TURN_SECONDS = turns.TURN_SECONDS, 3600.0  # a turn that cannot end here
        try:
            drain(queue, Handler(), on_outcome=look)
        finally:
            turns.TURN_SECONDS = real
    assert held == [True, True, True]


FACTS = (
    Fact("A worker that needs longer keeps its lease with a heartbeat, `Queue.extend`, "
         "fenced like an ACK.",
         (r"\bno lease extension", r"\bno heartbeat", r"\bcannot ask for more time",
          r"(extend|heartbeat|lease extension)\W[^.\n]{0,80}not (in|part of) this package"),
         heartbeat_extends_a_held_lease_and_refuses_a_lost_one),
    Fact("Power loss is tested: the power-loss sweep recovers and audits every state of the "
         "log a power cut can leave (tests/test_powerloss.py, notebook 08).",
         (r"power[- ]loss[^.\n|]{0,60}\bnot tested", r"\bnot tested\b[^.\n|]{0,40}power[- ]loss",
          r"\bno power[- ]loss (test|sweep)"),
         power_loss_is_swept_by_a_test),
    Fact("The same queue runs on PostgreSQL (`postgresql://` connection strings).",
         (r"\bpostgres(ql)? is not supported", r"\bno postgres(ql)? (store|support)",
          r"\b(does not|doesn't|cannot) (run|work) on postgres"),
         postgres_is_a_store),
    Fact("Workers on several hosts are possible on the PostgreSQL store, where the server's "
         "clock judges every deadline.",
         (r"\b(this|the) protocol is (only )?for one host",
          r"\bcannot (run|work) on several hosts"),
         several_hosts_share_the_servers_clock),
    Fact("The worker loop's ACK claims the next message in the same transaction "
         "(`complete_and_claim`): one transaction per message.",
         (r"\btwo (write )?transactions per message", r"\btwo commits per message",
          r"\bevery claim and every ACK is a (separate |write )?transaction"),
         an_ack_claims_the_next_message_in_its_own_transaction),
    Fact("A stop (`work --max N`, Ctrl-C, `drain(..., max_messages=)`) gives back the message "
         "claimed ahead with `Queue.release`; none waits for its lease to expire.",
         (r"\bno way to (give|hand) (a message|it) back", r"\bno --max\b",
          r"\ba stop(ped worker)? leaves (a|the|its) (pre-?claimed )?message (waiting|leased)"),
         a_stop_gives_back_what_was_claimed_ahead),
    Fact("Every PostgreSQL connection that writes bounds itself: `lock_timeout`, "
         "`transaction_timeout` where the server has it (17 and later), idle in transaction, "
         "TCP keepalives; a worker stalled mid-transaction keeps its message at most 5 s on 17 "
         "and later. A connection that only reads is read-only, without the transaction "
         "limits.",
         (r"\bsets `?connect_timeout`? and nothing else",
          r"\bno (`?lock_timeout`?|keepalives?|statement timeout|idle[- ]in[- ]transaction)"
          r"[^.\n|]{0,40}(is set|outside the tests|in queue_core)",
          r"\bnothing (in `?queue_core(\.postgres)?`? )?bounds (it|a stalled worker)"),
         postgres_sessions_bound_lock_waits_and_stalled_transactions),
    Fact("A connection lost under a call is one `connection_lost` line that names the outcome "
         "as unknown and says the queue settles it; the network sweep cuts real workers at "
         "every step.",
         (r"\bno test cuts a connection", r"\bserver rolled back the message in flight",
          r"\bconnection_lost[^.\n]{0,60}\brolled back\b"),
         a_lost_connection_is_one_line_whose_outcome_is_unknown),
    Fact("Model time makes the protocol's figures repeatable, not everything: 05's fifth race "
         "sleeps 20 ms per message, 08 and 10 time real work, 11 times its search, 14 times "
         "how long a stalled worker keeps its message.",
         (r"\bnothing (in (this|the) course )?sleeps\b",
          r"\b(a|every|each) re-?run prints the same (numbers|figures|outputs?)\b",
          r"\bevery (cell|output|number|figure) (is|stays) the same on every run\b"),
         real_time_varies_in_some_notebooks),
    Fact("Old done messages are pruned with `Queue.prune` (`queue-core prune --older-than`), "
         "which keeps every key, digest and effect: a late replay is still a duplicate "
         "(notebook 13, exercise 8).",
         (r"\bno retention( policy)?\b", r"\bno (automatic )?(pruning|clean-?up of (old|done))",
          r"\bnothing is ever (deleted|pruned)", r"\bcannot be pruned\b"),
         prune_keeps_every_key_so_a_late_replay_is_a_duplicate),
    Fact("A file of an earlier schema version is upgraded with `migrate` (`queue-core migrate`), "
         "one transaction per version (notebook 13).",
         (r"\bno migrations?\b", r"\bno (schema )?upgrade path\b",
          r"\bcannot (open|read) (a|the) (file|queue) of (the|an) (earlier|previous) release"),
         migrate_upgrades_each_schema_version_in_its_own_transaction),
    Fact("A message has a priority from 0 to 9 (`priority=`, `enqueue --priority`): a head "
         "start of 60 s per step in the claim's order, so that no wait exceeds "
         "`priority.wait_bound` (notebook 15).",
         (r"\bno daemon, no priorit", r"\bpriorities are not supported",
          r"\b(the|this) (queue|package|library) (has|offers|supports) no priorit",
          r"\bwithout priorities\b"),
         a_priority_is_a_head_start_and_every_wait_has_a_bound),
    Fact("Worker processes on one SQLite file take turns inside `drain`: each keeps an "
         "`flock` of the queue's `-wal` across its steps for `TURN_SECONDS` (10 ms), and a "
         "waiter sleeps until the kernel hands it the turn (`queue_core/sqlite/turns.py`).",
         (r"\b(the|this) package does not take turns\b",
          r"\b(a waiting worker|the waiters?|a waiter)[^.\n]{0,40}\b(asks?|looks?|wakes?) "
          r"(again )?every millisecond"),
         drain_takes_turns_on_the_wal_across_its_steps),
)


def denials_in(text: str, fact: Fact) -> list[re.Match[str]]:
    plain = text.replace("**", "")
    return [match for pattern in fact.denials
            for match in re.finditer(pattern, plain, re.IGNORECASE)]


# -- error codes, read from the engine's source ------------------------------------------

CODE = re.compile(r"[a-z]+(?:_[a-z0-9]+)+\Z")
RAISERS = {"BatchRejected", "LeaseLost", "UnusableFile", "reject", "__init__"}
# Errors whose class has a code of its own, given another one as ``code=...``.
ERRORS_WITH_A_GIVEN_CODE = {"IntegrityViolation", "NotRedrivable", "QueueError"}


@dataclass(frozen=True)
class Codes:
    """Every code the engine defines, and where: ``ingest`` (a rejected batch),
    ``unusable`` (``UnusableFile``), ``cli`` (only the command line prints them)."""

    all: frozenset[str]
    ingest: frozenset[str]
    unusable: frozenset[str]
    cli: frozenset[str]

    @property
    def api(self) -> frozenset[str]:
        """The codes a ``Queue`` call or a worker helper can raise."""
        return self.all - self.cli


def engine_codes() -> Codes:
    """Codes from the engine's source (``queue_core/``, its store packages, not the lab): a class's
    ``code = "..."`` (unless its ``__init__`` takes the code), the code given to
    ``BatchRejected``, ``LeaseLost``, ``UnusableFile`` or ingest's ``reject``, and the
    ``error: CODE:`` lines of the command line."""
    by_file: dict[str, set[str]] = {}
    unusable: set[str] = set()
    engine = ROOT / "queue_core"
    for path in sorted(p for p in engine.rglob("*.py") if p.relative_to(engine).parts[0] != "lab"):
        found = by_file.setdefault(path.relative_to(engine).as_posix(), set())
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and _called(node) in RAISERS and node.args \
                    and _literal(node.args[0]):
                found.add(_literal(node.args[0]))
                if _called(node) == "UnusableFile":
                    unusable.add(_literal(node.args[0]))
            if isinstance(node, ast.Call) and _called(node) in ERRORS_WITH_A_GIVEN_CODE:
                found.update(_literal(k.value) for k in node.keywords if k.arg == "code")
            elif isinstance(node, ast.ClassDef) and not _takes_code(node):
                found.update(_literal(s.value) for s in node.body if isinstance(s, ast.Assign)
                             and [getattr(t, "id", "") for t in s.targets] == ["code"])
            elif path.parent.name == "cli" and isinstance(node, (ast.JoinedStr, ast.Constant)):
                found.update(_cli_code(node))
    every = frozenset(code for codes in by_file.values() for code in codes if code)
    return Codes(every, frozenset(by_file["ingest.py"]), frozenset(unusable),
                 frozenset(by_file["cli/__init__.py"] | by_file["cli/run.py"]))


def _called(node: ast.Call) -> str:
    func = node.func
    return func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")


def _literal(node: ast.expr) -> str:
    value = getattr(node, "value", None)
    return value if isinstance(value, str) and CODE.match(value) else ""


def _takes_code(node: ast.ClassDef) -> bool:
    return any(isinstance(f, ast.FunctionDef) and f.name == "__init__"
               and "code" in [a.arg for a in f.args.args] for f in node.body)


def _cli_code(node: ast.JoinedStr | ast.Constant) -> set[str]:
    first = node.values[0] if isinstance(node, ast.JoinedStr) and node.values else node
    text = getattr(first, "value", None)
    match = re.match(r"(?:error: )?([a-z]+(?:_[a-z]+)+): ", text) if isinstance(text, str) else None
    return {match.group(1)} if match else set()


@dataclass(frozen=True)
class CodeList:
    """A paragraph of ``document`` that begins with ``begins`` and lists codes as if
    completely: it must name every code of ``expected(codes)`` and only codes that exist."""

    document: Path
    begins: str
    expected: Callable[[Codes], frozenset[str]]


CODE_LISTS = (
    # the rejection codes and UnusableFile's are listed by reference ("the other
    # rejection codes of ingest.py", "codes below"); every other code by name
    CodeList(ROOT / "README.md", "Errors carry stable codes",
             lambda c: (c.api - c.ingest - c.unusable) | {"batch_conflict"}),
    # an operational error: the file, the server or the output, not the input (the
    # command line's refusals of arguments exit with 2)
    CodeList(ROOT / "README.md", "Operational errors exit with 1",
             lambda c: c.unusable | (c.cli - {"misplaced_option", "unknown_option",
                                               "unknown_command", "unused_option",
                                               "invalid_db", "unknown_id_rule",
                                               "invalid_category", "conflicting_option"})
             | {"integrity_violation"}),
)


def named_codes(text: str) -> set[str]:
    """The codes a listing paragraph names: its backticked snake_case words."""
    return {word for word in re.findall(r"`([a-z0-9_]+)`", text) if CODE.match(word)}
