"""The set-up a learner relies on: the two commands, the package lists kept in
step, and an installed package that starts without pandas or matplotlib."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import queue_core
from conftest import ROOT


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def requirement(spec: str) -> tuple[str, str]:
    """('name', 'range') of a requirement such as ``pandas >=3.1, <4``; extras such
    as ``psycopg[binary]`` are pip's business, so the name is compared without them."""
    match = re.fullmatch(r"\s*([A-Za-z0-9_.\-]+)\s*(?:\[[^\]]*\])?\s*(.*?)\s*", spec)
    assert match, spec
    return match.group(1).lower().replace("_", "-"), re.sub(r"\s+", "", match.group(2))


def conda_environment(text: str) -> tuple[list[str], list[str]]:
    """The conda and the pip entries of a simple environment.yml, parsed by hand
    (PyYAML may not be installed): ``- item`` lines under ``dependencies:``,
    and under a nested ``- pip:``."""
    conda: list[str] = []
    pip: list[str] = []
    section = None
    for raw in text.splitlines():
        line = raw.split(" #", 1)[0].rstrip()
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        indent = len(line) - len(line.lstrip())
        item = line.strip()
        if indent == 0:
            section = "dependencies" if item == "dependencies:" else None
        elif section and item == "- pip:":
            section, pip_indent = "pip", indent
        elif section == "pip" and indent > pip_indent and item.startswith("- "):
            pip.append(item[2:].strip())
        elif section and item.startswith("- "):
            section = "dependencies"
            conda.append(item[2:].strip())
    return conda, pip


def test_the_hand_parser_reads_a_nested_pip_section() -> None:
    text = "name: x\ndependencies:\n  - python=3.12\n  - pip\n  - a>=1,<2  # why\n" \
           "  - pip:\n      - -e .\n      - b==1\nchannels:\n  - conda-forge\n"
    assert conda_environment(text) == (["python=3.12", "pip", "a>=1,<2"], ["-e .", "b==1"])


def test_environment_yml_and_pyproject_list_the_same_packages_and_ranges() -> None:
    conda, pip = conda_environment((ROOT / "environment.yml").read_text(encoding="utf-8"))
    project = pyproject()["project"]
    extras = project["optional-dependencies"]
    # what make setup installs: notebook 08 runs the peer queues, notebook 12 a broker
    declared = project["dependencies"] + extras["test"] + extras["bench"] + extras["broker"]

    # A package that conda-forge lacks is listed under pip:, with the same range.
    listed = dict(requirement(spec) for spec in conda + pip
                  if not spec.startswith(("python=", "pip", "-e ")))

    assert listed == dict(requirement(spec) for spec in declared)
    assert len(listed) >= 5


def test_environment_yml_pins_python_312_and_installs_the_project_with_pip() -> None:
    conda, pip = conda_environment((ROOT / "environment.yml").read_text(encoding="utf-8"))

    assert "python=3.12" in conda and "pip" in conda
    assert pip[-1] == "-e ."  # last: pip installs the project once its dependencies are in


def test_there_is_no_binder_folder_that_would_hide_environment_yml() -> None:
    assert not (ROOT / "binder").exists() and not (ROOT / ".binder").exists()
    assert (ROOT / "environment.yml").is_file()


def test_pyproject_declares_the_package_and_each_part_of_the_lab_with_its_script_and_test_extra() -> None:
    data = pyproject()

    on_disk = sorted(".".join(init.parent.relative_to(ROOT).parts)
                     for init in (ROOT / "queue_core").rglob("__init__.py"))
    assert sorted(data["tool"]["setuptools"]["packages"]) == on_disk  # each, or a wheel lacks it
    assert on_disk[0] == "queue_core" and "queue_core.lab" in on_disk
    assert data["project"]["scripts"] == {"queue-core": "queue_core.cli:main"}
    assert data["project"]["requires-python"] == ">=3.11"
    assert {requirement(spec)[0] for spec in data["project"]["optional-dependencies"]["test"]} >= \
        {"pytest", "nbval"}
    assert (ROOT / "queue_core" / "py.typed").is_file()


