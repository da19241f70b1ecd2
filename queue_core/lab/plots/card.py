"""The summary card of notebook 00: every public call of ``Queue`` and of the
worker helpers, with its transaction, checks, changes and error codes.

The list of calls is not written by hand: ``inspect`` finds the public
calls of ``Queue`` (its reading half ``QueueViews`` included) and the
helpers ``queue_core`` exports from ``worker``, and each call's signature is
read from the function itself. Only the words of each row live here, in
``ROWS``. ``summary_card()`` refuses to draw a card while a call has no row
or a row names a call that is gone, so a grown package cannot leave a call
off the card (a test holds each row's codes to its call's documentation).
The rejection codes of a batch are read from the table in
``queue_core.ingest``'s documentation.
"""

from __future__ import annotations

import ast
import inspect
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import queue_core
from ... import ingest
from ...priority import HEAD_START_SECONDS, HIGHEST, LOWEST
from ...queue import Queue
from ...views import QueueViews

ERRORS_HEADER = "Error codes (`exc.code`)"
COLUMNS = ("Call", "Transaction", "Checks", "Changes", ERRORS_HEADER)
LOST = ("LeaseLost", ("stale_generation", "lease_expired", "not_leased"))
UNKNOWN = ("UnknownEvent", ("unknown_event",))
INTEGRITY = ("IntegrityViolation", ("integrity_violation",))  # a schema constraint refused
# the stored payload is not the one enqueued: no effect, the message committed dead
EDITED = ("PayloadDiffers", ("payload_differs",))
# A server that cannot be reached; a session that ended under a call (its outcome
# unknown); a lock waited for past the session's lock_timeout (rolled back).
PG_ONLY = (("UnusableFile", ("cannot_connect",)), ("ConnectionLost", ("connection_lost",)),
           ("LockTimeout", ("lock_timeout",)))
LONG_LIST = 6  # more codes than this go below the table, where they do not stretch a row
FILE_ONLY = ("file_not_found", "file_unreadable")  # reading a file; text cannot meet them


@dataclass(frozen=True, slots=True)
class Row:
    """The words of one call's row; ``errors`` pairs an exception class with its codes."""

    transaction: str
    checks: str
    changes: str
    errors: tuple[tuple[str, tuple[str, ...]], ...] = ()
    note: str = ""  # after the codes: programmer errors, or what comes back instead


def rejection_codes() -> tuple[str, ...]:
    """The codes of ``BatchRejected``, from the table in ``queue_core.ingest``'s
    documentation (read from its source, so it holds under ``python -OO`` too)."""
    doc = ast.get_docstring(ast.parse(inspect.getsource(ingest))) or ""
    return tuple(re.findall(r"^``([a-z0-9_]+)``\s", doc, flags=re.MULTILINE))


def _ack(changes: str, note: str) -> Row:
    return Row("one write: the effect **and** the ACK",
               "state `leased`, the same `generation`, `lease_until > now`; the stored payload's "
               "SHA-256 is the one kept since enqueue; the lease again after the handler ran, as "
               "the guard of the `done` UPDATE", changes,
               (LOST, ("InvalidPayload", ("invalid_payload",)),
                ("TransientError", ("transient_error",)), UNKNOWN, INTEGRITY, EDITED), note)


def _fenced(transaction: str, changes: str, note: str = "") -> Row:
    return Row(transaction, "fenced like `complete`: state, generation, deadline", changes,
               (LOST, UNKNOWN), note)


def _read(what: str, note: str = "") -> Row:
    return Row("one read", "nothing", what, (), note)


# The helpers turn the lease's refusals and the handler's into outcomes; the rest they raise.
HELPER_ERRORS = (UNKNOWN, INTEGRITY)
HELPER_NOTE = ("a lost lease, an invalid payload, a transient error or an edited payload "
               "(`dead`, `payload_differs`) is an `Outcome`, not raised")

