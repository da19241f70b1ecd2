"""Notebook 09, its solutions and EXERCISES.md agree with what the checks tell a
learner to run: the names the verdicts use are the names the notebook defines,
the exercises come in order with the closing notes after the last one, and
only the last cell removes the work folder, saying how to go back.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from conftest import ROOT
from queue_core.lab import exercises

NOTEBOOKS = [ROOT / "notebooks" / "09_exercises.ipynb",
             ROOT / "notebooks" / "solutions" / "09_exercises_solutions.ipynb"]
IDS = ["09", "solutions"]
EXERCISES_MD = (ROOT / "EXERCISES.md").read_text(encoding="utf-8")
NUMBERS = sorted(int(name[6:]) for name in dir(exercises) if re.fullmatch(r"check_\d+", name))


def cells(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def text(cell: dict) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def code(path: Path) -> str:
    return "\n".join(text(c) for c in cells(path) if c["cell_type"] == "code")


def headings(path: Path) -> list[str]:
    return [line for c in cells(path) if c["cell_type"] == "markdown"
            for line in text(c).splitlines() if line.startswith("## ")]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_every_exercise_starts_in_the_one_workdir_its_verdicts_name(path: Path) -> None:
    """The verdicts say `qN = exercises.start_N(workdir)`: run as written, it must work."""
    source = code(path)
    assert source.count("workdir = Path(scratch.name)") == 1
    for number in NUMBERS:
        assert f"q{number} = exercises.start_{number}(workdir)" in source, number
    assert re.findall(r"start_\d\((?!workdir\))", source) == []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_only_the_last_cell_removes_the_work_folder_and_it_says_how_to_go_back(path: Path) -> None:
    """Run All leaves nothing behind, whatever ends the kernel; a learner who goes
    back afterwards is told to run the first code cell (and so is each start)."""
    assert re.findall(r"\w+\.cleanup\(\)", code(path)) == ["scratch.cleanup()"]
    last = cells(path)[-1]
    assert last["cell_type"] == "code" and "scratch.cleanup()" in text(last)
    assert "run the first code cell again" in text(last)
    assert "the last cell removes it" in text(cells(path)[1])
    assert "run this cell again" in text(cells(path)[1])


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_the_exercises_come_in_order_and_the_closing_notes_after_the_last(path: Path) -> None:
    found = headings(path)
    numbered = [h for h in found if h.startswith("## Exercise ")]
    assert [int(h.split()[2].rstrip(":")) for h in numbered] == NUMBERS
    assert found[:len(NUMBERS)] == numbered  # nothing between two exercises
    assert found[len(NUMBERS):] in (["## Review questions"], ["## What the solutions show"])


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_the_learning_goals_name_one_goal_per_exercise(path: Path) -> None:
    goals = text(cells(path)[0]).split("**Learning goals.**", 1)[1].split("\n\n")[1]
    assert len(re.findall(r"^- ", goals, re.MULTILINE)) == len(NUMBERS)
    assert "inbox" in goals


def test_exercises_md_keeps_going_further_after_the_last_exercise() -> None:
    found = [line for line in EXERCISES_MD.splitlines() if line.startswith("## ")]
    numbered = [h for h in found if h.startswith("## Exercise ")]
    assert found == [*numbered, "## Going further: batches"]
    assert [int(h.split()[2].rstrip(":")) for h in numbered] == NUMBERS


def test_exercise_3s_handler_has_one_name_in_the_notebook_the_text_and_the_verdicts() -> None:
    notebook = code(NOTEBOOKS[0])
    assert "newer_handler = None" in notebook and "newer_handler" in code(NOTEBOOKS[1])
    section = EXERCISES_MD.split("## Exercise 3:", 1)[1].split("## Exercise 4:", 1)[0]
    assert "drain(q3, newer_handler)" in section and "drain(q3, newer)" not in section


def test_exercise_6_quotes_the_opening_problem_in_the_readmes_words() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8").replace("*", "")
    [quoted] = re.findall(r'course\'s opening\nproblem \("([^"]+)"\)', EXERCISES_MD)
    assert " ".join(quoted.split()).lower() in " ".join(readme.split()).lower()
