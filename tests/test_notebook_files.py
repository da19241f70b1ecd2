"""The stored notebooks are the course's contract: checks nbval does not make.

nbval compares outputs cell by cell; these tests check what it cannot see:
that the stored copy came from one clean top-to-bottom run on the
``python3`` kernel, leaks nothing of the machine it ran on, and reads like
a chapter (goals first, a way to the exercises).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from conftest import ROOT

NOTEBOOKS = ROOT / "notebooks"
PATHS = sorted(p for p in NOTEBOOKS.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)
IDS = [str(p.relative_to(NOTEBOOKS)) for p in PATHS]
ABSOLUTE_PATH = re.compile(r"/work\b|/tmp/|/home\b|/Users/|[A-Z]:\\")


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


def code_cells(notebook: dict[str, Any]) -> list[dict[str, Any]]:
    return [cell for cell in notebook["cells"] if cell["cell_type"] == "code"]


def source(cell: dict[str, Any]) -> str:
    text = cell["source"]
    return "".join(text) if isinstance(text, list) else text


def output_texts(output: dict[str, Any]) -> list[str]:
    """Every piece of text an output holds (stream, data of any text type, traceback)."""
    parts: list[Any] = [output.get("text", ""), *output.get("traceback", [])]
    parts += [value for mime, value in output.get("data", {}).items()
              if not mime.startswith("image/")]
    return ["".join(p) if isinstance(p, list) else str(p) for p in parts]


def test_the_course_notebooks_00_to_06_are_stored() -> None:
    numbers = {p.name[:2] for p in PATHS}
    assert {f"{n:02d}" for n in range(7)} <= numbers


@pytest.mark.parametrize("path", PATHS, ids=IDS)
def test_execution_counts_run_one_to_n_in_order(path: Path) -> None:
    counts = [cell["execution_count"] for cell in code_cells(load(path))]
    assert counts == list(range(1, len(counts) + 1))


@pytest.mark.parametrize("path", PATHS, ids=IDS)
def test_kernel_is_python3(path: Path) -> None:
    assert load(path)["metadata"]["kernelspec"]["name"] == "python3"


@pytest.mark.parametrize("path", PATHS, ids=IDS)
def test_no_cell_keeps_timing_metadata(path: Path) -> None:
    leftovers = [n for n, cell in enumerate(load(path)["cells"]) if "execution" in cell["metadata"]]
    assert leftovers == []


@pytest.mark.parametrize("path", PATHS, ids=IDS)
def test_no_unrun_code_cell_has_outputs(path: Path) -> None:
    unrun = [source(c)[:40] for c in code_cells(load(path))
             if c["execution_count"] is None and c["outputs"]]
    assert unrun == []


@pytest.mark.parametrize("path", PATHS, ids=IDS)
def test_outputs_hold_no_absolute_paths(path: Path) -> None:
    found = [match.group(0) for cell in code_cells(load(path)) for output in cell["outputs"]
             for text in output_texts(output) for match in ABSOLUTE_PATH.finditer(text)]
    assert found == []


@pytest.mark.parametrize("path", PATHS, ids=IDS)
def test_no_output_goes_to_stderr(path: Path) -> None:
    stderr = [source(c)[:40] for c in code_cells(load(path)) for output in c["outputs"]
              if output["output_type"] == "stream" and output["name"] == "stderr"]
    assert stderr == []


@pytest.mark.parametrize("path", PATHS, ids=IDS)
def test_errors_appear_only_in_cells_tagged_raises_exception(path: Path) -> None:
    untagged = [source(c)[:40] for c in code_cells(load(path))
                if any(o["output_type"] == "error" for o in c["outputs"])
                and "raises-exception" not in c["metadata"].get("tags", [])]
    assert untagged == []


@pytest.mark.parametrize("path", PATHS, ids=IDS)
def test_first_cell_states_the_learning_goals(path: Path) -> None:
    first = load(path)["cells"][0]
    assert first["cell_type"] == "markdown"
    assert "learning goals" in source(first).lower()


@pytest.mark.parametrize("path", PATHS, ids=IDS)
def test_notebook_links_to_the_exercises(path: Path) -> None:
    markdown = "".join(source(c) for c in load(path)["cells"] if c["cell_type"] == "markdown")
    relative = Path(os.path.relpath(ROOT / "EXERCISES.md", path.parent)).as_posix()
    assert f"]({relative}" in markdown