ROWS: dict[str, Row] = {
    "__init__": Row(
        "opening: a new file gets the schema and the queue's mark; nothing else is written",
        "the file is new and empty, or marked as the queue's own (application id, schema version)",
        "nothing in an existing queue",
        (("UnusableFile", ("not_a_queue", "schema_too_new", "not_a_database", "no_queue_file",
                           "reserved_name")),
         ("IdRuleDiffers", ("id_rule_differs",))),
        "`no_queue_file` only with `create=False`; `reserved_name` for a new file whose name "
        "ends in `-wal`, `-shm` or `-journal`, or a database beside the file under such a "
        "name; `id_rule_differs` when `ids` is not the queue's own rule; `ValueError` for a "
        "lease or budget below 1"),
    "enqueue": Row(
        "the whole batch in one write", "each id under the queue's rule (`id_rule`); a known id "
        "must come with the same canonical payload",
        "new ids: a `ready` row each, of `priority` (the claim's head start); repeats only "
        "counted (`EnqueueResult`), their stored priority kept",
        (("BatchConflict", ("batch_conflict",)), ("BatchRejected", ("invalid_event_id",))),
        f"nothing is written; `ValueError` for a priority outside {LOWEST}-{HIGHEST}"),
    "enqueue_file": Row(
        "as `enqueue`, after the whole file is validated (`read_batch`)",
        "each line a JSON object with exactly `event_id` (under the queue's rule: `E` + 4 digits "
        "in a course queue) and `payload` (an "
        "object); sizes and line count; then as `enqueue`", "as `enqueue`",
        (("BatchRejected", rejection_codes()),), "nothing is written; `ValueError` for a "
        "priority, as `enqueue`"),
    "enqueue_jsonl": Row(
        "as `enqueue_file`, for text (`parse_batch`)", "as `enqueue_file`", "as `enqueue`",
        (("BatchRejected", tuple(c for c in rejection_codes() if c not in FILE_ONLY)),),
        "nothing is written; `ValueError` for a priority, as `enqueue`"),
    "claim": Row(
        "one write; on SQLite it commits without an fsync of its own (the next ACK's covers it)",
        "first recovers expired leases (back to `ready`, or `dead` once the budget is spent); "
        "then, of the `ready` rows with `available_at <= now` (a priority never cuts a backoff "
        f"short), the first in the claim's order: `available_at` less {HEAD_START_SECONDS} s per "
        "step of priority, then event id",
        "`ready → leased`, `generation + 1`, `attempts + 1`, `lease_until = now + lease`",
        (), "none: `None` when nothing is due"),
    "claim_batch": Row("one write for up to `limit` claims", "as `claim`, for each",
                       "as `claim`, for each", (),
                       "none: `[]` when nothing is due; `ValueError` for a `limit` below 1"),
    "complete": _ack("INSERT the effect; `leased → done` (an edited payload: no effect, "
                     "`leased → dead`, reason `payload_differs`)",
                     "all roll the whole transaction back, INSERT included, but "
                     "`payload_differs` (the stored payload is not the one enqueued), which "
                     "commits the message `dead` with that reason and no effect"),
    "complete_and_claim": _ack(
        "as `complete`, then claims the next due message as `claim` does, in the SAME "
        "transaction (one commit, one fsync per message); returns `(effect, next lease or None)`",
        "as `complete`: a refused ACK claims nothing. On PostgreSQL, for a handler that does "
        "not override `apply`, it is one call of the schema's step function (one round trip): "
        "the effect comes from the payload the claim "
        "returned, which must be the one enqueued; a lease carrying another copy is refused "
        "with `payload_differs` and nothing written"),
    "complete_batch": Row(
        "one write, a savepoint per lease", "as `complete`, per lease",
        "as `complete`, for each lease that passes", (),
        "each refusal is returned in the list in place of that lease's `Effect`, not raised; "
        "each is rolled back alone, but `payload_differs`, whose move to `dead` commits with "
        "the others"),
    "extend": _fenced("one write (the heartbeat)",
                      "`lease_until = now + seconds`; state and generation stay; not journalled "
                      "(leased to leased is no edge); an expired lease cannot be revived",
                      "`ValueError` for `seconds` below 1"),
    "release": Row("one write", "state and generation, not the deadline: a lease past it that "
                   "no claim has recovered is still this generation's",
                   "`leased → ready` at once, in its old place; the attempt is not counted, the "
                   "generation is (journal reason `released`)",
                   (("LeaseLost", ("stale_generation", "not_leased")), UNKNOWN)),
    "fail": _fenced("one write", "`leased → ready` after a backoff of 1 s, then 2 s; `→ dead` "
                    "when `permanent` or on the last attempt (journal reason "
                    "`attempts_exhausted`); `code` kept as `last_error`"),
    "redrive": Row("one write", "the id is an event id; the message exists and is `dead`",
                   "`dead → ready`, `attempts = 0`, `generation` kept",
                   (UNKNOWN, ("NotRedrivable", ("not_redrivable", "invalid_event_id")))),
    "prune": Row(
        "short writes of up to `batch_size` messages each, beside running workers; on SQLite "
        "each commits without an fsync of its own (a lost one only leaves the messages whole)",
        "only `done` messages that finished at least `older_than` seconds ago, whose journal "
        "the audit accepts; never the owner of the journal's last row",
        "payload dropped (its SHA-256 stays), journal rows replaced by one compacted record; "
        "key, effect and money kept forever; freed pages given back (`Pruned`)",
        (), "`ValueError` for a negative or non-integer `older_than`, or a `batch_size` below 1"),
    "migrate": Row(
        "what `queue-core migrate` runs (also `queue_core.migrate(path)`): one transaction per "
        "schema version, the version read again inside it (a second "
        "migrator, or a second run, changes nothing)",
        "the queue is one this version opens (`Queue`'s refusals); on PostgreSQL each step "
        "waits at most 5 s for the locks it needs",
        "the queue upgraded to this version's schema: each payload's digest, each done "
        "message's finish time, each message's priority (0), the live index in the claim's "
        "order (`Migration`)",
        (("UnusableFile", ("not_a_queue", "schema_too_new", "not_a_database", "no_queue_file",
                           "migration_failed", "migration_blocked")),),
        "`migration_blocked` on PostgreSQL only, `migration_failed` when the copy would leave "
        "a row pointing at no message"),
    "status": _read("counts per state, effects and money (`Status`); per priority too, once a "
                    "message has one other than 0 (`priorities`)"),
    "metrics": _read("depth per state, age of the oldest due message, `next_due_at` (when the next "
                     "one becomes due), expired leases not yet noticed, attempts of each dead "
                     "message (`Metrics`); depth and oldest due age per priority, once a message "
                     "has one other than 0 (`priorities`)"),
    "message": Row("one read", "nothing", "one message's stored row (`Message`)", (UNKNOWN,)),
    "messages": _read("every stored message, by event id"),
    "effects": _read("every stored effect, by event id"),
    "transitions": _read("the journal of state changes (`Transition`), for one event or all"),
    "snapshot": _read("every stored fact at one moment (`queue_core.audit`)"),
    "audit": _read("the invariants the file violates now, as named findings (`[]` when all "
                   "holds)"),
    "session": Row("none of its own: the calls in the block share one connection, each still in "
                   "its own transaction (`drain` runs in one)", "nothing", "nothing"),
    "id_rule": Row("one read, on first use", "nothing", "the rule the queue's event ids follow, "
                   "chosen when it was created: `course` or `general`"),
    "connection": Row("none", "nothing", "nothing: the open session's connection, or `None`"),
    "transaction": Row("`BEGIN IMMEDIATE`, committed on success, rolled back on any exception; the "
                       "hook every transition runs in", "nothing", "what the block writes"),
    "fence": Row("inside the caller's `transaction()`; a hook for subclasses (the course's broken "
                 "contrasts)", "as `complete`'s first check", "nothing", (LOST, UNKNOWN)),
    "process_one": Row("as `claim`, then as `finish`", "as those calls",
                       "one message claimed and finished; returns its `Outcome` (`None` when "
                       "nothing is due)", HELPER_ERRORS, HELPER_NOTE),
    "finish": Row("as `complete`, or as `fail` when the handler refuses", "as those calls",
                  "an invalid payload goes `dead`, a transient error back to `ready`; returns "
                  "the `Outcome` (`done`, `retry`, `dead` or `lost`)", HELPER_ERRORS, HELPER_NOTE),
    "drain": Row(
        "a claim, then one write per message: each ACK claims the next (`complete_and_claim`)",
        "as those calls; `stop` before each claim, `max_messages` caps the count",
        "every message due now processed; a stop finishes the one in hand and gives back "
        "(`release`) the one claimed ahead, and whatever ends it leaves no lease held "
        "(`on_given_back` hears of one already lost); returns the outcomes (`Outcome`)",
        HELPER_ERRORS,
        HELPER_NOTE + "; `ValueError` for a negative `max_messages`, or a `batch_size` below 1"),
}

