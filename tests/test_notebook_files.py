"""The stored notebooks are the course's contract: checks nbval does not make.

nbval compares outputs cell by cell; these tests check what it cannot see:
that the stored copy came from one clean top-to-bottom run on the
``python3`` kernel, leaks nothing of the machine it ran on, and reads like
a chapter (goals first, a way to the exercises).
"""

from __future__ import annotations

import html as html_module
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


# -- references a learner can follow --------------------------------------------------------

# Every chapter is held to these habits.
REVIEWED = PATHS
REVIEWED_IDS = [str(p.relative_to(NOTEBOOKS)) for p in REVIEWED]
CAPTIONED = [p for p in REVIEWED if p.name[:2] != "09"]  # 09 draws no figure
LINK = re.compile(r"\]\(([^)\s]+)\)")
DOCS = [ROOT / "README.md", ROOT / "EXERCISES.md"]


def markdown_of(path: Path) -> str:
    if path.suffix == ".ipynb":
        return "\n".join(source(c) for c in load(path)["cells"] if c["cell_type"] == "markdown")
    return path.read_text(encoding="utf-8")


def explicit_anchors(path: Path) -> set[str]:
    return set(re.findall(r'<a id="([A-Za-z0-9_-]+)"></a>', markdown_of(path)))


def cell_ids(path: Path) -> set[str]:
    return {cell.get("id") for cell in load(path)["cells"]}


# Where a fragment lands, as JupyterLab 4 and GitHub resolve it (make labcheck
# clicks every link in a real JupyterLab and measures where it lands):
# - a Markdown file opened from a link is shown in Markdown Preview, which
#   scrolls to an element of that id: an explicit ``<a id="...">``, whose id
#   GitHub keeps too (JupyterLab's own heading ids, "Exercise-4:-Reject-...",
#   keep case and punctuation; GitHub's, "exercise-4-reject-...", do not);
# - a notebook is linked by ``#cell-id=<id>`` (nbformat's fragment syntax,
#   which nbconvert's HTML export also gives every cell): JupyterLab finds the
#   cell in the notebook's model, where a heading or ``<a id>`` fragment is
#   looked for only among cells already drawn, so a notebook opened by the
#   link is shown from its top.
def fragment_problem(resolved: Path, fragment: str) -> str | None:
    if resolved.suffix == ".md" and fragment not in explicit_anchors(resolved):
        return "no <a id> of that name in the file"
    if resolved.suffix == ".ipynb":
        if not fragment.startswith("cell-id="):
            return "a notebook is linked by #cell-id=<id>"
        if fragment.removeprefix("cell-id=") not in cell_ids(resolved):
            return "no cell of that id in the notebook"
    return None


def broken_links(path: Path, markdown: str) -> list[str]:
    """Each relative link in ``markdown`` (written in ``path``) that leads nowhere, with why."""
    broken = []
    for target in LINK.findall(markdown):
        if re.match(r"[a-z]+:", target):
            continue  # a web address
        file, _, fragment = target.partition("#")
        resolved = (path.parent / file) if file else path
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif fragment and (problem := fragment_problem(resolved, fragment)):
            broken.append(f"{target}: {problem}")
    return broken


@pytest.mark.parametrize("path", [*PATHS, *DOCS], ids=[*IDS, *(p.name for p in DOCS)])
def test_every_relative_link_resolves_to_a_file_and_a_fragment_that_lands(path: Path) -> None:
    assert broken_links(path, markdown_of(path)) == []


@pytest.mark.parametrize("target, problem", [
    ("00_overview.ipynb#cell-id=summary-card", None),
    ("../EXERCISES.md#exercise-4", None),
    ("../EXERCISES.md", None),
    ("00_overview.ipynb#summary-card", "a notebook is linked by #cell-id=<id>"),
    ("00_overview.ipynb#Summary-card", "a notebook is linked by #cell-id=<id>"),
    ("00_overview.ipynb#cell-id=no-such-cell", "no cell of that id in the notebook"),
    ("../EXERCISES.md#exercise-99", "no <a id> of that name in the file"),
    ("../EXERCISES.md#Exercise-4:-Reject-an-old-generation,-also-after-a-redrive",
     "no <a id> of that name in the file"),
    ("99_missing.ipynb", "no such file"),
], ids=["cell-id", "md-anchor", "md-file", "notebook-anchor", "notebook-heading",
        "unknown-cell", "unknown-anchor", "jupyterlab-heading-id", "missing-file"])
def test_the_link_check_refuses_a_fragment_that_would_not_land(target: str,
                                                               problem: str | None) -> None:
    written_in = NOTEBOOKS / "01_duplicate_delivery.ipynb"
    expected = [] if problem is None else [f"{target}: {problem}"]
    assert broken_links(written_in, f"see [there]({target}).") == expected


def test_the_readme_links_the_summary_card_by_its_cell_id() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    cells = load(NOTEBOOKS / "00_overview.ipynb")["cells"]
    card = [cell for cell in cells if cell.get("id") == "summary-card"]

    assert "[summary card](notebooks/00_overview.ipynb#cell-id=summary-card)" in readme
    assert len(card) == 1 and source(card[0]).startswith("## Summary card\n")


@pytest.mark.parametrize("path", [*REVIEWED, ROOT / "EXERCISES.md"],
                         ids=[*REVIEWED_IDS, "EXERCISES.md"])
