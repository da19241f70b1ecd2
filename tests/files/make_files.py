"""Write tests/files/schema1-<commit>.sqlite3 again, each with the engine of its commit.

    python tests/files/make_files.py        (from the checkout's top folder)

Each file holds one state of every kind, written by that release's own code
on a model clock (``V1_STORY`` in ``queue_core/lab/lifetime/earlier.py``):
E0001 and E0003 done (E0003 after a retry: generations 1 and 2), E0002 dead
(a permanent failure), E0004 leased (claimed at 1007, its lease until 1037),
E0005 ready (enqueued at 1010), and a journal of every step. The tests open
these files, migrate copies of them and audit the result.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from queue_core.lab.lifetime.earlier import ENGINES, export_engine, write_v1_file

HERE = Path(__file__).resolve().parent


def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        for commit, what in ENGINES.items():
            engine = export_engine(commit, folder)
            target = HERE / f"schema1-{commit}.sqlite3"
            target.unlink(missing_ok=True)
            write_v1_file(engine, target)
            print(f"wrote {target.name} ({what}, {target.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