# The calls that are not transitions: how the others meet the database.
HOOKS = ("session", "connection", "transaction", "fence")
# The calls that open a queue or upgrade it, and read what it was created with: they work
# on a queue of an earlier schema version, which every write refuses (``schema_too_old``).
OPENING = ("id_rule", "migrate")


class CardOutOfDate(Exception):
    """The package has a call the card has no row for, or the card a row for a gone call."""


def public_calls(cls: type = Queue) -> list[str]:
    """The public calls of ``cls`` (methods and properties, inherited ones
    included, ``object``'s left out), in the order their source defines them."""
    found: dict[str, int] = {}
    for klass in reversed(cls.__mro__[:-1]):  # a subclass's own calls after its base's
        for name, value in vars(klass).items():
            function = _function(value)
            if not name.startswith("_") and function is not None:
                found[name] = _line(function) + 100_000 * (klass is cls)
    return sorted(found, key=found.__getitem__)


def worker_helpers() -> list[str]:
    """The functions ``queue_core`` exports from its worker module."""
    return [name for name in queue_core.__all__
            if getattr(getattr(queue_core, name), "__module__", "") == "queue_core.worker"]


@dataclass(frozen=True, slots=True)
class Part:
    """One table of the card: its calls, found in the package, and what every one of them
    may also raise."""

    title: str
    intro: str
    calls: tuple[str, ...]
    errors: tuple[tuple[str, tuple[str, ...]], ...] = ()


