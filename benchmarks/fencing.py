"""A late ack: what each PostgreSQL queue does when a consumer acknowledges an
item that has meanwhile been handed to another consumer.

    python benchmarks/fencing.py          # ours, pgqueuer, procrastinate, on a private server

Per queue, in one process with two connections: consumer A gets the only
item; A stalls past its lease (ours: a one-second lease; pgqueuer: a
one-second heartbeat timeout; procrastinate: its documented recovery,
``get_stalled_jobs`` with one second and ``retry_job``); consumer B gets the
same item; then A acks, late, and B acks. A fencing queue refuses A's ack
and accepts B's; a queue that does not accepts A's ack for an item B is
still working on, so both ran the job and the store records A's result.
Counted afterwards in the queue's own tables: acknowledgements recorded,
items still pending.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # the adapters live next to this file
    sys.path.insert(0, str(HERE))

from peer_base import Adapter, item_of  # noqa: E402
from peers import ADAPTERS, OURS, installed_peers  # noqa: E402

from queue_core.lab.servers.pgcases import Schemas  # noqa: E402
from queue_core.lab.servers.postgres_server import private_postgres  # noqa: E402

STALL_S = 1.2  # longer than the one-second lease or heartbeat timeout


def _short_lease(adapter: type[Adapter]) -> type[Adapter]:
    """The adapter with a one-second lease, where it has one."""
    if adapter.lease_seconds is None:
        return adapter
    return type(f"{adapter.__name__}OneSecond", (adapter,), {"lease_seconds": 1})


def late_ack(name: str, schemas: Schemas) -> dict[str, Any]:
    """A gets the item, stalls, B gets it again, A acks late, B acks."""
    adapter = ADAPTERS[name]
    path = adapter.fresh(schemas, f"{name}_late")
    # B takes a long lease where the claim sets it (a one-second lease in whole
    # seconds can end at once); where the reader judges staleness, B says one second
    first = _short_lease(adapter)(path)
    second = (_short_lease(adapter) if adapter.reader_judges_lease else adapter)(path)
    try:
        first.put([item_of(0)])
        taken_a = first.get()
        time.sleep(STALL_S)
        second.recover_stalled(1.0)
        taken_b = second.get()
        outcome = {"a_got": None if taken_a is None else taken_a[1],
                   "b_got": None if taken_b is None else taken_b[1]}
        if taken_a is None or taken_b is None:
            return {**outcome, "late_ack": "not reached", "b_ack": "not reached",
                    "settled": first.settled()}
        outcome["late_ack"] = _ack(first, taken_a[0])
        outcome["settled_after_a"] = first.settled()
        outcome["b_ack"] = _ack(second, taken_b[0])
        outcome["settled"] = first.settled()
        return outcome
    finally:
        first.close()
        second.close()


def _ack(queue: Adapter, handle: Any) -> str:
    try:
        queue.ack(handle)
    except Exception as exc:  # a library's refusal is the finding
        cause = exc if exc.__cause__ is None else exc.__cause__  # the database's own words
        return f"refused ({type(cause).__name__}: {(str(cause).strip() or '-').splitlines()[0][:60]})"
    return "accepted"


def late_acks(schemas: Schemas, names: list[str] | None = None) -> dict[str, dict[str, Any]]:
    """``late_ack`` for ours on PostgreSQL and every installed PostgreSQL peer."""
    chosen = names or [*(a.name for a in OURS.values() if a.store == "postgres"),
                       *(a.name for a in installed_peers("postgres"))]
    return {name: late_ack(name, schemas) for name in chosen}


def report(results: dict[str, dict[str, Any]]) -> list[str]:
    lines = ["a late ack on PostgreSQL: A got the item, stalled past its lease, B got it again; "
             "A acked late, then B (settled = acknowledged, pending, counted in the queue's "
             "tables after each)"]
    for name, found in results.items():
        lines.append(f"  {name:<15} A's late ack {found['late_ack']}, settled "
                     f"{found.get('settled_after_a')}; B's ack {found['b_ack']}, settled "
                     f"{found['settled']}")
    return lines


def main() -> int:
    with private_postgres() as server, Schemas(server, "queue_fencing") as schemas:
        print("\n".join(report(late_acks(schemas))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
