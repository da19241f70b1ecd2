"""The network sweep: break a real worker's connection at every step, then audit (notebook 14).

Like the crash sweep (``sweep``), for each protocol, each step of a worker's
conversation with PostgreSQL and each fault, ``run_network_sweep`` enqueues
the crash sweep's five events in a fresh schema and starts a real worker
process (``queue_core.lab.story.child``, the crash sweep's) whose connection goes
through a ``FaultProxy``. The proxy breaks it at the step (``STEPS``); the
worker ends as it must (the protocol's with one ``connection_lost`` line);
then a fresh worker runs the queue to completion on the model clock, and
the shared audit judges the schema (``sweep.classify``): money, effects and
states exact.

The faults: ``cut`` and ``reset`` (the connection closes, with end of file
or a TCP reset), ``blackhole`` (nothing more arrives either way, then a
cut), and ``delay``: the message is held while another worker, whose model
clock is past the lease, claims what it can; then it goes on. That is a
slow network, not a broken one: the held worker's lease has been taken over.

``commit.answered`` is the commit whose outcome is unknown: the server has
committed, and its answer never reaches the worker. The protocol leaves the
first ACKed message either done with its effect (the COMMIT took effect) or
leased, then redelivered and done once (``first_ack`` says which).
``rerun after lost connection`` (``contrasts.NETWORK_PROTOCOLS``) counts its
effect outside the ACK's transaction and runs the whole message again after
the lost connection: there the money doubles.
"""

from __future__ import annotations

import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Mapping, Sequence

from ... import audit as ledger_audit
from ...clock import ModelClock
from ...queue import Queue
from ..servers.faultproxy import Fault, FaultProxy
from ..servers.pgcases import Schemas
from ..story.child import LOST_EXIT_CODE, run_child
from ..story.contrasts import NETWORK_PROTOCOLS, PROTOCOLS, create_ledger, protocol
from ..story.scenario import LEASE_SECONDS, START
from .sweep import (ACCEPT, FAULTS as SWEEP_FAULTS, classify, current_handler, enqueue_batch,
                    run_to_completion)

if TYPE_CHECKING:
    import pandas
    from matplotlib.figure import Figure

# The statements the faults are placed by: the ACK's guarded UPDATE, a claim,
# and the worker loop's step as one call of the schema's function
# (``postgres.STEP_FUNCTION``), which holds the ACK, its effect and the claim of
# the next message in one statement, sent with its BEGIN and COMMIT as one
# message. Where the protocol's step is that message, ``effect.insert``,
# ``ack.update``, ``ack.claim_next`` and ``commit.sent`` all break the connection
# before the first one arrives, and ``commit.answered`` withholds the server's
# answer once it has committed it; the contrasts still send each statement on
# its own.
ACK_STATEMENT = "SET state = 'done'"
CLAIM_STATEMENT = "SET state = 'leased'"
STEP_STATEMENT = "queue_core_step("
ACKS = (ACK_STATEMENT, STEP_STATEMENT)
# Each step: where the proxy acts, as the wire protocol shows it.
STEPS: dict[str, dict[str, str | tuple[str, ...]]] = {
    "claim": {"statement": CLAIM_STATEMENT},                        # during the first claim
    "effect.insert": {"statement": ("category, amount_cents) VALUES",  # the first effect
                                    STEP_STATEMENT)},
    "ack.update": {"statement": ACKS},                              # the ACK's guarded UPDATE
    "ack.claim_next": {"statement": (CLAIM_STATEMENT, STEP_STATEMENT),  # between the ACK's
                       "after": ACKS},                             # round trips: the next claim
    "commit.sent": {"statement": "COMMIT", "after": ACKS},          # before the COMMIT arrives
    "commit.answered": {"reply": "COMMIT", "after": ACKS},          # committed, answer withheld
}
FAULTS = ("cut", "reset", "blackhole", "delay")
PROTOCOL_NAMES = (*PROTOCOLS, *NETWORK_PROTOCOLS)
BLACKHOLE_SECONDS = 0.5   # then the proxy cuts: the worker's wait ends
DELAY_SECONDS = 20.0      # the longest a delay holds; released once the other worker claimed
CASE_SECONDS = 60.0       # the longest a faulted worker may run
LOST_EXIT = LOST_EXIT_CODE  # the worker's exit status after one connection_lost line


@dataclass(frozen=True)
class NetRow:
    """One case: protocol, step, fault; how the worker ended; what the audit found."""

    protocol: str
    step: str
    fault: str
    outcome: str
    total: int
    worker: str
    first_ack: str
    detail: str
    effects: int = 0                                  # effect rows, wherever written
    states: tuple[tuple[str, int], ...] = ()          # final count per state, none left out

    @property
    def failed(self) -> bool:
        return self.outcome != "ok"


def run_network_sweep(server: str, protocols: Iterable[str] = PROTOCOL_NAMES,
                      steps: Sequence[str] = tuple(STEPS), faults: Sequence[str] = FAULTS, *,
                      jobs: int = 2, priorities: Mapping[str, int] | None = None
                      ) -> list[NetRow]:
    """Every step times every fault, per protocol, on ``server`` (a
    ``postgresql://`` string): a schema per case, dropped at the end. With
    ``priorities`` the events are enqueued with them (``sweep.enqueue_batch``)."""
    for name in steps:
        if name not in STEPS:
            raise ValueError(f"unknown step {name!r}; known: {', '.join(STEPS)}")
    cases = [(protocol(p).name, s, f) for p in protocols for s in steps for f in faults]
    with Schemas(server, "queue_net") as schemas, ThreadPoolExecutor(max(1, jobs)) as pool:
        places = [schemas.fresh(f"{p[:6]}_{s}_{f}") for p, s, f in cases]
        return list(pool.map(lambda case: run_case(server, *case[0], case[1], priorities),
                             zip(cases, places)))


