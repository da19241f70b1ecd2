"""Two-process and crash probes for each queue of ``peers.py``, and for ours.

    python benchmarks/peer_safety.py              # every installed peer and queue_core
    python benchmarks/peer_safety.py --n 200 --rounds 3 litequeue

Speed is half the question; the other half is what a queue delivers when
two consumer processes share it, or when a consumer dies. Per queue:

* two consumers: enqueue ``n`` items in a fresh store; start two real
  consumer OS processes, each opening the queue and then waiting at a
  common starting gate (a folder: each writes ``ready-PID``, the parent
  writes ``go``); each gets, works for ``WORK_S`` (a handler's time, and
  a pause that lets the other consumer in: without it, SQLite's busy
  handler lets whichever process holds the lock take item after item while
  the other sleeps, and nothing is shared), acks, until nothing is ready,
  and reports what it got. Counted: items delivered more than once (duplicates) and
  items never delivered (missing), over ``rounds`` fresh stores.
* crash: enqueue a few items; a consumer gets one and dies by ``os._exit``
  before acking; after a pause longer than our lease (the probe runs ours
  with a one-second lease) a fresh consumer drains the queue. Is the item
  delivered again (at least once), or not? If not, is it still stored
  (held: someone must release it by hand) or gone (lost)?
* durability: the ``journal_mode`` and ``synchronous`` the consumer's
  connection runs with, read back from it (on PostgreSQL: whether the
  library's tables are WAL-logged, and ``synchronous_commit``).

The PostgreSQL queues (``--postgres``: ours and ``pgpeers.py``'s) run the
same probes, each store a fresh schema on a private server (or
``QUEUE_CORE_PG_DSN``); the crash gives every queue that has one a
one-second lease (pgqueuer: its heartbeat timeout).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # the adapters live next to this file
    sys.path.insert(0, str(HERE))

from peers import ADAPTERS, OURS, installed_peers, item_of  # noqa: E402

from queue_core.lab.servers.pgcases import Schemas  # noqa: E402
from queue_core.lab.servers.postgres_server import private_postgres  # noqa: E402

CRASH_EXIT_CODE = 70
GATE_TIMEOUT_S = 30.0
CRASH_PAUSE_S = 2.1  # more than the one-second lease our queue runs with in the crash probe
WORK_S = 0.002  # between get and ack, in every consumer of every queue
MAX_ERRORS = 20  # a consumer that hits more errors than this stops and reports them


# -- the consumer process -------------------------------------------------------

def consume(spec: dict[str, Any]) -> None:
    """Open the queue, wait at the gate (if any), then get and ack until
    nothing is ready; print what came. With ``crash``, die after the first
    get, before its ack."""
    adapter = ADAPTERS[spec["peer"]]
    if adapter.lease_seconds is not None and spec.get("lease_seconds"):
        adapter.lease_seconds = spec["lease_seconds"]
    queue = adapter(spec["path"])
    pragmas = queue.pragmas()
    if spec.get("gate"):
        gate = Path(spec["gate"])
        (gate / f"ready-{os.getpid()}").touch()
        _wait_for(lambda: (gate / "go").exists(), "the gate to open")
    got: list[str] = []
    errors: list[str] = []
    while len(errors) <= MAX_ERRORS:
        try:
            taken = queue.get()
        except Exception as exc:  # a library's own error is a finding, not a crash of the probe
            errors.append(f"get: {type(exc).__name__}: {exc}")
            continue
        if taken is None:
            break
        got.append(taken[1])
        if spec.get("crash"):
            print(json.dumps({"got": got, "errors": errors, **pragmas}), flush=True)
            os._exit(CRASH_EXIT_CODE)  # no ack, no clean-up: SQLite alone decides what stays
        time.sleep(WORK_S)
        try:
            queue.ack(taken[0])
        except Exception as exc:
            errors.append(f"ack: {type(exc).__name__}: {exc}")
    print(json.dumps({"got": got, "errors": errors, **pragmas}), flush=True)
    queue.close()


def _wait_for(condition: Any, what: str) -> None:
    deadline = time.monotonic() + GATE_TIMEOUT_S
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {GATE_TIMEOUT_S:.0f} s for {what}")
        time.sleep(0.0005)


def start_consumer(spec: dict[str, Any]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, __file__, "--consume", json.dumps(spec)],
                            text=True, stdout=subprocess.PIPE)


def finish(proc: subprocess.Popen[str]) -> tuple[int, dict[str, Any]]:
    out, _ = proc.communicate(timeout=300)
    lines = out.strip().splitlines()
    return proc.returncode, (json.loads(lines[-1]) if lines else {"got": [], "errors": []})


# -- the probes -----------------------------------------------------------------

def enqueue(name: str, path: str, n: int) -> None:
    queue = ADAPTERS[name](path)
    queue.put([item_of(i) for i in range(n)])
    queue.close()


def two_consumers(name: str, workdir: Path, n: int, label: str,
                  schemas: Schemas | None = None) -> dict[str, Any]:
    """One round: two consumer processes through one gate on ``n`` items."""
    path = ADAPTERS[name].fresh(_where(name, workdir, schemas), f"{name}_{label}")
    enqueue(name, path, n)
    gate = workdir / f"gate-{name}-{label}"
    gate.mkdir()
    procs = [start_consumer({"peer": name, "path": path, "gate": str(gate)})
             for _ in range(2)]
    try:
        _wait_for(lambda: len(list(gate.glob("ready-*"))) >= 2, "two consumers at the gate")
        (gate / "go").touch()
        reports = [finish(proc)[1] for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    counts = Counter(item for report in reports for item in report["got"])
    wanted = {f"E{i:04d}" for i in range(n)}
    return {"duplicates": sum(1 for c in counts.values() if c > 1),
            "missing": len(wanted - set(counts)),
            "extra": sorted(set(counts) - wanted),
            "per_consumer": [len(report["got"]) for report in reports],
            "errors": [e for report in reports for e in report["errors"]],
            "journal_mode": reports[0].get("journal_mode"),
            "synchronous": reports[0].get("synchronous")}


def _where(name: str, workdir: Path, schemas: Schemas | None) -> Path | Schemas:
    if ADAPTERS[name].store == "sqlite":
        return workdir
    if schemas is None:
        raise ValueError(f"{name} runs on PostgreSQL: the probe needs a server's schemas")
    return schemas


def crash_all(names: list[str], workdir: Path, n: int = 5,
              schemas: Schemas | None = None) -> dict[str, dict[str, Any]]:
    """For every queue at once: a consumer gets one item and dies before its
    ack; after one pause (longer than our queue's lease) a fresh one drains.
    The queues crash side by side, so the pause is paid once, not per queue."""
    paths = {name: ADAPTERS[name].fresh(_where(name, workdir, schemas), f"{name}_crash")
             for name in names}
    for name, path in paths.items():
        enqueue(name, path, n)
    victims = {}
    for name, proc in [(name, start_consumer({"peer": name, "path": path, "crash": True,
                                              "lease_seconds": 1}))
                       for name, path in paths.items()]:
        code, first = finish(proc)
        if code != CRASH_EXIT_CODE or len(first["got"]) != 1:
            raise RuntimeError(f"{name}: the crashing consumer ended with {code}: {first}")
        victims[name] = first["got"][0]
    time.sleep(CRASH_PAUSE_S)
    results = {}
    # The drain after the pause takes a long lease: a lease of one whole second
    # can end a few milliseconds after a claim made late in that second. Where
    # the reader judges staleness (pgqueuer's heartbeat timeout), it says one second.
    for name, proc in [(name, start_consumer({"peer": name, "path": path, "lease_seconds":
                                              1 if ADAPTERS[name].reader_judges_lease else 30}))
                       for name, path in paths.items()]:
        _, after = finish(proc)
        victim = victims[name]
        if victim in after["got"]:
            outcome = "redelivered"
        else:
            outcome = "held" if still_stored(name, paths[name], victim) else "lost"
        others = {f"E{i:04d}" for i in range(n)} - {victim}
        results[name] = {"crash": outcome, "victim": victim,
                         "others_missing": len(others - set(after["got"])),
                         "crash_errors": after["errors"]}
    return results


def still_stored(name: str, path: str, event_id: str) -> bool:
    """Does the queue's store still hold ``event_id`` (held), or not (lost)?"""
    queue = ADAPTERS[name](path)
    try:
        return queue.still_stored(event_id)
    finally:
        queue.close()


def probe(name: str, workdir: Path, n: int = 200, rounds: int = 3,
          schemas: Schemas | None = None) -> dict[str, Any]:
    """The two-consumer rounds for one queue (the crash is ``crash_all``'s)."""
    runs = [two_consumers(name, workdir, n, f"r{r}", schemas) for r in range(rounds)]
    return {"name": name, "n": n, "rounds": runs,
            "duplicates": [run["duplicates"] for run in runs],
            "missing": [run["missing"] for run in runs],
            "errors": sum(len(run["errors"]) for run in runs),
            "journal_mode": runs[0]["journal_mode"], "synchronous": runs[0]["synchronous"]}


def probe_all(workdir: Path, n: int = 200, rounds: int = 3, names: list[str] | None = None,
              schemas: Schemas | None = None) -> dict[str, dict[str, Any]]:
    """Every probe for every queue: ``rounds`` two-consumer rounds each, then the crash.
    By default ours and every installed peer of one store: PostgreSQL's with ``schemas``."""
    store = "sqlite" if schemas is None else "postgres"
    ours = [adapter.name for adapter in OURS.values() if adapter.store == store]
    chosen = names or [*ours, *(adapter.name for adapter in installed_peers(store))]
    crashed = crash_all(chosen, workdir, schemas=schemas)
    return {name: {**probe(name, workdir, n, rounds, schemas), **crashed[name]}
            for name in chosen}


def describe(result: dict[str, Any]) -> str:
    """One line: ``dup 3/0/5 of 200, missing 0/0/0, crash: redelivered``."""
    def per_round(values: list[int]) -> str:
        return "/".join(map(str, values))
    errors = f", {result['errors']} errors" if result["errors"] else ""
    return (f"dup {per_round(result['duplicates'])} of {result['n']}, "
            f"missing {per_round(result['missing'])}{errors}, crash: {result['crash']}")


def report(results: dict[str, dict[str, Any]]) -> list[str]:
    rounds = len(next(iter(results.values()))["rounds"]) if results else 0
    lines = [f"two consumer processes, {rounds} rounds of fresh stores: items delivered twice "
             "(dup) and never (missing), per round; crash = a consumer died after get, before "
             "ack: redelivered, held (stored, released only by hand) or lost",
             f"{'queue':<15}{'journal':>8}{'sync':>8}  result"]
    for name, result in results.items():
        split = " ".join("+".join(map(str, run["per_consumer"])) for run in result["rounds"])
        lines.append(f"{name:<15}{result['journal_mode']:>8}{result['synchronous']:>8}  "
                     f"{describe(result)}; items per consumer {split}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("names", nargs="*", help=f"any of {', '.join(ADAPTERS)} (default: all "
                        "installed of the store)")
    parser.add_argument("--n", type=int, default=200, help="items per two-consumer round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--postgres", action="store_true", help="the PostgreSQL queues")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="queue-safety-") as tmp:
        if args.postgres:
            with private_postgres() as server, Schemas(server, "queue_safety") as schemas:
                results = probe_all(Path(tmp), args.n, args.rounds, args.names or None, schemas)
        else:
            results = probe_all(Path(tmp), args.n, args.rounds, args.names or None)
    print("\n".join(report(results)))
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--consume"]:
        consume(json.loads(sys.argv[2]))
    else:
        raise SystemExit(main())