def test_importing_the_installed_package_elsewhere_does_not_pull_in_pandas_or_matplotlib(
        tmp_path: Path) -> None:
    code = ("import json, sys, queue_core; "
            "print(json.dumps([queue_core.__file__, sorted(m for m in sys.modules "
            "if m.split('.')[0] in ('pandas', 'matplotlib', 'numpy'))]))")
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}

    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=60)

    assert result.returncode == 0, result.stderr
    location, heavy = json.loads(result.stdout)
    assert heavy == []
    assert Path(location).resolve() == (ROOT / "queue_core" / "__init__.py").resolve()


def test_every_public_name_exists_once() -> None:
    names = queue_core.__all__

    assert len(names) == len(set(names))
    assert [name for name in names if not hasattr(queue_core, name)] == []


def makefile_targets() -> dict[str, tuple[list[str], list[str]]]:
    """Each target of the Makefile: (prerequisites, recipe lines)."""
    targets: dict[str, tuple[list[str], list[str]]] = {}
    recipe: list[str] | None = None
    for line in (ROOT / "Makefile").read_text(encoding="utf-8").splitlines():
        match = re.match(r"^([A-Za-z0-9_.$()/-]+)\s*:(?!=)(.*)$", line)
        if match:
            prerequisites, recipe = match.group(2).split(), []
            targets[match.group(1)] = (prerequisites, recipe)
        elif line.startswith("\t") and recipe is not None:
            recipe.append(line.strip())
        elif line.strip() and not line.startswith("#"):
            recipe = None
    return targets


def readme_commands() -> list[str]:
    """Shell commands shown in README code (fenced or indented), comments removed."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    commands, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced or line.startswith("    "):
            command = line.split("#", 1)[0].strip().removeprefix("$ ")
            if command:
                commands.append(command)
    return commands


def test_readme_opens_with_the_two_commands_make_course_and_make_test() -> None:
    commands = readme_commands()
    makes = [command for command in commands if command.startswith("make ")]

    assert makes[:2] == ["make course", "make test"]
    assert [command for command in makes if command.split()[1] not in makefile_targets()] == []


def test_make_test_runs_the_unit_tests_then_strict_nbval_with_the_venv_python() -> None:
    targets = makefile_targets()
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")

    assert targets["test"][0] == ["unit", "nbval"]
    assert "$(PY) -m pytest tests" in targets["unit"][1]
    assert any(line.startswith("$(PY) -m pytest $(NBVAL)") for line in targets["nbval"][1])
    assert "--nbval-sanitize-with" in makefile and "--nbval-lax" not in makefile
    # activation does not survive between recipe lines: every tool runs as the venv's python
    for name in ("course", "unit", "nbval"):
        prerequisites, recipe = targets[name]
        assert "$(STAMP)" in prerequisites
        assert recipe and all(line.startswith("$(PY) ") for line in recipe), (name, recipe)


def test_make_course_serves_the_checkout_so_that_the_chapters_links_out_of_notebooks_open(
        ) -> None:
    # a server rooted in notebooks/ cannot open ../EXERCISES.md, ../README.md or the source
    (recipe,) = makefile_targets()["course"][1]
    assert "--ServerApp.root_dir=$(CURDIR)" in recipe
    assert "--LabApp.default_url=/lab/tree/notebooks/00_overview.ipynb" in recipe
    assert not any(part.endswith(".ipynb") and not part.startswith("--")
                   for part in recipe.split())  # a notebook as argument roots the server there


def test_ci_runs_readme_test_command_and_stops_on_failure() -> None:
    script = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    lines = [line.strip() for line in script.splitlines()
             if line.strip() and not line.lstrip().startswith("#")]

    assert "make test" in lines
    assert any(re.match(r"set -[a-z]*e", line) for line in lines)
    assert os.access(ROOT / ".ci" / "run", os.X_OK)


@pytest.mark.skipif(sys.version_info < (3, 11), reason="the course needs Python 3.11+")
def test_the_package_runs_as_a_module_from_any_folder(tmp_path: Path) -> None:
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    result = subprocess.run([sys.executable, "-m", "queue_core", "--help"], cwd=tmp_path,
                            env=env, capture_output=True, text=True, timeout=60)

    assert result.returncode == 0, result.stderr
    assert all(command in result.stdout for command in ("enqueue", "work", "status", "redrive",
                                                        "demo"))
