"""The command line: ``python -m queue_core`` (or ``queue-core``).

Exit status: 0 on success (``work`` included, whatever the outcomes, and
``work --max N`` stopping with messages still queued); 2 for refused input
(a rejected batch, a message that cannot be redriven, an id that is no event
id: ``invalid_event_id``, bad arguments), with ``line N: CODE: explanation``
or ``CODE: explanation`` on stderr (bad
arguments: the usage line, then ``queue-core: error: explanation``, which
starts with ``misplaced_option:`` for an option on the wrong side of the
command, ``--db``/``--now`` after it or the command's own option before it,
with ``unknown_option:`` for an option its side does not have, shown with the
usage of the parser that would have taken it and the closest option there is,
with ``unknown_command:`` for a word where the command goes that is none, with
the closest command, with ``unused_option:`` for ``--db``/``--now`` given to
``demo``, with ``invalid_seconds:``, ``invalid_count:`` or ``invalid_priority:``
for an integer option that is not plain ASCII digits in its range, with ``unknown_id_rule:`` for an
``--ids`` that is neither ``course`` nor ``general``, with ``conflicting_option:`` for
two different ``--ids``, with ``invalid_category:`` for an empty ``--accept``, with
``invalid_db:`` for a ``--db`` that is blank, not UTF-8, or a ``postgresql://`` string
that is no URL, and with ``missing_option:``,
``missing_value:`` or ``unexpected_argument:`` for argparse's own refusals;
no option is taken abbreviated); 1 for
an operational error (a file that is not the queue's, a missing queue file
for any command but ``enqueue``: ``no_queue_file``, a missing folder, or a
file, folder, ``-wal`` or ``-shm`` that a writing command may not write:
``os_error``, an unusable database, output that cannot be written, a
PostgreSQL server that went away mid-command: ``connection_lost``), with
``error: CODE: explanation`` on one line; 130 or 143 when ``work`` was
stopped by Ctrl-C or SIGTERM after finishing its current message; 141 when
the reader of the output went away (``work | head -1``). Only ``enqueue``
creates a queue file; a command that ends where it may write leaves no
``-wal`` or ``-shm`` file behind, unless another connection has the file open,
and a reading command where it may not write leaves the folder as it was.
"""

from __future__ import annotations

import argparse
import difflib
import re
import signal
import sys
from typing import Any, NoReturn, Sequence
from urllib.parse import urlsplit

from .. import __version__

DEFAULT_DB = "queue.sqlite3"
DEFAULT_LEASE_SECONDS = 30
EXIT_REFUSED = 2
EXIT_OPERATIONAL = 1
EXIT_BROKEN_PIPE = 128 + 13
EXIT_SIGNAL = {signal.SIGINT: 130, signal.SIGTERM: 143}
MAX_SECONDS = 10**12  # about 31,700 years: far beyond any clock, far below 2**63
MAX_COUNT = 10**12  # messages: far beyond any queue, far below 2**63 (SQLite's LIMIT)
READING_COMMANDS = ("status", "metrics")
# argparse's own refusals, by what their text says; any other is ``invalid_argument``.
ARGPARSE_CODES = (("the following arguments are required", "missing_option"),
                  ("expected one argument", "missing_value"),
                  ("expected at least one argument", "missing_value"),
                  ("unrecognized arguments", "unexpected_argument"))