def run_case(server: str, name: str, step: str, fault: str, db: str,
             priorities: Mapping[str, int] | None = None) -> NetRow:
    """One case on the empty schema ``db``: set up, break, recover, audit."""
    proto = protocol(name)
    setup = proto.open(db, clock=ModelClock(START), lease_seconds=LEASE_SECONDS,
                       synchronous="NORMAL")
    enqueue_batch(setup, priorities)
    create_ledger(setup)
    seconds = {"blackhole": BLACKHOLE_SECONDS, "delay": DELAY_SECONDS}.get(fault, 0.0)
    with FaultProxy(server, Fault(fault, seconds=seconds, **STEPS[step]),  # type: ignore[arg-type]
                    lifetime=CASE_SECONDS + 10) as proxy:
        worker = _start_worker(proxy.dsn(db), name)
        try:
            if fault == "delay":
                _take_over_while_held(proxy, worker, proto.open(db, clock=ModelClock(
                    START + LEASE_SECONDS), lease_seconds=LEASE_SECONDS))
            out, err = worker.communicate(timeout=CASE_SECONDS)
        finally:
            if worker.returncode is None:
                worker.kill()
                worker.communicate()
        fired = proxy.fired.is_set()
    after = ledger_audit.snapshot(db).messages["E0001"]
    clock = ModelClock(START)
    refused = None
    try:
        finished = run_to_completion(proto.open(db, clock=clock, lease_seconds=LEASE_SECONDS),
                                     clock, current_handler())
    except Exception as exc:  # noqa: BLE001 - a broken protocol's recovery may be refused
        finished, refused = False, " ".join(str(exc).split())[:100]
    snap = ledger_audit.snapshot(db)
    outcome, total, detail = classify(snap, ledger_audit.check(snap), finished)
    if refused is not None:
        detail = f"{detail}; the recovery was refused: {refused}"
    if not fired:
        outcome, detail = "not reached", "the worker never got there"
    final = snap.messages["E0001"]
    first_ack = (f"{after.state.value} at generation {after.generation}, then "
                 f"{final.state.value} at generation {final.generation}")
    return NetRow(name, step, fault, outcome, total, _how_it_ended(worker.returncode, err),
                  first_ack, detail, len(snap.effect_rows), tuple(snap.status.states.items()))


def _start_worker(dsn: str, name: str) -> subprocess.Popen[str]:
    """The crash sweep's worker process, armed nowhere: the worker loop (``drain``)."""
    worker = run_child(dsn, now=START, lease_seconds=LEASE_SECONDS, mode="drain",
                       accept=ACCEPT, protocol=name, faults=SWEEP_FAULTS, wait=False)
    assert isinstance(worker, subprocess.Popen)  # wait=False: the running process
    return worker


def _take_over_while_held(proxy: FaultProxy, worker: subprocess.Popen[str], other: Queue) -> None:
    """While the delay holds the worker's message, another worker claims at a
    model time past every lease (recovering the held one's, if its row is
    not locked); then the message goes on."""
    deadline = time.monotonic() + CASE_SECONDS
    while not proxy.fired.wait(0.05):
        if worker.poll() is not None or time.monotonic() > deadline:
            return
    try:
        other.claim()
    finally:
        proxy.release()


def _how_it_ended(code: int | None, err: str) -> str:
    # Python's own note that ``-m`` runs a module its package imported already
    # (story's __init__ names the child) is the interpreter's, not the worker's
    lines = [line for line in err.strip().splitlines() if not line.startswith("<frozen runpy>")]
    if code == 0 and not lines:
        return "finished"
    if code == LOST_EXIT and len(lines) == 1 and lines[0].startswith("error: connection_lost:"):
        return "connection_lost"
    return f"exit {code}: {lines[-1] if lines else ''}"[:120]


def network_frame(rows: Sequence[NetRow]) -> "pandas.DataFrame":
    """The sweep as a table: (step, fault) down, protocols across, outcomes in the cells."""
    import pandas as pd

    frame = pd.DataFrame([{"step": r.step, "fault": r.fault, "protocol": r.protocol,
                           "outcome": r.outcome} for r in rows])
    table = frame.pivot(index=["step", "fault"], columns="protocol", values="outcome")
    order = [(s, f) for s in STEPS for f in FAULTS if (s, f) in set(table.index)]
    return table.loc[order, list(dict.fromkeys(r.protocol for r in rows))].rename_axis(
        columns=None)


def plot_network_sweep(rows: Sequence[NetRow],
                       title: str = "Network sweep: outcome per step, fault and protocol"
                       ) -> "Figure":
    """Draw the sweep: (step, fault) on the y axis, protocols across, outcome as colour."""
    import matplotlib.pyplot as plt

    from .sweep import draw_outcomes, outcome_legend

    table = network_frame(rows)
    fig, ax = plt.subplots(figsize=(9.5, max(3.0, 1.4 + 0.3 * len(table.index))))
    draw_outcomes(ax, table, ("ok",), str)
    ax.set_xticks(range(len(table.columns)), [c.replace(" ", "\n", 2) for c in table.columns],
                  fontsize=8)
    ax.set_yticks(range(len(table.index)), [f"{s} / {f}" for s, f in table.index], fontsize=8)
    ax.set_ylabel("where the connection broke / how")
    ax.set_title(title)
    outcome_legend(ax, table)
    fig.tight_layout()
    return fig
