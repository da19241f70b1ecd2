#!/usr/bin/env python3
"""The course read in a real JupyterLab, in headless Chromium (``make labcheck``).

What a learner does after ``make course``, done by a browser and measured:

1. README.md and EXERCISES.md opened in Markdown Preview (right-click, Open
   With), first beside 00_overview as ``make course`` opens it, then README
   again with nothing else open; every link in them clicked.
2. Every notebook under notebooks/ (found by glob, so a new one is included):
   opened, outputs cleared, Run All on a fresh kernel, waited for until the
   kernel is idle and no cell runs; the execution counts must be 1..N, no
   output may be an error or go to stderr, and every figure must be drawn
   (as many images as the stored notebook holds, each decoded by the
   browser). Then every link of its Markdown cells clicked.
3. Every explicit anchor (``<a id>``) that no link led to, followed as
   JupyterLab's link handler follows one.

A click on a link passes when JupyterLab shows the linked document and the
linked place in it stays within the visible part of the document. The check
talks to 127.0.0.1 only (Chromium may resolve no other name, and any request
elsewhere is refused and reported), never saves a document, and stops every
process it started; it fails if one was left running or if a course file changed.

    python .ci/lab_check.py                          the whole course
    python .ci/lab_check.py notebooks/03_*.ipynb     the two documents and these notebooks

Needs Chromium (Debian: ``apt-get install chromium``; another binary with
``CHROMIUM=/path``) and Playwright (``pip install -e '.[browser]'``), which
drives it and never downloads a browser of its own.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

import lab_server

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
DOCUMENTS = ("README.md", "EXERCISES.md")
FIRST = "notebooks/00_overview.ipynb"  # what make course opens
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMIUM_FLAGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
]
# Written by make setup: the notebook windowing make course's JupyterLab uses.
LAB_DEFAULTS = Path(sys.prefix) / "share/jupyter/lab/settings/overrides.d/queue-course.json"
RUN_SECONDS = 600
LAND_SECONDS = 15
STEADY_POLLS = 4  # a target counts as landed once it stays in view this many polls running
LINK = re.compile(r"\]\(([^)\s]+)\)")  # as tests/test_notebook_files.py reads links
ANCHOR = re.compile(r'<a id="([A-Za-z0-9_-]+)"></a>')


@dataclass
class Report:
    failures: list[str] = field(default_factory=list)
    notebooks: list[str] = field(default_factory=list)
    cells: int = 0
    code_cells: int = 0
    figures: int = 0
    # (where the link is, its target as written, what JupyterLab opened, landed or missed)
    links: list[tuple[str, str, str, str]] = field(default_factory=list)
    web_links: int = 0
    anchors: list[tuple[str, str]] = field(default_factory=list)
    outside: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)

    def fail(self, text: str) -> None:
        self.failures.append(text)
        print(f"FAIL {text}", flush=True)


def course_notebooks() -> list[Path]:
    return sorted(p for p in NOTEBOOKS.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)


def course_files() -> dict[str, str]:
    paths = [ROOT / name for name in DOCUMENTS] + course_notebooks()
    return {str(p.relative_to(ROOT)): hashlib.sha256(p.read_bytes()).hexdigest() for p in paths}


def local_link_count(markdown: str) -> int:
    return sum(1 for target in LINK.findall(markdown) if not re.match(r"[a-z]+:", target))


def web_link_count(markdown: str) -> int:
    return sum(1 for target in LINK.findall(markdown) if re.match(r"[a-z]+:", target))


def js(page, function: str, *args):
    """Call ``labcheck.<function>`` in the page with ``args``; return its (awaited) result."""
    return page.evaluate(f"(args) => window.labcheck.{function}(...args)", list(args))


def poll(page, function: str, args: list, done, seconds: float, interval_ms: int = 200):
    """Call ``function`` until ``done(result)``; return (True, result) or (False, last)."""
    deadline = time.monotonic() + seconds
    result = None
    while time.monotonic() < deadline:
        result = js(page, function, *args)
        if done(result):
            return True, result
        page.wait_for_timeout(interval_ms)
    return False, result


# -- links --------------------------------------------------------------------------------

def wait_landing(page, path: str, fragment: str) -> tuple[bool, dict]:
    """Whether ``path`` is shown with ``fragment``'s target in view, and stays so."""
    deadline, streak, where = time.monotonic() + LAND_SECONDS, 0, {}
    steady = STEADY_POLLS if fragment else 1  # without a fragment: the document is shown
    while time.monotonic() < deadline:
        where = js(page, "landing", path, fragment)
        streak = streak + 1 if where.get("inView") else 0
        if streak >= steady:
            return True, where
        page.wait_for_timeout(150)
    return False, where