def parts() -> list[Part]:
    """The card's tables; the calls are found in the package, never listed here,
    and shown in the order of their rows (the order a message meets them)."""
    order = list(ROWS)  # the rows' own order; a call without a row comes last
    calls = sorted(public_calls(), key=lambda name: order.index(name) if name in ROWS else len(order))
    reads = tuple(name for name in calls if name in public_calls(QueueViews))
    opening = ("__init__", *(n for n in calls if n in OPENING))
    writes = tuple(n for n in calls if n not in reads and n not in HOOKS and n not in opening)
    helpers = tuple(worker_helpers())
    return [
        Part("Opening", "These work on a queue of any schema version this version opens: an "
             "earlier one is opened and read as it is, and `migrate` upgrades it.", opening),
        Part("Writes", "Each is one `BEGIN IMMEDIATE` transaction and journals its state changes "
             "in `transitions` inside that same transaction (the heartbeat changes no state). "
             "On a queue of an earlier schema version, which the reads read as it is, each is "
             "refused until `queue_core.migrate` upgraded it.",
             writes, (("UnusableFile", ("schema_too_old",)),)),
        Part("Reads", "Stored values only, in one read transaction on a read-only connection: "
             "they recover no lease, create no file and never wait for the write lock. Each may "
             "meet a journal that a killed writer left behind and this process may not roll "
             "back.", reads, (("UnusableFile", ("hot_journal",)),)),
        Part("Connections and hooks", "How the calls above meet the database.",
             tuple(n for n in calls if n in HOOKS)),
        Part("Worker helpers", "Functions built from the calls above: `from queue_core import "
             + ", ".join(helpers) + "`. `drain` is the loop `queue-core work` runs.", helpers),
    ]


def problems() -> list[str]:
    """What keeps the card from being complete: calls without a row, rows without a call."""
    listed = [name for part in parts() for name in part.calls]
    missing = [f"{_owner(name)}.{name} has no row" for name in listed if name not in ROWS]
    gone = [f"the row {name!r} names no call of the package" for name in ROWS if name not in listed]
    return missing + gone


