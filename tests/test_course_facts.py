"""The course cannot contradict its package.

Every notebook (all of ``notebooks/**/*.ipynb``, later ones included),
README.md and EXERCISES.md are read for what they say about the package,
and the package is asked whether it is so:

- no passage denies what ``course_facts.FACTS`` shows the package has;
- the summary card of notebook 00 has a row for every public call, and
  names every error code a call can raise and no code that does not exist;
- every list of error codes or crash points the prose presents as complete
  is complete, and names nothing the package lacks;
- a count in a figure's caption is the count its cell printed;
- every call a notebook suggests can be made where the notebook says.

A failure names the notebook (or document), the cell and the sentence.
"""

from __future__ import annotations

import inspect
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import queue_core
from conftest import ROOT
from course_facts import CODE_LISTS, FACTS, CodeList, Fact, denials_in, engine_codes, named_codes
from course_names import notebook_problems
from course_text import DOCUMENTS, cells, notebook_paths, passages, printed, source
from queue_core import Queue
from queue_core.crashpoints import POINTS, PROTOCOL_POINTS
from queue_core.lab.plots import card

DOCS = [*notebook_paths(), *DOCUMENTS]
DOC_IDS = [p.relative_to(ROOT).as_posix() for p in DOCS]
NOTEBOOK_IDS = [p.relative_to(ROOT).as_posix() for p in notebook_paths()]
CRASH_POINT = re.compile(r"\b(?:complete_and_claim|complete|claim|fail)\.(?:after|before|between)_"
                         r"[a-z_]*[a-z]")
NUMBER_WORDS = {w: n for n, w in enumerate("zero one two three four five six seven eight nine ten "
                                           "eleven twelve thirteen fourteen fifteen sixteen "
                                           "seventeen eighteen nineteen twenty".split())}


# -- what the package has, nobody denies --------------------------------------------------

@pytest.mark.parametrize("fact", FACTS, ids=[f.says[:50] for f in FACTS])
def test_every_fact_the_course_relies_on_holds_for_the_package(fact: Fact) -> None:
    fact.check()


@pytest.mark.parametrize("path", DOCS, ids=DOC_IDS)
def test_no_passage_denies_what_the_package_has(path: Path) -> None:
    denied = {f'{passage.where}: "{passage.quote(match)}" -- but: {fact.says}': None
              for passage in passages(path) for fact in FACTS
              for match in denials_in(passage.text, fact)}
    assert list(denied) == [], "\n".join(["the course says the package lacks what it has:",
                                           *denied])


# -- the summary card ---------------------------------------------------------------------

def test_the_summary_card_has_a_row_for_every_public_call_and_worker_helper() -> None:
    public = {name for name, value in inspect.getmembers(Queue) if not name.startswith("_")
              and (inspect.isfunction(value) or isinstance(inspect.getattr_static(Queue, name),
                                                           property))}
    helpers = {name for name in queue_core.__all__
               if inspect.getmodule(getattr(queue_core, name)) is queue_core.worker}
    on_card = {name for part in card.parts() for name in part.calls}
    assert on_card == public | helpers | {"__init__"}
    assert {"complete_and_claim", "release", "extend", "status", "metrics", "message",
            "messages", "effects", "transitions", "snapshot", "audit", "session"} <= on_card
    assert card.problems() == []
    assert "max_messages=None" in card.call_text("drain")