def test_no_text_refers_to_a_document_the_learner_does_not_have(path: Path) -> None:
    text = markdown_of(path)
    assert re.findall(r"\bSPEC\b|\bspec(?:ification)? (?:section|step)", text) == []
    assert re.findall(r"(?i)nbval|NBVAL_", text) == []  # test-tool names, not for learners


@pytest.mark.parametrize("path", CAPTIONED, ids=[str(p.relative_to(NOTEBOOKS)) for p in CAPTIONED])
def test_every_figure_has_a_text_alternative_and_a_caption_after_it(path: Path) -> None:
    cells = load(path)["cells"]
    missing = []
    for n, cell in enumerate(cells):
        if cell["cell_type"] == "code" and any("image/png" in o.get("data", {})
                                               for o in cell["outputs"]):
            alt = cell["metadata"].get("alt", "")  # what nbconvert's classic template uses
            after = source(cells[n + 1]) if n + 1 < len(cells) else ""
            if len(alt) < 40 or not after.startswith(f"*Figure.* {alt}"):
                missing.append(source(cell)[:40])
    assert missing == []


@pytest.mark.parametrize("path", CAPTIONED, ids=[str(p.relative_to(NOTEBOOKS)) for p in CAPTIONED])
def test_the_classic_html_export_gives_every_figure_its_alt_text(path: Path) -> None:
    # JupyterLab shows no text alternative (the caption after the figure is what its
    # readers get); nbconvert's classic template reads the cell's "alt" metadata.
    from nbconvert import HTMLExporter

    cells = load(path)["cells"]
    wanted = [cell["metadata"]["alt"] for cell in cells if cell["cell_type"] == "code"
              for o in cell["outputs"] if "image/png" in o.get("data", {})]
    html, _ = HTMLExporter(template_name="classic").from_filename(str(path))
    images = re.findall(r"<img\b[^>]*>", html)
    alts = [html_module.unescape(m.group(1)) if (m := re.search(r'alt="([^"]*)"', img)) else None
            for img in images]
    assert alts == wanted


@pytest.mark.parametrize("path", REVIEWED, ids=REVIEWED_IDS)
def test_a_folded_answer_is_followed_by_space_before_the_next_question(path: Path) -> None:
    text = markdown_of(path)
    assert re.findall(r"</details>\n\n?(?:\*\*|<details>)", text) == []


# -- every chapter is listed where a learner looks for it ----------------------------------

CHAPTERS = sorted(p for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
LAB_PARTS = sorted(init.parent.name for init in (ROOT / "queue_core" / "lab").glob("*/__init__.py"))


def readme_table(heading: str) -> list[str]:
    """The first cell of each row of the README table that follows ``heading``."""
    text = (ROOT / "README.md").read_text(encoding="utf-8").split(heading, 1)[1]
    rows = text.split("\n|---", 1)[1].split("\n\n", 1)[0].splitlines()[1:]  # after |---|
    return [row.split("|")[1].strip().strip("`") for row in rows if row.startswith("|")]


def test_the_chapters_are_numbered_from_00_without_a_gap_through_15() -> None:
    numbers = [int(p.name[:2]) for p in CHAPTERS]
    assert numbers == list(range(len(numbers))) and numbers[-1] >= 15
    assert (NOTEBOOKS / "15_the_urgent_message_that_waits.ipynb") in CHAPTERS


def test_the_readme_course_table_has_one_row_per_chapter_in_order() -> None:
    assert readme_table("## The course\n") == [p.stem for p in CHAPTERS]


def test_the_readme_lab_table_has_one_row_per_part_of_the_lab() -> None:
    assert sorted(row.rstrip("/") for row in readme_table("### The lab at a glance\n")) == \
        LAB_PARTS


@pytest.mark.parametrize("chapter", CHAPTERS[1:], ids=[p.stem for p in CHAPTERS[1:]])
def test_notebook_00s_course_map_links_every_chapter(chapter: Path) -> None:
    course_map = [source(c) for c in load(NOTEBOOKS / "00_overview.ipynb")["cells"]
                  if source(c).startswith("## Course map")]
    assert len(course_map) == 1 and f"]({chapter.name})" in course_map[0]


MOST_PACKAGE_NAMES = 15  # a chapter imports what it uses from a few places, in a few names


def package_names(notebook: dict[str, Any]) -> list[str]:
    """The names a notebook's code imports from ``queue_core`` (modules included)."""
    import ast
    names: list[str] = []
    for cell in code_cells(notebook):
        try:
            tree = ast.parse(source(cell))
        except SyntaxError:  # an exercise cell left for the learner to complete
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("queue_core"):
                names += [alias.asname or alias.name for alias in node.names]
            elif isinstance(node, ast.Import):
                names += [alias.asname or alias.name for alias in node.names
                          if alias.name.startswith("queue_core")]
    return names


@pytest.mark.parametrize("path", PATHS, ids=IDS)
def test_a_notebook_imports_at_most_fifteen_names_of_the_package(path: Path) -> None:
    names = package_names(load(path))
    assert len(names) <= MOST_PACKAGE_NAMES, sorted(names)


def test_the_count_sees_every_kind_of_import() -> None:
    cell = {"cell_type": "code", "source": "from queue_core import Queue, ModelClock\n"
            "from queue_core.lab import story as s\nimport queue_core.audit\n"}
    assert package_names({"cells": [cell]}) == ["Queue", "ModelClock", "s", "queue_core.audit"]