def wait_kernels(lab, at_most: int, report: Report, why: str) -> None:
    deadline = time.monotonic() + 30
    while len(lab.kernels()) > at_most:
        if time.monotonic() > deadline:
            report.fail(f"{why}: {len(lab.kernels())} kernels still running, expected {at_most}")
            return
        time.sleep(0.2)


def click_link(page, lab, source: str, cell: int | None, n: int, report: Report) -> None:
    link = js(page, "links", source, cell, n)
    target = link["local"]["path"] or source
    fragment = link["local"]["fragment"]
    shown = (link["local"]["path"] or "") + fragment  # as written, less JupyterLab's rewriting
    was_open = target in js(page, "openPaths")
    kernels = len(lab.kernels())
    page.click('[data-labcheck-link="next"]', timeout=15000)
    landed, where = wait_landing(page, target, fragment)
    kind = where.get("kind") or where.get("current", {}).get("kind", "?")
    place = source + (f" cell {cell}" if cell is not None else "")
    report.links.append((place, shown, kind, "landed" if landed else "missed"))
    if not landed:
        at = f" at {where['top']} px of {where['height']}" if "top" in where else ""
        report.fail(f"{place}: link to {shown} did not land (open: {where.get('open')}, "
                    f"target found: {where.get('found')}{at}, showing "
                    f"{where.get('current', {}).get('path', target)})")
    if not was_open and target != source:
        js(page, "close", target)
        wait_kernels(lab, kernels, report, f"after closing {target}")
    js(page, "activate", source)


def click_links(page, lab, source: str, cell: int | None, expected: int, report: Report) -> None:
    listed = js(page, "links", source, cell, None)
    local = [n for n, link in enumerate(listed) if link["local"] is not None]
    where = f"{source}" + (f" cell {cell}" if cell is not None else "")
    if len(local) != expected:
        report.fail(f"{where}: {expected} local links in the source, {len(local)} rendered")
    for n in local:
        click_link(page, lab, source, cell, n, report)


def check_document(page, lab, name: str, report: Report) -> None:
    js(page, "open", name, "Markdown Preview")
    poll(page, "links", [name, None, None], lambda links: len(links) > 0, 15)  # rendered
    text = (ROOT / name).read_text(encoding="utf-8")
    click_links(page, lab, name, None, local_link_count(text), report)
    js(page, "close", name)


# -- notebooks ----------------------------------------------------------------------------

def run_all(page, path: str, report: Report) -> list[int] | None:
    """Run All on a fresh kernel; return the execution counts once it is idle, or None."""
    count = js(page, "startRun", path)
    finished, state = poll(page, "runState", [path],
                           lambda s: (s.get("done") and s["status"] == "idle" and s["running"] == 0)
                           or s["status"] == "dead", RUN_SECONDS, interval_ms=250)
    if not finished or state["status"] == "dead":
        report.fail(f"{path}: Run All did not finish on a live kernel within {RUN_SECONDS} s "
                    f"(kernel {state['status']}, {state['running']} cells running)")
        return None
    if state["counts"] != list(range(1, count + 1)):
        report.fail(f"{path}: execution counts {state['counts']}, expected 1..{count}")
    return state["counts"]


def check_figures(page, path: str, figures: list[int], stored: int, report: Report) -> None:
    if len(figures) != stored:
        report.fail(f"{path}: {len(figures)} figures in the run, {stored} in the stored notebook")
    for index in sorted(set(figures)):
        want = figures.count(index)
        drawn, images = poll(page, "images", [path, index],
                             lambda imgs: len(imgs) == want
                             and all(i["complete"] and i["width"] > 0 for i in imgs), 20)
        if not drawn:
            report.fail(f"{path} cell {index}: {want} figures expected, drawn: {images}")
        else:
            report.figures += want