def test_the_summary_card_refuses_to_draw_while_a_call_has_no_row(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(card.ROWS, "release")
    with pytest.raises(card.CardOutOfDate, match="Queue.release has no row"):
        card.summary_card()


def test_the_summary_card_names_every_code_a_call_can_raise_and_no_other() -> None:
    codes = engine_codes()
    named = card.summary_card().codes()
    assert {"on the card, not in the package": sorted(named - codes.all),
            "raised by a call, not on the card": sorted(codes.api - named)} == \
        {"on the card, not in the package": [], "raised by a call, not on the card": []}


@pytest.mark.parametrize("name", sorted(card.ROWS))
def test_each_card_row_names_the_codes_its_calls_documentation_names(name: str) -> None:
    function = getattr(queue_core, name) if name in card.worker_helpers() else \
        getattr(Queue, name)
    doc = inspect.getdoc(function.fget if isinstance(function, property) else function) or ""
    words = re.findall(r"``(\w+)``", doc)
    fixed = fixed_codes()
    documented = {w for w in words if w in engine_codes().all} | {fixed[w] for w in words
                                                                   if w in fixed}
    row = {code for _, codes in card.ROWS[name].errors for code in codes}
    assert sorted(documented - row) == [], f"the card's row of {name} leaves these out"


def fixed_codes() -> dict[str, str]:
    """Error classes whose code never varies (``UnknownEvent``: ``unknown_event``)."""
    def takes_code(cls: type) -> bool:
        init = vars(cls).get("__init__")
        return init is not None and "code" in inspect.signature(init).parameters
    return {cls.__name__: cls.code for cls in vars(queue_core.errors).values()
            if inspect.isclass(cls) and "code" in vars(cls) and not takes_code(cls)}


def test_the_rejection_codes_table_lists_every_code_a_batch_can_be_refused_with() -> None:
    assert set(card.rejection_codes()) == engine_codes().ingest | {"batch_conflict"}


# -- lists that claim to be complete ------------------------------------------------------

@pytest.mark.parametrize("listing", CODE_LISTS, ids=[c.begins for c in CODE_LISTS])
def test_a_list_of_error_codes_names_every_code_and_only_real_ones(listing: CodeList) -> None:
    paragraphs = [p for p in passages(listing.document) if p.text.startswith(listing.begins)]
    assert len(paragraphs) == 1, f"{listing.document.name}: no paragraph begins {listing.begins!r}"
    codes = engine_codes()
    named = named_codes(paragraphs[0].text)
    assert {"missing": sorted(listing.expected(codes) - named),
            "not a code of the package": sorted(named - codes.all)} == \
        {"missing": [], "not a code of the package": []}, paragraphs[0].where


@pytest.mark.parametrize("path", DOCS, ids=DOC_IDS)
def test_crash_points_named_exist_and_a_list_of_them_is_complete(path: Path) -> None:
    found = []
    for passage in passages(path):
        named = {m.group(0): m for m in CRASH_POINT.finditer(passage.text)}
        found += [f'{passage.where}: `{name}` is no crash point of the package, in '
                  f'"{passage.quote(match)}"' for name, match in named.items()
                  if name not in POINTS]
        if len(named) >= 5:  # a list of them, which must hold every point of the protocol
            missing = [point for point in PROTOCOL_POINTS if point not in named]
            found += [f"{passage.where}: a list of crash points without {', '.join(missing)}"] \
                if missing else []
        for match in re.finditer(r"\ball (\w+) (?:of (?:its|the) )?crash points", passage.text):
            count = NUMBER_WORDS.get(match.group(1).lower(), match.group(1))
            if str(count) not in (str(len(PROTOCOL_POINTS)), str(len(POINTS))):
                found.append(f'{passage.where}: "{passage.quote(match)}": the protocol has '
                             f"{len(PROTOCOL_POINTS)} crash points")
    assert found == [], "\n".join(found)


# -- figures and the calls a notebook suggests --------------------------------------------

COUNT = re.compile(r"\b([A-Za-z][\w-]*) (\d+) times\b|\b([A-Za-z][\w-]*) (twice|thrice)\b")


@pytest.mark.parametrize("path", notebook_paths(), ids=NOTEBOOK_IDS)
def test_a_count_in_a_caption_is_the_count_its_figure_printed(path: Path) -> None:
    wrong = []
    notebook = cells(path)
    for number, cell in enumerate(notebook[1:], start=1):
        caption, figure = source(cell), notebook[number - 1]
        if cell["cell_type"] != "markdown" or not caption.startswith("*Figure.*") \
                or figure["cell_type"] != "code":
            continue
        said = printed(figure)
        for match in COUNT.finditer(caption):
            word, count = (match.group(1), match.group(2)) if match.group(1) else \
                (match.group(3), str({"twice": 2, "thrice": 3}[match.group(4)]))
            shown = re.findall(rf"\b{re.escape(word)}\W{{1,3}}(\d+)\b", said)
            if shown != [count]:
                where = f"{path.relative_to(ROOT).as_posix()}, cell {number}"
                wrong.append(f'{where}: the caption says "{match.group(0)}", the figure\'s cell '
                             "printed " + (f"{word} {', '.join(shown)}" if shown
                                           else f"no count of {word!r}"))
    assert wrong == [], "\n".join(wrong)


@pytest.mark.parametrize("path", notebook_paths(), ids=NOTEBOOK_IDS)
def test_every_call_a_notebook_suggests_is_importable_where_it_says(path: Path) -> None:
    found = notebook_problems(path)
    assert found == [], "\n".join(found)


def test_the_exercise_order_the_readme_and_09_give_is_the_chapters_each_exercise_links() -> None:
    nine = ROOT / "notebooks" / "09_exercises.ipynb"
    linked = {int(n): int(chapter) for cell in cells(nine) for n, chapter in re.findall(
        r"^## Exercise (\d+):.*?· chapter \[(\d\d) ", source(cell), re.S | re.M)}
    assert linked == {1: 1, 2: 1, 3: 4, 4: 3, 5: 6, 6: 2, 7: 12, 8: 13, 9: 14, 10: 15}
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    assert ("comes before the chapters that exercises 7, 8, 9 and 10 need (12, 13, 14 and 15). "
            "Do exercises 1-6 (chapters 01-06) when you reach 09") in readme
    said = " ".join(source(cells(nine)[0]).split())
    assert ("Exercises 1-6 need only chapters 01-06: do them now. Exercises 7, 8, 9 and 10 "
            "need chapters 12, 13, 14 and 15, which come after this notebook") in said


def test_the_command_line_quick_start_prints_what_its_comments_say(tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = readme.split("### Quick start", 1)[1].split("| to | run |", 1)[0]
    lines = [line.strip() for line in block.splitlines() if line.startswith("    .venv/bin/")]
    assert len(lines) == 6
    said = []
    for line in lines:
        command, _, comment = line.partition("#")
        argv = shlex.split(command)[1:]
        argv = [str(ROOT / a) if a.startswith("data/") else a for a in argv]
        done = subprocess.run([sys.executable, "-m", "queue_core", *argv], cwd=tmp_path,
                              capture_output=True, text=True, check=True)
        said.append((comment.strip(), done.stdout))
    assert said[0] == ("inserted 4, duplicates 1", "inserted 4, duplicates 1\n")
    assert said[1][1].count(" done (generation 1)") == 3 and "E0004 dead" in said[1][1]
    assert "total:   17000" in said[2][1] and "E0004 is ready again" in said[3][1]
    assert "E0004 done (generation 2): toy +3000" in said[4][1]
    assert said[5] == ("total 20000", said[5][1]) and "total:   20000" in said[5][1]


# -- figures quoted from make scale are README's -------------------------------------------

SCALE_FIGURES = re.compile(r"[\d,.]+(?:, [\d,.]+)* and [\d,.]+ messages/s with [\d, ]+ and \d+ "
                           r"workers \([^)]*\)")


def test_every_make_scale_figure_a_chapter_quotes_is_the_one_readme_gives() -> None:
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    quoted = [(p.where, m.group()) for path in notebook_paths() for p in passages(path)
              if "make scale" in p.text
              for m in SCALE_FIGURES.finditer(" ".join(p.text.split()))]

    assert quoted, "no chapter quotes make scale's figures: update this test's pattern"
    assert [(where, figures) for where, figures in quoted if figures not in readme] == []