@dataclass(frozen=True)
class Card:
    """The card as a table per part: Markdown for JupyterLab, plain text elsewhere."""

    parts: tuple[Part, ...]

    def rows(self, part: Part) -> list[tuple[str, Row]]:
        return [(call_text(name), ROWS[name]) for name in part.calls]

    def _repr_markdown_(self) -> str:
        out = []
        for part in self.parts:
            also = f" Every call here may raise {errors_text(part.errors)}." if part.errors else ""
            rows = self.rows(part)
            lists = _long_lists(row.errors for _, row in rows)
            out += [f"**{part.title}.** {part.intro}{also}", "",
                    "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
            out += ["| " + " | ".join(_cell(text) for text in (
                f"`{call}`", row.transaction, row.checks, row.changes,
                errors_text(row.errors, row.note, lists))) + " |" for call, row in rows]
            out += [""] + [f"`{cls}` codes: {', '.join(f'`{c}`' for c in codes)}." for cls, codes
                           in lists.items()] + [""] * bool(lists)
        out.append(f"On PostgreSQL every call may also raise {errors_text(PG_ONLY)}.")
        return "\n".join(out)

    def __repr__(self) -> str:
        lines = []
        for part in self.parts:
            lines.append(f"{part.title}:" + (f" (each may raise {_plain(errors_text(part.errors))})"
                                              if part.errors else ""))
            lines += [f"  {call}\n      codes: {_plain(errors_text(row.errors, row.note))}"
                      for call, row in self.rows(part)]
        lines.append(f"On PostgreSQL every call may also raise {_plain(errors_text(PG_ONLY))}.")
        return "\n".join(lines)

    def codes(self) -> set[str]:
        """Every error code the card names."""
        rows = [ROWS[name] for part in self.parts for name in part.calls]
        pairs = [*PG_ONLY, *(pair for part in self.parts for pair in part.errors),
                 *(pair for row in rows for pair in row.errors)]
        return {code for _, codes in pairs for code in codes}


def summary_card() -> Card:
    """The summary card, built from the package; raises ``CardOutOfDate`` while incomplete."""
    found = problems()
    if found:
        raise CardOutOfDate("the summary card is out of date (queue_core/lab/plots/card.py): "
                            + "; ".join(found))
    return Card(tuple(parts()))


def call_text(name: str) -> str:
    """How a call is written on the card: ``queue.claim()``, ``drain(queue, handler, ...)``."""
    if name == "__init__":
        return "Queue" + _parameters(Queue.__init__, drop=1)
    if name in worker_helpers():
        return name + _parameters(getattr(queue_core, name))
    attribute = inspect.getattr_static(Queue, name)
    if isinstance(attribute, property):
        return f"queue.{name}"
    return f"queue.{name}" + _parameters(attribute, drop=1)


def errors_text(errors: tuple[tuple[str, tuple[str, ...]], ...], note: str = "",
                lists: dict[str, tuple[str, ...]] | None = None) -> str:
    """The codes as the card writes them; a class in ``lists`` is referred to its list
    below the table instead (naming what this call cannot raise of it)."""
    said = []
    for cls, codes in errors:
        if lists and cls in lists:
            absent = [f"`{code}`" for code in lists[cls] if code not in codes]
            said.append(f"`{cls}`: a code listed below the table"
                        + (f", not {' or '.join(absent)}" if absent else ""))
        else:
            said.append(f"`{cls}`: " + ", ".join(f"`{code}`" for code in codes))
    return "; ".join(part for part in ("; ".join(said), note) if part) or "none"


def _long_lists(errors: Iterable[tuple[tuple[str, tuple[str, ...]], ...]]
                ) -> dict[str, tuple[str, ...]]:
    """The classes with more codes than fit a table's cell, with the longest list of each."""
    lists: dict[str, tuple[str, ...]] = {}
    for cls, codes in (pair for pairs in errors for pair in pairs):
        if len(codes) > LONG_LIST and len(codes) > len(lists.get(cls, ())):
            lists[cls] = codes
    return lists


def _parameters(function: Callable[..., Any], drop: int = 0) -> str:
    """``(a, b, *, c=1)``: names and defaults only, without annotations."""
    parameters = list(inspect.signature(function).parameters.values())[drop:]
    shown, star = [], False
    for p in parameters:
        if p.kind is p.KEYWORD_ONLY and not star:
            shown.append("*")
            star = True
        shown.append(p.name if p.default is p.empty else f"{p.name}={p.default!r}")
    return "(" + ", ".join(shown) + ")"


def _function(value: Any) -> Callable[..., Any] | None:
    if isinstance(value, property):
        return value.fget
    if isinstance(value, (staticmethod, classmethod)):
        return value.__func__
    return value if inspect.isfunction(value) else None


def _line(function: Callable[..., Any]) -> int:
    wrapped = inspect.unwrap(function)
    return wrapped.__code__.co_firstlineno


def _owner(name: str) -> str:
    return "queue_core" if name in worker_helpers() else "Queue"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _plain(text: str) -> str:
    return text.replace("`", "").replace("**", "")
