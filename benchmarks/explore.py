"""Every interleaving: explore every schedule of the default scenario, per protocol.

    python benchmarks/explore.py            # make explore: about half a minute
    python benchmarks/explore.py --small    # the notebook's smaller scenario
    python benchmarks/explore.py --tree     # also run it without merging states (slow)
    python benchmarks/explore.py --prune    # retention: a prune beside a late duplicate
                                            # enqueue and a stale ACK (make explore PRUNE=1)

Prints, per protocol: the schedules covered, the distinct states and steps
run, the time, and "no violation" or the shortest schedule that breaks it as
numbered steps, replayed on a fresh file. Exits 1 if the protocol has a
violation or a broken protocol has none.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from queue_core.lab.story.contrasts import PROTOCOLS  # noqa: E402
from queue_core.lab.sweeps.explore import DEFAULT, PRUNE, SMALL, explore, replay  # noqa: E402


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="the notebook's scenario")
    parser.add_argument("--tree", action="store_true", help="also explore without merging")
    parser.add_argument("--prune", action="store_true",
                        help="the retention scenario: a prune, a late duplicate, a stale ACK")
    args = parser.parse_args(argv)
    if args.small and args.prune:
        parser.error("--small and --prune name two scenarios: choose one")
    scenario = SMALL if args.small else PRUNE if args.prune else DEFAULT
    print(f"scenario: {scenario}\n")
    problems = []
    for name, proto in PROTOCOLS.items():
        run = explore(name, scenario)
        print(f"{name}: {run.schedules:,} schedules, {run.states:,} distinct states, "
              f"{run.steps_run:,} steps run ({run.tree_steps:,} without merging), "
              f"{run.seconds:.1f} s")
        if args.tree:
            tree = explore(name, scenario, merge=False)
            print(f"  without merging: {tree.steps_run:,} steps run, {tree.seconds:.1f} s")
        if run.shortest is None:
            print("  no violation\n")
        else:
            print(f"  {len(run.violations)} violating steps; the shortest schedule "
                  f"({len(run.shortest.schedule)} steps):")
            print("\n".join("  " + line for line in
                            replay(name, scenario, run.shortest.schedule).lines()) + "\n")
        if (run.shortest is not None) != proto.broken:
            problems.append(name)
    if problems:
        print(f"FAILED: {', '.join(problems)}")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
