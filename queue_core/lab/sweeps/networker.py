"""The worker of one network-sweep case, in a process of its own (``network``).

    python -m queue_core.lab.sweeps.networker '{"db": "postgresql://...", "protocol": "protocol"}'

It drains the queue as ``queue-core work`` does, through the fault proxy,
with the protocol named (a broken contrast among them), printing each
outcome; a lost connection ends it with one ``connection_lost`` line and
exit status 3. Not imported by ``queue_core.lab.sweeps``: ``-m`` runs it fresh.
"""

from __future__ import annotations

import json
import sys
from typing import Sequence

from ...clock import ModelClock
from ...errors import ConnectionLost
from ...worker import drain
from ..story.contrasts import protocol
from ..story.scenario import LEASE_SECONDS, START
from .network import LOST_EXIT
from .sweep import current_handler


def main(argv: Sequence[str] | None = None) -> int:
    """The worker of one case: drain through the proxy; one line if the connection is lost."""
    spec = json.loads((argv if argv is not None else sys.argv[1:])[0])
    queue = protocol(spec["protocol"]).open(spec["db"], clock=ModelClock(START),
                                            lease_seconds=LEASE_SECONDS)
    try:
        drain(queue, current_handler(), on_outcome=lambda outcome: print(outcome, flush=True))
    except ConnectionLost as lost:
        print(f"error: connection_lost: {lost}", file=sys.stderr)
        return LOST_EXIT
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
