#!/usr/bin/env python3
"""Re-execute every notebook under notebooks/ in place, for maintainers (``make notebooks``).

Each notebook runs on a fresh ``python3`` kernel with its own folder as the
working directory (as in JupyterLab and nbval), so ``../data/...`` resolves.
Timing metadata is neither recorded nor kept, and printed chunks are joined
by nbconvert's own ``CoalesceStreamsPreprocessor`` (the joining nbval's
comparison agrees with), so execution counts run 1..N and a re-run changes
only what really changed. Prints seconds per notebook.

    python .ci/execute_notebooks.py                    every notebook
    python .ci/execute_notebooks.py notebooks/03_*.ipynb   only those named
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
import nbformat
from nbclient import NotebookClient
from nbconvert.preprocessors import CoalesceStreamsPreprocessor

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
TIMEOUT_SECONDS = 120


def execute(path: Path) -> float:
    """Run ``path`` top to bottom and write it back; return the seconds it took."""
    notebook = nbformat.read(path, as_version=4)
    for cell in notebook.cells:
        cell.metadata.pop("execution", None)  # timestamps left by an earlier run
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
    started = time.perf_counter()
    NotebookClient(notebook, timeout=TIMEOUT_SECONDS, kernel_name="python3",
                   record_timing=False,
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    seconds = time.perf_counter() - started
    notebook, _ = CoalesceStreamsPreprocessor().preprocess(notebook, {})
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)",
                                       "language": "python"}
    nbformat.write(notebook, path)
    return seconds


def main(argv: list[str]) -> int:
    paths = [Path(arg).resolve() for arg in argv] or sorted(NOTEBOOKS.rglob("*.ipynb"))
    paths = [p for p in paths if ".ipynb_checkpoints" not in p.parts]
    total = 0.0
    for path in paths:
        seconds = execute(path)
        total += seconds
        shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        print(f"{seconds:6.1f} s  {shown}", flush=True)
    print(f"{total:6.1f} s  total, {len(paths)} notebooks")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