GLOBAL_OPTIONS = ("--db", "--now")  # each takes a value; they belong before the command


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(build_parser(), sys.argv[1:] if argv is None else list(argv))
    # The engine is loaded once the arguments are sound: --help, --version and every
    # refused argument answer without it.
    from .run import run
    return run(args)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="queue-core", allow_abbrev=False,
        description="A reliable queue in one SQLite file: lease, fencing generation, "
                    "effect and ACK in one transaction. The options below (--db, --now) "
                    "come before the command; each command's own options after it.",
        epilog="example: queue-core --now 1000 enqueue data/demo.jsonl")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--db", type=_target, metavar="PATH",
                        help="the queue's database file, or a postgresql:// connection string; "
                             "only enqueue creates it, every other command refuses a missing "
                             f"one (no_queue_file) (default: {DEFAULT_DB})")
    parser.add_argument("--now", type=_seconds, metavar="T",
                        help="model time in integer seconds for this command "
                             "(default: the system clock; the server's for postgresql://)")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    enqueue = _command(commands, "enqueue", "validate a JSONL batch whole, then store it",
                       "queue-core --now 1000 enqueue data/demo.jsonl")
    enqueue.add_argument("file", metavar="FILE",
                         help="a JSONL file: one {\"event_id\", \"payload\"} object per line")
    enqueue.add_argument("--ids", type=_rule, default=None, metavar="RULE", action=_Once,
                         help="the rule a new queue's event ids follow, chosen once: course "
                              "(E and four digits, at most 10,000 events in a queue's life) "
                              "or general (1 to 128 ASCII letters, digits and _ . : -); "
                              "an existing queue must have it (default: the queue's own, "
                              "course for a new one)")
    enqueue.add_argument("--priority", type=_priority, default=0, metavar="P",
                         help="the priority of the batch's new messages, 0 to 9: a head start "
                              "of P minutes in the claim's order, so that no message waits "
                              "forever; a repeat keeps its stored one (default: 0)")
    work = _command(commands, "work", "process every message due now (at most N with --max), "
                    "then exit", "queue-core --now 1000 work --accept toy")
    work.add_argument("--lease-seconds", type=_positive, default=DEFAULT_LEASE_SECONDS,
                      metavar="S", help="how long each claim entitles this worker to finish "
                                        f"(default: {DEFAULT_LEASE_SECONDS})")
    work.add_argument("--accept", nargs="+", action="extend", type=_category, default=[],
                      metavar="CATEGORY",
                      help="also accept these categories, as a newer handler would; "
                           "given twice, both lists count (default: only book, pen, bag)")
    work.add_argument("--batch-size", type=_count, default=1, metavar="K",
                      help="claim and ACK up to K messages per transaction (default: 1)")
    work.add_argument("--max", type=_count, default=None, metavar="N", dest="max_messages",
                      help="process at most N messages, then stop; the rest stays queued "
                           "(default: no limit)")
    for name, summary in (("status", "stored counts and money at one moment; recovers nothing"),
                          ("metrics", "depth, oldest due age, next due time, expired leases, "
                                      "dead attempts")):
        reading = _command(commands, name, summary, f"queue-core {name} --json")
        reading.add_argument("--json", action="store_true",
                             help="print one JSON object (default: aligned text)")
    redrive = _command(commands, "redrive", "send a dead message back to ready",
                       "queue-core redrive E0004")
    redrive.add_argument("event_id", metavar="EVENT_ID",
                         help="the dead message's id, under the queue's rule (E followed "
                              "by four digits in a course queue)")
    prune = _command(commands, "prune", "drop the payload and journal of done messages "
                     "finished at least S seconds ago; keys, digests and effects stay forever",
                     "queue-core prune --older-than 86400")
    prune.add_argument("--older-than", type=_seconds, required=True, metavar="S",
                       help="prune only done messages that finished at least S seconds "
                            "ago, 0 or more (required, no default: how long to keep each "
                            "message's payload and journal is the operator's choice)")
    _command(commands, "migrate", "upgrade the queue to this version's schema, one "
             "transaction per step; a second run changes nothing", "queue-core migrate")
    _command(commands, "demo", "run the reference scenario in a temporary database of its "
             "own, on its own model clock (so it takes neither --db nor --now)", "queue-core demo")
    return parser


class _Parser(argparse.ArgumentParser):
    """argparse, whose every refusal starts with a stable code like the others:
    ``argument --max: invalid_count: ...`` reads ``invalid_count: argument --max: ...``."""

    def error(self, message: str) -> NoReturn:
        moved = re.fullmatch(r"(argument [^:]+: )([a-z]+(?:_[a-z]+)+): (.*)", message, re.S)
        if moved is not None:
            message = f"{moved[2]}: {moved[1]}{moved[3]}"
        elif re.match(r"[a-z]+(?:_[a-z]+)+: ", message) is None:
            code = next((code for says, code in ARGPARSE_CODES if says in message),
                        "invalid_argument")
            message = f"{code}: {message}"
        super().error(message)


