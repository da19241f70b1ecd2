"""Run a worker in a real, separate OS process, optionally armed to crash.

The course's crashes are real: the child is a new Python interpreter that
dies by ``os._exit`` at a named crash point, so nothing in it gets to clean
up, and SQLite alone decides what survives.

    python -m queue_core.lab.story.child '{"db": "...", "now": 1000, "crash_at": "complete.after_insert"}'
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from ...clock import ModelClock, SystemClock
from ...crashpoints import CRASH_EXIT_CODE, arm
from ...errors import ConnectionLost
from ...handler import Handler
from ...values import Effect, Outcome
from ...queue import Queue
from ...worker import drain, finish_and_claim, process_one
from .contrasts import protocol
from .faults import FlakyHandler

MODES = ("one", "each", "drain")
LOST_EXIT_CODE = 3  # a PostgreSQL connection lost under the worker: one line, then this
_PACKAGE_PARENT = str(Path(__file__).resolve().parents[3])  # the folder that holds queue_core
GATE_TIMEOUT_SECONDS = 30.0


@dataclass(frozen=True, slots=True)
class ChildResult:
    """How the child ended and what it reported before that."""

    exit_code: int
    outcomes: tuple[Outcome, ...]

    @property
    def crashed(self) -> bool:
        return self.exit_code == CRASH_EXIT_CODE


def run_child(db_path: str | os.PathLike[str], *, now: int | None = None,
              lease_seconds: int = 30, crash_at: str | None = None, mode: str = "one",
              accept: Sequence[str] = (), batch_size: int = 1,
              wait: bool = True, protocol: str = "protocol",
              faults: Mapping[str, Any] | None = None,
              crash_after: int = 1,
              gate: str | os.PathLike[str] | None = None,
              work_ms: int = 0) -> ChildResult | subprocess.Popen[str]:
    """Start a worker process on ``db_path``; ``mode`` is ``one``, ``each`` or ``drain``.

    ``one`` claims and finishes one message; ``each`` claims and finishes
    every due message, a claim and an ACK transaction each (``process_one``
    in a loop); ``drain`` is the worker loop (``worker.drain``), in which
    each ACK claims the next message in the same transaction. ``mode_for``
    names the mode whose path passes through a crash point.

    ``now`` fixes the child's model clock (the system clock if ``None``).
    With ``wait=False`` the running ``Popen`` is returned; pass it to
    ``collect`` to get the ``ChildResult``. ``protocol`` names one of
    ``queue_core.lab.story.contrasts.PROTOCOLS`` (the broken ones are teaching contrasts);
    ``faults`` configures injected transient faults
    (``queue_core.lab.story.faults.FlakyHandler.from_spec``); ``crash_after`` is
    which arrival at ``crash_at`` kills the worker (the first by default).
    With a ``gate`` folder the child starts, opens the database, then waits
    there until ``open_gate`` lets all the waiting children go at once.
    ``work_ms`` is real time a ``drain`` worker spends on each message between
    its claim and its ACK, outside any transaction, as a handler that reads,
    computes or calls out would (one message at a time); the loop stays
    ``drain``'s, each ACK claiming the next message.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    spec = {"db": os.fspath(db_path), "now": now, "lease_seconds": lease_seconds,
            "crash_at": crash_at, "mode": mode, "accept": list(accept),
            "batch_size": batch_size, "protocol": protocol, "faults": dict(faults or {}),
            "crash_after": crash_after, "gate": None if gate is None else os.fspath(gate),
            "work_ms": work_ms}
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [_PACKAGE_PARENT, *filter(None, [os.environ.get("PYTHONPATH")])]))
    proc = subprocess.Popen([sys.executable, "-m", "queue_core.lab.story.child", json.dumps(spec)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    return collect(proc) if wait else proc


def mode_for(point: str) -> str:
    """The worker mode that passes through crash ``point`` on every message:
    ``drain`` for the worker loop's own step (``complete_and_claim.*``),
    ``each`` for the plain claim, ACK and failure steps."""
    return "drain" if point.startswith("complete_and_claim.") else "each"


def open_gate(gate: str | os.PathLike[str], workers: int) -> None:
    """Wait until ``workers`` children wait at ``gate``, then let them all start.

    Starting a Python process takes longer than draining a small queue, so
    without a common start the first child often finishes before the second
    has begun. Raises ``TimeoutError`` after ``GATE_TIMEOUT_SECONDS``.
    """
    folder = Path(gate)
    _wait_for(lambda: len(list(folder.glob("ready-*"))) >= workers,
              f"{workers} workers at the gate")
    (folder / "go").touch()


def wait_at_gate(gate: str) -> None:
    """In a child: say it is ready at ``gate``, then wait until ``open_gate`` opens it."""
    folder = Path(gate)
    (folder / f"ready-{os.getpid()}").touch()
    _wait_for((folder / "go").exists, "the gate to open")


def _wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + GATE_TIMEOUT_SECONDS
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {GATE_TIMEOUT_SECONDS:.0f} s for {what}")
        time.sleep(0.0005)  # polling a file: half a millisecond keeps the start together


def collect(proc: subprocess.Popen[str]) -> ChildResult:
    """Wait for a child started with ``wait=False``; raise if it failed oddly."""
    out, err = proc.communicate()
    if proc.returncode not in (0, CRASH_EXIT_CODE):
        raise RuntimeError(f"worker process exited with {proc.returncode}: {err.strip()}")
    return ChildResult(proc.returncode, tuple(_outcome(line) for line in out.splitlines()))


def reap(procs: Iterable[subprocess.Popen[str]]) -> None:
    """Kill and wait for every child not yet collected, so that none outlives
    an error in the parent (and keeps writing to a folder about to be removed)."""
    for proc in procs:
        if proc.returncode is None:
            proc.kill()
            proc.communicate()


def _outcome(line: str) -> Outcome:
    data = json.loads(line)
    effect = data.pop("effect")
    return Outcome(**data, effect=Effect(**effect) if effect else None)


def _report(outcome: Outcome) -> None:
    effect = outcome.effect
    print(json.dumps({"event_id": outcome.event_id, "kind": outcome.kind,
                      "generation": outcome.generation, "code": outcome.code,
                      "available_at": outcome.available_at, "detail": outcome.detail,
                      "effect": None if effect is None else
                      {"category": effect.category, "amount_cents": effect.amount_cents}}),
          flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    spec = json.loads((argv if argv is not None else sys.argv[1:])[0])
    clock = SystemClock() if spec["now"] is None else ModelClock(spec["now"])
    queue_class = protocol(spec.get("protocol", "protocol")).queue_class
    queue = queue_class(spec["db"], clock=clock, lease_seconds=spec["lease_seconds"])
    handler = Handler().supporting(*spec["accept"])
    if spec.get("faults"):
        handler = FlakyHandler.from_spec(handler.categories, spec["faults"])
    arm(spec["crash_at"], after=spec.get("crash_after", 1))
    if spec.get("gate"):
        wait_at_gate(spec["gate"])
    if spec["mode"] == "one":
        outcome = process_one(queue, handler)
        if outcome is not None:
            _report(outcome)
    elif spec["mode"] == "each":
        with queue.session():
            while (outcome := process_one(queue, handler)) is not None:
                _report(outcome)
    elif spec.get("work_ms"):
        _drain_working(queue, handler, spec["work_ms"] / 1000)
    else:
        drain(queue, handler, batch_size=spec["batch_size"], on_outcome=_report)
    return 0


def _drain_working(queue: Queue, handler: Handler, seconds: float) -> None:
    """``drain``'s loop, with ``seconds`` of work on each message between the
    commit that claimed it and its ACK, outside any transaction.

    The steps are ``drain``'s own (one claim, then each ACK claims the next
    message: ``finish_and_claim``, one transaction per message, as in
    ``queue-core work``); only the work is added, where a handler that reads,
    computes or calls out does it. ``drain`` itself cannot hold it: its
    handler runs inside the ACK's transaction, holding the write lock. The
    lock is free while a worker works, so the others ACK and claim meanwhile.
    """
    with queue.session():
        lease = queue.claim()
        while lease is not None:
            time.sleep(seconds)
            outcome, lease = finish_and_claim(queue, lease, handler)
            _report(outcome)


def _main_on_a_network() -> int:
    """``main``, and a PostgreSQL connection lost under it as one line (exit 3),
    as ``queue-core work`` prints it: the network sweep breaks connections."""
    try:
        return main()
    except ConnectionLost as lost:
        print(f"error: connection_lost: {lost}", file=sys.stderr)
        return LOST_EXIT_CODE


if __name__ == "__main__":
    raise SystemExit(_main_on_a_network())
