"""The command line: ``python -m queue_core`` (or ``queue-core``).

Exit status: 0 on success (``work`` included, whatever the outcomes);
2 for refused input (a rejected batch, a message that cannot be redriven,
bad arguments), with ``line N: CODE: explanation`` or ``CODE: explanation``
on stderr; 1 for an operational error (the database file is unusable).
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
from typing import Sequence

from .clock import Clock, ModelClock, SystemClock
from .errors import IntegrityViolation, QueueError
from .handler import Handler
from .ingest import read_batch
from .queue import Queue
from .worker import drain

DEFAULT_DB = "queue.sqlite3"
EXIT_REFUSED = 2
EXIT_OPERATIONAL = 1
MAX_SECONDS = 10**12  # about 31,700 years: far beyond any clock, far below 2**63


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="queue-core",
        description="A reliable queue in one SQLite file: lease, fencing generation, "
                    "effect and ACK in one transaction.")
    parser.add_argument("--db", default=DEFAULT_DB, metavar="PATH",
                        help=f"database file, created on first use (default: {DEFAULT_DB})")
    parser.add_argument("--now", type=_seconds, metavar="T",
                        help="model time in integer seconds (default: the system clock)")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    enqueue = commands.add_parser("enqueue", help="validate a JSONL batch whole, then store it")
    enqueue.add_argument("file", metavar="FILE")
    work = commands.add_parser("work", help="process every message due now, then exit")
    work.add_argument("--lease-seconds", type=_positive, default=30, metavar="S")
    work.add_argument("--accept", nargs="+", default=[], metavar="CATEGORY",
                      help="also accept these categories, as a newer handler would")
    work.add_argument("--batch-size", type=_positive, default=1, metavar="K",
                      help="claim and ACK up to K messages per transaction (default: 1)")
    status = commands.add_parser("status", help="stored counts and money; recovers nothing")
    status.add_argument("--json", action="store_true", help="print one JSON object")
    redrive = commands.add_parser("redrive", help="send a dead message back to ready")
    redrive.add_argument("event_id", metavar="EVENT_ID")
    commands.add_parser("demo", help="run the reference scenario in a temporary database")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _run(args)
    except IntegrityViolation as exc:  # the file was changed behind the protocol
        print(f"error: {exc.code}: {exc}", file=sys.stderr)
        return EXIT_OPERATIONAL
    except QueueError as exc:
        print(_refusal(exc), file=sys.stderr)
        return EXIT_REFUSED
    except sqlite3.Error as exc:
        print(f"error: database_error: {args.db}: {exc}", file=sys.stderr)
        return EXIT_OPERATIONAL


def _run(args: argparse.Namespace) -> int:
    if args.command == "demo":
        from .demo import run_demo
        run_demo()
        return 0
    # A rejected batch must leave no trace, not even a new empty database file.
    batch = read_batch(args.file) if args.command == "enqueue" else None
    clock: Clock = SystemClock() if args.now is None else ModelClock(args.now)
    queue = Queue(args.db, clock=clock, lease_seconds=getattr(args, "lease_seconds", 30))
    if batch is not None:
        result = queue.enqueue(batch)
        print(f"inserted {result.inserted}, duplicates {result.duplicates}")
    elif args.command == "work":
        handler = Handler().supporting(*args.accept)
        outcomes = drain(queue, handler, batch_size=args.batch_size,
                         on_outcome=lambda outcome: print(outcome, flush=True))
        print(f"nothing left to claim at t={clock.now()} ({len(outcomes)} processed)")
    elif args.command == "status":
        _print_status(queue, as_json=args.json)
    elif args.command == "redrive":
        queue.redrive(args.event_id)
        print(f"{args.event_id} is ready again (attempts reset, generation kept)")
    return 0


def _print_status(queue: Queue, *, as_json: bool) -> None:
    status = queue.status()
    if as_json:
        print(json.dumps(status.as_dict(), sort_keys=False))
        return
    print("states:  " + ", ".join(f"{name} {n}" for name, n in status.states.items()))
    print(f"effects: {status.effects}")
    for category, cents in status.totals.items():
        print(f"  {category:<8}{cents:>12}")
    print(f"total:   {status.total}")


def _refusal(exc: QueueError) -> str:
    text = str(exc)
    return text if text.startswith(("line ", f"{exc.code}:")) else f"{exc.code}: {text}"


def _seconds(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integer seconds, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"time cannot be negative, got {value}")
    if value > MAX_SECONDS:  # SQLite stores 64-bit integers; now + lease must fit too
        raise argparse.ArgumentTypeError(f"at most {MAX_SECONDS} seconds, got {value}")
    return value


def _positive(text: str) -> int:
    value = _seconds(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value