def _command(commands: Any, name: str, summary: str, example: str) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = commands.add_parser(
        name, help=summary, description=summary, epilog=f"example: {example}",
        allow_abbrev=False)
    return parser


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """The arguments, or exit 2 after the usage line and one ``error:`` line."""
    misplaced = _misplaced_options(argv, parser)
    if misplaced is not None:
        parser.error(misplaced)
    misspelt = _unknown_command(argv, parser)
    if misspelt is not None:
        parser.error(misspelt)
    unknown = _unknown_options(argv, parser)
    if unknown is not None:
        owner, refusal = unknown
        owner.error(refusal)
    args, extra = parser.parse_known_args(argv)
    if extra:  # only a command leaves arguments over: it shows its own usage
        _commands(parser)[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    given = [name for name, value in (("--db", args.db), ("--now", args.now))
             if value is not None]
    if args.command == "demo" and given:
        parser.error(_unused_by_demo(given))
    args.db = DEFAULT_DB if args.db is None else args.db
    return args


def _misplaced_options(argv: list[str], parser: argparse.ArgumentParser) -> str | None:
    """The refusal for an option on the wrong side of the command: ``--db`` or
    ``--now`` after it (argparse would say "unrecognized arguments"), or the
    command's own option before it (argparse would take its value for the
    command: "invalid choice"); it shows the command line put right."""
    commands = _commands(parser)
    at = _command_at(argv, commands)
    if at == len(argv):
        return None
    command = argv[at]
    early, kept_before = _options_among(argv[:at], commands[command])
    late, kept_after = _options_among(argv[at + 1:], parser)
    if not early and not late:
        return None
    if command == "demo" and late and not early:  # demo takes them on neither side
        return _unused_by_demo(sorted(late))
    fixed = ["queue-core", *kept_before, *sum(late.values(), []), command,
             *sum(early.values(), []), *kept_after]
    where = [f"{' and '.join(sorted(late))} must come before the command {command!r}"] \
        if late else []
    if early:
        where.append(" and ".join(sorted(early)) + (" after it" if late else
                                                    f" must come after the command {command!r}"))
    return f"misplaced_option: {' and '.join(where)}, as in: {' '.join(fixed)}"


def _unknown_command(argv: list[str], parser: argparse.ArgumentParser) -> str | None:
    """The refusal of a word where the command goes that is no command, with the
    closest command there is (argparse would say only "invalid choice")."""
    commands = _commands(parser)
    at = 0
    while at < len(argv) and argv[at].startswith("-"):
        token = argv[at]  # a global option takes the next word
        if "=" in token or token in ("-h", "--help", "--version"):
            at += 1
        elif token in GLOBAL_OPTIONS:
            at += 2
        else:
            return None  # an option the top level does not have: _unknown_options says so
    if at >= len(argv) or argv[at] in commands:
        return None
    word = argv[at]
    closest = difflib.get_close_matches(word.lower(), list(commands), n=1)
    if not closest:
        return f"unknown_command: {word!r} is no command; the commands are {', '.join(commands)}"
    fixed = ["queue-core", *argv[:at], closest[0], *argv[at + 1:]]
    return (f"unknown_command: {word!r} is no command; did you mean {closest[0]!r}? as in: "
            f"{' '.join(fixed)}")


def _unused_by_demo(given: list[str]) -> str:
    return (f"unused_option: demo takes no {' and no '.join(given)}: it runs in a temporary "
            "database of its own, on its own model clock, as in: queue-core demo")


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """Each command's own parser, by name."""
    return next(a for a in parser._actions if a.dest == "command").choices  # noqa: SLF001


def _command_at(argv: list[str], commands: dict[str, argparse.ArgumentParser]) -> int:
    """Where the command is among the arguments (``len(argv)`` if none is)."""
    at = 0
    while at < len(argv) and argv[at] not in commands:
        at += 2 if argv[at] in GLOBAL_OPTIONS else 1  # skip an option's value: --db work
    return min(at, len(argv))  # a last option without its value: argparse says so


def _unknown_options(argv: list[str], parser: argparse.ArgumentParser
                     ) -> tuple[argparse.ArgumentParser, str] | None:
    """The refusal of an option its side of the command does not have (a global
    one before the command, the command's own after it), from the parser whose
    usage it needs, with the closest option it has (``difflib``) and, when every
    unknown option has one, the command line put right. Run after
    ``_misplaced_options``: an option of the other side is misplaced, not unknown."""
    commands = _commands(parser)
    at = _command_at(argv, commands)
    for owner, start, stop in ((parser, 0, at), (commands.get(argv[at]) if at < len(argv)
                                                 else None, at + 1, len(argv))):
        if owner is None:
            continue
        known = [name for action in owner._actions  # noqa: SLF001
                 for name in action.option_strings]
        unknown = [(i, argv[i].split("=", 1)[0]) for i in range(start, stop)
                   if _looks_like_option(argv[i]) and not _takes(owner, argv[i], known)]
        if "--" in argv[start:stop]:  # what follows it is no option
            cut = start + argv[start:stop].index("--")
            unknown = [(i, name) for i, name in unknown if i < cut]
        if not unknown:
            continue
        who = "queue-core" if owner is parser else f"the command {argv[at]!r}"
        names = " or ".join(name for _, name in unknown)
        closest = {i: difflib.get_close_matches(name.lstrip("-"), [k.lstrip("-") for k in known
                                                                   if k.startswith("--")],
                                                n=1, cutoff=0.6) for i, name in unknown}
        if all(closest.values()):
            fixed = list(argv)
            for i, name in unknown:
                fixed[i] = "--" + closest[i][0] + argv[i][len(name):]
            suggested = " and ".join(f"--{closest[i][0]}" for i, _ in unknown)
            return owner, (f"unknown_option: {who} has no option {names}; did you mean "
                           f"{suggested}? as in: {' '.join(['queue-core', *fixed])}")
        own = [name for action in owner._actions  # noqa: SLF001
               if action.dest not in ("help", "version") for name in action.option_strings]
        listed = ", ".join(own[:-1]) + f" and {own[-1]}" if len(own) > 1 else "".join(own)
        has = f"its options are {listed}" if own else "it takes no options"
        if owner is parser:
            has += " (a command's own options come after the command)"
        return owner, (f"unknown_option: {who} has no option {names}; {has}, as "
                       f"{owner.prog} --help shows")
    return None


def _looks_like_option(token: str) -> bool:
    """What argparse takes for an option: a dash, then not a negative number."""
    return token.startswith("-") and token not in ("-", "--") \
        and not re.fullmatch(r"-\d+|-\d*\.\d+", token)


def _takes(owner: argparse.ArgumentParser, token: str, known: list[str]) -> bool:
    """Whether ``owner`` takes ``token`` as one of its options, exactly or as argparse
    takes an abbreviation (a prefix of a long option; an ambiguous one argparse refuses)."""
    name = token.split("=", 1)[0]
    return name in known or (name.startswith("--") and owner.allow_abbrev
                             and any(k.startswith(name) for k in known if k.startswith("--")))


def _options_among(tokens: list[str], owner: argparse.ArgumentParser
                   ) -> tuple[dict[str, list[str]], list[str]]:
    """The options of ``owner`` among ``tokens``, each with its values, and the rest.
    An option whose value is missing gets its placeholder (``--max N``)."""
    actions = {name: action for action in owner._actions  # noqa: SLF001
               for name in action.option_strings if action.dest not in ("help", "version")}
    found: dict[str, list[str]] = {}
    kept: list[str] = []
    at = 0
    while at < len(tokens):
        token, name = tokens[at], tokens[at].split("=", 1)[0]
        at += 1
        if token == "--":  # what follows is no option
            return found, [*kept, *tokens[at - 1:]]
        if name not in actions:
            kept.append(token)
            continue
        taken, nargs = [token], actions[name].nargs
        while token == name and nargs != 0 and at < len(tokens) \
                and not tokens[at].startswith("--") and (nargs in ("+", "*") or len(taken) == 1):
            taken.append(tokens[at])
            at += 1
        if token == name and nargs != 0 and len(taken) == 1:
            taken.append(str(actions[name].metavar))
        found.setdefault(name, []).extend(taken)
    return found, kept


def _seconds(text: str) -> int:
    """A time (``--now``, ``--older-than``): whole seconds, 0 or more."""
    return _whole(text, "invalid_seconds", "seconds", least=0, most=MAX_SECONDS)


def _positive(text: str) -> int:
    """A duration (``--lease-seconds``): whole seconds, 1 or more."""
    return _whole(text, "invalid_seconds", "seconds", least=1, most=MAX_SECONDS)


def _count(text: str) -> int:
    """A number of messages (``--max``, ``--batch-size``): 1 or more."""
    return _whole(text, "invalid_count", "a count of messages", least=1, most=MAX_COUNT)


def _priority(text: str) -> int:
    """A priority (``--priority``): 0 to 9 (``priority.PRIORITIES``, without loading the engine)."""
    return _whole(text, "invalid_priority", "a priority", least=0, most=9)


def _whole(text: str, code: str, what: str, least: int, most: int) -> int:
    """Plain ASCII digits only: ``int()`` would also take ``1_0``, ``+3``, ``-0``,
    `` 5`` and full-width digits. No option gives a negative number a meaning."""
    # SQLite stores 64-bit integers; now + lease must fit too (and int() refuses 4301 digits)
    digits = re.fullmatch(r"[0-9]{1,%d}" % len(str(most)), text)
    if digits is None or not least <= int(text) <= most:
        raise argparse.ArgumentTypeError(f"{code}: expected {what}, a whole number from "
                                         f"{least} to {most}, got {text!r}")
    return int(text)


def _rule(text: str) -> str:
    """An id rule (``--ids``): one of ``ids.RULES``."""
    if text not in ("course", "general"):  # ``ids.RULES``, without loading the engine
        raise argparse.ArgumentTypeError(f"unknown_id_rule: expected course or general, "
                                         f"got {text!r}")
    return text


def _category(text: str) -> str:
    """A category a handler accepts (``--accept``): not empty, as an effect's is
    (the schema's ``category_named``)."""
    if not text:
        raise argparse.ArgumentTypeError("invalid_category: expected a category's name, "
                                         "got an empty one: leave it out, or name the category")
    return text


class _Once(argparse.Action):
    """An option that may be given twice only with the same value: ``--ids general
    --ids course`` is refused rather than left to its last word (a queue's rule is
    chosen once, for good)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        before = getattr(namespace, self.dest, None)
        if before is not None and before != values:
            raise argparse.ArgumentError(self, f"conflicting_option: given as {before} and "
                                               f"as {values}; choose one")
        setattr(namespace, self.dest, values)


def _target(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("invalid_db: expected a file path or a postgresql:// "
                                         f"connection string, got {text!r}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # bytes the file system gave that are not UTF-8
        raise argparse.ArgumentTypeError(f"invalid_db: {text!r} is not UTF-8 text, and SQLite "
                                         "names its files in UTF-8: give a path whose every "
                                         "name is UTF-8 (rename the one that is not)") from None
    if text.startswith(("postgresql://", "postgres://")):  # ``sqlite.is_connection_string``
        try:
            urlsplit(text).port  # a port that is no number, or out of range; a broken [host]
        except ValueError as broken:
            # Said without the string itself: it may hold a password.
            raise argparse.ArgumentTypeError(
                f"invalid_db: the connection string is not a valid URL ({broken}); write it "
                "as postgresql://USER:PASSWORD@HOST:PORT/DATABASE") from None
    return text