def check_notebook(page, lab, path: str, report: Report) -> None:
    started = time.monotonic()
    stored = nbformat.read(ROOT / path, as_version=4)
    stored_figures = sum("image/png" in out.get("data", {}) for cell in stored.cells
                         if cell.cell_type == "code" for out in cell.outputs)
    js(page, "open", path, "Notebook")
    counts = run_all(page, path, report)
    found = js(page, "outputs", path)
    for error in found["errors"]:
        report.fail(f"{path} cell {error['index']}: error output {error['text']}")
    for stream in found["stderr"]:
        report.fail(f"{path} cell {stream['index']}: stderr {stream['text']!r}")
    check_figures(page, path, found["figures"], stored_figures, report)
    seconds = time.monotonic() - started
    links_before = len(report.links)
    for cell in js(page, "markdownCells", path):
        report.web_links += web_link_count(cell["source"])
        expected = local_link_count(cell["source"])
        if expected:
            click_links(page, lab, path, cell["index"], expected, report)
    report.notebooks.append(path)
    report.cells += len(stored.cells)
    report.code_cells += len(counts or [])
    print(f"{seconds:6.1f} s  {path}: {len(stored.cells)} cells, {len(counts or [])} run, "
          f"{len(found['errors'])} errors, {len(found['figures'])} figures, "
          f"{len(report.links) - links_before} links clicked", flush=True)
    js(page, "close", path)
    wait_kernels(lab, 0, report, f"after closing {path}")


# -- anchors ------------------------------------------------------------------------------

def explicit_anchors() -> list[tuple[str, str]]:
    found = [(name, anchor) for name in DOCUMENTS
             for anchor in ANCHOR.findall((ROOT / name).read_text(encoding="utf-8"))]
    for path in course_notebooks():
        notebook = nbformat.read(path, as_version=4)
        text = "\n".join(c.source for c in notebook.cells if c.cell_type == "markdown")
        found += [(str(path.relative_to(ROOT)), anchor) for anchor in ANCHOR.findall(text)]
    return found


def check_anchors(page, lab, report: Report) -> None:
    """Every explicit anchor, and every cell a link names by its id, must have landed."""
    for cell_target in sorted({href for _, href, _, result in report.links
                               if "#cell-id=" in href and result == "landed"}):
        report.anchors.append((cell_target, "landed from a link"))
    for path, anchor in explicit_anchors():
        if any(href.endswith(f"#{anchor}") and result == "landed"
               for _, href, _, result in report.links):
            report.anchors.append((f"{path}#{anchor}", "landed from a link"))
            continue
        js(page, "follow", path, f"#{anchor}")
        landed, where = wait_landing(page, path, f"#{anchor}")
        report.anchors.append((f"{path}#{anchor}", "landed, no link to it" if landed else "missed"))
        if not landed:
            report.fail(f"anchor {path}#{anchor} did not land: {where}")
        js(page, "close", path)
        wait_kernels(lab, 0, report, f"after closing {path}")


# -- the run ------------------------------------------------------------------------------

def open_course(page, lab) -> None:
    """The browser's first page: JupyterLab with 00_overview open, as make course has it."""
    page.goto(f"{lab.url}/lab/tree/{FIRST}?token={lab.token}")
    page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell", timeout=60000)
    page.evaluate("() => window.jupyterapp.restored")
    page.evaluate((Path(__file__).parent / "lab_check.js").read_text(encoding="utf-8"))
    opened, _ = poll(page, "openPaths", [], lambda paths: FIRST in paths, 60)
    if not opened:
        raise RuntimeError(f"JupyterLab did not open {FIRST}")
    js(page, "kernelReady", FIRST)


