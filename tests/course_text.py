"""The course's words as the fact checks read them.

Every notebook (``notebooks/**/*.ipynb``, whatever is added later) and the
two documents a learner reads first (README.md, EXERCISES.md), cut into
passages that know where they stand: a markdown cell, a figure's text
alternative, a comment or a string in a code cell, a paragraph of a
document. A failure can then name the notebook, the cell and the sentence.
"""

from __future__ import annotations

import ast
import builtins
import io
import json
import re
import tokenize
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from conftest import ROOT

NOTEBOOKS = ROOT / "notebooks"
DOCUMENTS = (ROOT / "README.md", ROOT / "EXERCISES.md")


@dataclass(frozen=True)
class Passage:
    """A piece of the course's text: ``kind`` is ``markdown``, ``alt`` (a figure's text
    alternative), ``comment`` or ``string`` (in a code cell), or ``document``."""

    path: Path
    cell: int | None  # None in a document
    kind: str
    text: str

    @property
    def where(self) -> str:
        name = self.path.relative_to(ROOT).as_posix()
        if self.cell is None:
            return name
        return f"{name}, cell {self.cell} ({self.kind})"

    def quote(self, match: re.Match[str]) -> str:
        """The sentence around ``match`` (a table's whole row), shortened for a message;
        ``match`` may come from this passage's text or a copy with markup removed."""
        text = match.string
        line_start = text.rfind("\n", 0, match.start()) + 1
        line_end = text.find("\n", match.end()) % (len(text) + 1)
        if text[line_start:].lstrip().startswith("|"):  # a table row: quote all of it
            start, end = line_start, line_end
        else:
            start = max(text.rfind(stop, 0, match.start()) for stop in (". ", "\n", "? ", "! ")) + 1
            ends = [i for i in (text.find(stop, match.end()) for stop in (". ", "\n")) if i >= 0]
            end = min(ends, default=len(text))
        return " ".join(text[start:end].split())[:240]


def notebook_paths() -> list[Path]:
    return sorted(p for p in NOTEBOOKS.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)


def cells(path: Path) -> list[dict[str, Any]]:
    return list(json.loads(path.read_text(encoding="utf-8"))["cells"])


def source(cell: dict[str, Any]) -> str:
    text = cell["source"]
    return "".join(text) if isinstance(text, list) else str(text)


def printed(cell: dict[str, Any]) -> str:
    """The text a code cell printed (its stored stream outputs)."""
    return "".join("".join(o["text"]) if isinstance(o["text"], list) else o["text"]
                   for o in cell.get("outputs", []) if o.get("output_type") == "stream")


def passages(path: Path) -> Iterator[Passage]:
    """Every passage of a notebook, or of a document (one per paragraph)."""
    if path.suffix != ".ipynb":
        for paragraph in re.split(r"\n\s*\n", path.read_text(encoding="utf-8")):
            yield Passage(path, None, "document", paragraph)
        return
    for number, cell in enumerate(cells(path)):
        if cell["cell_type"] == "markdown":
            yield Passage(path, number, "markdown", source(cell))
        elif cell["cell_type"] == "code":
            if cell["metadata"].get("alt"):
                yield Passage(path, number, "alt", cell["metadata"]["alt"])
            for kind, text in code_prose(source(cell)):
                yield Passage(path, number, kind, text)


def every_passage() -> Iterator[Passage]:
    for path in [*notebook_paths(), *DOCUMENTS]:
        yield from passages(path)


def code_prose(code: str) -> list[tuple[str, str]]:
    """The comments and string literals of a code cell, as ``(kind, text)``."""
    found = []
    try:
        for token in tokenize.generate_tokens(io.StringIO(_without_magics(code)).readline):
            if token.type == tokenize.COMMENT:
                found.append(("comment", token.string.lstrip("# ")))
            elif token.type == tokenize.STRING:
                found.append(("string", token.string))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        found.append(("comment", code))  # unreadable as Python: read all of it as prose
    return found


def _without_magics(code: str) -> str:
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line
                     for line in code.splitlines())


def code_tree(path: Path) -> ast.Module:
    """Every code cell of a notebook, parsed as one module (magics blanked)."""
    body: list[ast.stmt] = []
    for cell in cells(path):
        if cell["cell_type"] == "code":
            body += ast.parse(_without_magics(source(cell))).body
    return ast.Module(body=body, type_ignores=[])


BUILTINS = frozenset(dir(builtins))