def browse(lab, folder: Path, notebooks: list[str], report: Report) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(folder / "chromium"), executable_path=CHROMIUM, headless=True,
            args=CHROMIUM_FLAGS, viewport={"width": 1280, "height": 900})
        try:
            def guard(route) -> None:
                if route.request.url.startswith(lab.url + "/"):
                    route.continue_()
                else:
                    report.outside.append(route.request.url)
                    route.abort()

            context.route("**/*", guard)
            page = context.pages[0] if context.pages else context.new_page()
            page.on("pageerror", lambda error: report.page_errors.append(str(error)[:200]))
            open_course(page, lab)
            for name in DOCUMENTS:
                report.web_links += web_link_count((ROOT / name).read_text(encoding="utf-8"))
                check_document(page, lab, name, report)
            for path in js(page, "openPaths"):
                js(page, "close", path)
            wait_kernels(lab, 0, report, "after closing everything")
            check_document(page, lab, DOCUMENTS[0], report)  # README with nothing else open
            for path in notebooks:
                check_notebook(page, lab, path, report)
            check_anchors(page, lab, report)
        finally:
            context.close()


def summary(report: Report, seconds: float) -> None:
    kinds: dict[tuple[str, str], list[int]] = {}
    for _, href, kind, result in report.links:
        shape = ("#cell-id=" if "#cell-id=" in href
                 else "#anchor" if "#" in href else "no fragment")
        target = Path(href.split("#")[0]).suffix or "same document"
        tally = kinds.setdefault((f"{target} {shape}", kind), [0, 0])
        tally[result != "landed"] += 1
    print("\nlinks by kind (target, fragment) -> what JupyterLab opened: landed, missed")
    for (shape, kind), (landed, missed) in sorted(kinds.items()):
        print(f"  {shape:28} -> {kind:18} {landed:3} landed, {missed} missed")
    print("anchors:")
    for anchor, result in report.anchors:
        print(f"  {anchor}: {result}")
    print(f"\n{len(report.notebooks)} notebooks, {report.cells} cells ({report.code_cells} run), "
          f"{report.figures} figures drawn, {len(report.links)} links clicked "
          f"({report.web_links} web links not followed), {len(report.anchors)} anchors, "
          f"{len(report.outside)} requests elsewhere refused, "
          f"{len(report.page_errors)} page errors; {seconds:.0f} s")
    for error in report.page_errors:
        print(f"  page error: {error}")


def main(argv: list[str]) -> int:
    if not Path(CHROMIUM).exists():
        print(f"Chromium not found at {CHROMIUM}: install it (Debian: apt-get install chromium) "
              "or set CHROMIUM to its path", file=sys.stderr)
        return 2
    if not LAB_DEFAULTS.exists():
        print(f"{LAB_DEFAULTS} is missing: make setup writes it (the course's JupyterLab "
              "defaults, which this check reads the course with)", file=sys.stderr)
        return 2
    try:
        import playwright  # noqa: F401
    except ImportError:
        print("Playwright is missing: pip install -e '.[browser]' (make labcheck does)",
              file=sys.stderr)
        return 2
    chosen = [Path(arg).resolve() for arg in argv] or course_notebooks()
    notebooks = [str(p.relative_to(ROOT)) for p in chosen]
    started, before, report = time.monotonic(), course_files(), Report()
    marker = secrets.token_hex(8)
    os.environ[lab_server.MARKER_VARIABLE] = marker  # Playwright's driver and Chromium inherit it
    lab_server.adopt_orphans()
    with tempfile.TemporaryDirectory(prefix="labcheck-") as tmp:
        lab = lab_server.start(ROOT, Path(tmp), marker)
        try:
            browse(lab, Path(tmp), notebooks, report)
        except Exception as exc:  # noqa: BLE001 - reported as a failure, then everything stops
            report.fail(f"the check itself stopped: {type(exc).__name__}: {exc}")
        finally:
            lab_server.stop(lab)
            for pid, command in lab_server.stop_leftovers(marker):
                report.fail(f"process {pid} was still running after the check and was stopped: "
                            f"{command}")
            lab_server.reap()
    if report.outside:
        report.fail(f"{len(report.outside)} requests to elsewhere than 127.0.0.1, "
                    f"first {report.outside[0]}")
    changed = [name for name, digest in course_files().items() if before.get(name) != digest]
    if changed:
        report.fail(f"course files changed during the check: {changed}")
    summary(report, time.monotonic() - started)
    if report.failures:
        print(f"\n{len(report.failures)} failures:\n" + "\n".join(report.failures))
        return 1
    print("the course reads cleanly in JupyterLab")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
