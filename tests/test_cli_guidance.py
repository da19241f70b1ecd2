"""What the command line tells a newcomer, through real subprocesses: when
nothing is due and when the next message will be, ``work --max``, metrics in
plain figures, a global option written after the command, and the README's
own session, line for line."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

from conftest import DATA, ROOT, snapshot
from observe import expect, ledger, row
from queue_core.cli_text import work_summary
from queue_core.values import Metrics
from test_cli import outcomes, run, status_json

DEPTH = {"ready": 2, "leased": 1, "done": 3, "dead": 0}


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    for name in ("demo.jsonl", "twenty.jsonl"):
        shutil.copy(DATA / name, tmp_path / name)
    return tmp_path


MISPLACED = {
    "now-after-enqueue": (["enqueue", "demo.jsonl", "--now", "1000"],
                          "--now must come before the command 'enqueue', "
                          "as in: queue-core --now 1000 enqueue demo.jsonl"),
    "db-and-now-after-work": (["work", "--max", "2", "--db=q.sqlite3", "--now", "7"],
                              "--db and --now must come before the command 'work', "
                              "as in: queue-core --db=q.sqlite3 --now 7 work --max 2"),
    "db-between-redrive-and-its-id": (["--now", "5", "redrive", "--db", "q.sqlite3", "E0004"],
                                      "--db must come before the command 'redrive', "
                                      "as in: queue-core --now 5 --db q.sqlite3 redrive E0004"),
    "now-after-status": (["status", "--json", "--now", "1000"],
                         "--now must come before the command 'status', "
                         "as in: queue-core --now 1000 status --json"),
    "max-before-work": (["--max", "2", "work"],
                        "--max must come after the command 'work', as in: queue-core work --max 2"),
    "accept-before-work": (["--accept", "toy", "work"],
                           "--accept must come after the command 'work', "
                           "as in: queue-core work --accept toy"),
    "categories-and-now-before-work": (["--accept", "toy", "bag", "--now", "5", "work", "--max",
                                        "3"],
                                       "--accept must come after the command 'work', "
                                       "as in: queue-core --now 5 work --accept toy bag --max 3"),
    "json-before-status": (["--json", "status"], "--json must come after the command "
                                                 "'status', as in: queue-core status --json"),
    "lease-with-equals-before-work": (["--lease-seconds=5", "--db", "q.sqlite3", "work"],
                                      "--lease-seconds must come after the command 'work', "
                                      "as in: queue-core --db q.sqlite3 work --lease-seconds=5"),
    "max-without-its-value": (["--max", "work"], "--max must come after the command 'work', "
                                                 "as in: queue-core work --max N"),
    "both-ways-round": (["--batch-size", "3", "work", "--db", "q.sqlite3"],
                        "--db must come before the command 'work' and --batch-size after it, "
                        "as in: queue-core --db q.sqlite3 work --batch-size 3"),
}


@pytest.mark.parametrize("args, explanation", MISPLACED.values(), ids=MISPLACED.keys())
def test_a_global_option_after_the_command_is_refused_with_the_command_line_put_right(
        scratch: Path, args: list[str], explanation: str) -> None:
    before = sorted(path.name for path in scratch.iterdir())

    result = run(scratch, *args)

    assert (result.returncode, result.stdout) == (2, "")
    usage, refusal = result.stderr.splitlines()
    assert usage.startswith("usage: queue-core ") and "[--now T] COMMAND" in usage
    assert refusal == f"queue-core: error: misplaced_option: {explanation}"
    assert sorted(path.name for path in scratch.iterdir()) == before  # no database was made


MISSPELT = {
    "maxx-of-work": (["--db", "q.sqlite3", "work", "--maxx", "2"], "work",
                     "the command 'work' has no option --maxx; did you mean --max? "
                     "as in: queue-core --db q.sqlite3 work --max 2"),
    "jsn-of-status": (["status", "--jsn"], "status",
                      "the command 'status' has no option --jsn; did you mean --json? "
                      "as in: queue-core status --json"),
    "batchsize-with-equals": (["--now", "5", "work", "--batchsize=3", "--accept", "toy"], "work",
                              "the command 'work' has no option --batchsize; did you mean "
                              "--batch-size? as in: queue-core --now 5 work --batch-size=3 "
                              "--accept toy"),
    "two-misspelt": (["work", "--acept", "toy", "--maxx", "1"], "work",
                     "the command 'work' has no option --acept or --maxx; did you mean "
                     "--accept and --max? as in: queue-core work --accept toy --max 1"),
    "nothing-close": (["work", "--frobnicate"], "work",
                      "the command 'work' has no option --frobnicate; its options are "
                      "--lease-seconds, --accept, --batch-size and --max, as "
                      "queue-core work --help shows"),
    "dbb-before-the-command": (["--dbb", "q.sqlite3", "status"], None,
                               "queue-core has no option --dbb; did you mean --db? "
                               "as in: queue-core --db q.sqlite3 status"),
    "no-command-at-all": (["--nwo=5"], None,
                          "queue-core has no option --nwo; did you mean --now? "
                          "as in: queue-core --now=5"),
}


@pytest.mark.parametrize("args, command, explanation", MISSPELT.values(), ids=MISSPELT.keys())
def test_a_misspelt_option_is_refused_with_its_parsers_usage_and_the_closest_option(
        scratch: Path, args: list[str], command: str | None, explanation: str) -> None:
    before = sorted(path.name for path in scratch.iterdir())

    result = run(scratch, *args)

    assert (result.returncode, result.stdout) == (2, "")
    lines = result.stderr.splitlines()
    prog = "queue-core" if command is None else f"queue-core {command}"
    assert lines[0].startswith(f"usage: {prog} [-h]")  # the usage of the parser that owns it
    assert lines[-1] == f"{prog}: error: unknown_option: {explanation}"
    assert sorted(path.name for path in scratch.iterdir()) == before  # no database was made


def test_an_abbreviated_option_is_refused_with_the_option_it_would_have_been(
        scratch: Path) -> None:
    assert run(scratch, "--now", "1000", "enqueue", "demo.jsonl").returncode == 0
    before = ledger(scratch / "queue.sqlite3")

    result = run(scratch, "--now", "1000", "work", "--ma", "1", "--lease", "5")

    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.splitlines()[-1] == (
        "queue-core work: error: unknown_option: the command 'work' has no option --ma or "
        "--lease; its options are --lease-seconds, --accept, --batch-size and --max, as "
        "queue-core work --help shows")
    assert ledger(scratch / "queue.sqlite3") == before == expect(total=0, effects=0, ready=4)


def test_the_command_line_a_misspelt_option_suggests_runs(scratch: Path) -> None:
    assert run(scratch, "--now", "1000", "enqueue", "demo.jsonl").returncode == 0
    refused = run(scratch, "--now", "1000", "work", "--maxx", "1")
    assert refused.returncode == 2

    result = run(scratch, *put_right(refused.stderr))

    assert put_right(refused.stderr) == ["--now", "1000", "work", "--max", "1"]
    assert result.returncode == 0, result.stderr
    assert ledger(scratch / "queue.sqlite3") == expect(total=10000, effects=1, done=1, ready=3)


def test_an_extra_argument_of_a_command_is_refused_with_that_commands_usage(
        scratch: Path) -> None:
    result = run(scratch, "enqueue", "demo.jsonl", "twenty.jsonl")

    assert (result.returncode, result.stdout) == (2, "")
    lines = result.stderr.splitlines()
    assert lines[0].startswith("usage: queue-core enqueue [-h] [--ids RULE] [--priority P] FILE")
    assert lines[-1] == ("queue-core enqueue: error: unexpected_argument: unrecognized "
                         "arguments: twenty.jsonl")
    assert not (scratch / "queue.sqlite3").exists()


def put_right(refused: str) -> list[str]:
    """The arguments of the command line a ``misplaced_option`` refusal shows."""
    return refused.splitlines()[-1].split("as in: queue-core ", 1)[1].split()


def test_the_command_line_put_right_runs(scratch: Path) -> None:
    refused = run(scratch, "enqueue", "demo.jsonl", "--now", "1000")

    result = run(scratch, *put_right(refused.stderr))

    assert (result.returncode, result.stdout) == (0, "inserted 4, duplicates 1\n")
    assert row(scratch / "queue.sqlite3", "E0001")["available_at"] == 1000


def test_a_work_option_put_before_the_command_is_put_right_and_then_runs(scratch: Path) -> None:
    assert run(scratch, "--now", "1000", "enqueue", "demo.jsonl").returncode == 0
    refused = run(scratch, "--accept", "toy", "--max", "2", "--now", "1000", "work")
    before = snapshot(scratch / "queue.sqlite3")
    assert refused.returncode == 2 and snapshot(scratch / "queue.sqlite3") == before

    result = run(scratch, *put_right(refused.stderr))

    assert put_right(refused.stderr) == ["--now", "1000", "work", "--accept", "toy", "--max", "2"]
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "E0001 done (generation 1): book +10000", "E0002 done (generation 1): pen +2000",
        "stopped at --max 2 (2 processed); the rest is still queued (ready 2, leased 0): "
        "run work again to go on"]
    assert ledger(scratch / "queue.sqlite3") == expect(total=12000, effects=2, done=2, ready=2)


@pytest.mark.parametrize("args, given", [(["--now", "5", "demo"], "--now"),
                                         (["--db", "x.sqlite3", "demo"], "--db"),
                                         (["--db", "x.sqlite3", "--now", "0", "demo"],
                                          "--db and no --now"),
                                         (["demo", "--now", "5"], "--now"),
                                         (["demo", "--db", "x.sqlite3", "--now", "0"],
                                          "--db and no --now")],
                         ids=["now", "db", "both", "now-after", "both-after"])
def test_the_demo_refuses_db_and_now_which_it_would_not_use(
        scratch: Path, args: list[str], given: str) -> None:
    before = sorted(path.name for path in scratch.iterdir())

    result = run(scratch, *args)

    assert (result.returncode, result.stdout) == (2, "")
    usage, refusal = result.stderr.splitlines()
    assert usage.startswith("usage: queue-core ")
    assert refusal == (f"queue-core: error: unused_option: demo takes no {given}: it runs in a "
                       "temporary database of its own, on its own model clock, as in: "
                       "queue-core demo")
    assert sorted(path.name for path in scratch.iterdir()) == before


def test_work_after_an_enqueue_on_the_system_clock_says_nothing_is_due_yet_and_when(
        scratch: Path) -> None:
    assert run(scratch, "enqueue", "demo.jsonl").returncode == 0  # stamped with the system clock
    stamped = row(scratch / "queue.sqlite3", "E0001")["available_at"]
    before = snapshot(scratch / "queue.sqlite3")

    result = run(scratch, "--now", "1000", "work")

    assert result.returncode == 0, result.stderr
    years = (stamped - 1000) / (365.25 * 86400)
    assert result.stdout == (f"nothing due at t=1000 (0 processed); 4 ready messages waiting, "
                             f"the next due at t={stamped}, in {stamped - 1000} s "
                             f"(about {years:.1f} years)\n")
    assert snapshot(scratch / "queue.sqlite3")["messages"] == before["messages"]
    assert ledger(scratch / "queue.sqlite3") == expect(total=0, effects=0, ready=4)


def test_work_max_stops_after_n_and_says_the_rest_is_still_queued(scratch: Path) -> None:
    assert run(scratch, "--now", "1000", "enqueue", "twenty.jsonl").returncode == 0

    first = run(scratch, "--now", "1000", "work", "--max", "3")
    batched = run(scratch, "--now", "1000", "work", "--max", "4", "--batch-size", "10")

    assert first.returncode == 0, first.stderr
    assert first.stdout.splitlines() == [
        "E0100 done (generation 1): book +100", "E0101 done (generation 1): pen +200",
        "E0102 done (generation 1): bag +300",
        "stopped at --max 3 (3 processed); the rest is still queued (ready 17, leased 0): "
        "run work again to go on"]
    assert batched.returncode == 0, batched.stderr
    assert [line.split()[0] for line in batched.stdout.splitlines()[:-1]] == [
        "E0103", "E0104", "E0105", "E0106"]  # a batch of 10 claims no more than the 4 left
    assert batched.stdout.splitlines()[-1].startswith("stopped at --max 4 (4 processed); "
                                                      "the rest is still queued (ready 13, ")
    assert ledger(scratch / "queue.sqlite3") == expect(total=2800, effects=7, done=7, ready=13)
    assert status_json(scratch, "--now", "1000")["states"]["leased"] == 0


def test_work_max_that_takes_the_last_message_says_nothing_is_left(scratch: Path) -> None:
    assert run(scratch, "--now", "1000", "enqueue", "demo.jsonl").returncode == 0

    result = run(scratch, "--now", "1000", "work", "--max", "4")

    assert (result.returncode, outcomes(result.stdout)) == (
        0, [("E0001", "done"), ("E0002", "done"), ("E0003", "done"), ("E0004", "dead")])
    assert result.stdout.splitlines()[-1] == "nothing left to claim at t=1000 (4 processed)"
    assert ledger(scratch / "queue.sqlite3") == expect(total=17000, effects=3, done=3, dead=1)


def test_metrics_prints_plain_figures_and_says_when_the_next_message_is_due(
        scratch: Path) -> None:
    assert run(scratch, "--now", "2000", "enqueue", "demo.jsonl").returncode == 0
    before = snapshot(scratch / "queue.sqlite3")

    early = run(scratch, "--now", "1990", "metrics")
    early_json = run(scratch, "--now", "1990", "metrics", "--json")

    assert (early.returncode, early.stderr) == (0, "")
    assert early.stdout.splitlines() == [
        "at:             t=1990 (model time)",
        "depth:          ready 4, leased 0, done 0, dead 0",
        "oldest due:     none due; 4 ready messages waiting, the next due at t=2000, in 10 s",
        "expired leases: 0",
        "dead attempts:  none dead"]
    assert json.loads(early_json.stdout) == {
        "at": 1990, "depth": {"ready": 4, "leased": 0, "done": 0, "dead": 0},
        "oldest_ready_age": None, "next_due_at": 2000, "expired_leases": 0, "dead_attempts": {}, "pruned": 0, "ids": "course"}
    assert snapshot(scratch / "queue.sqlite3") == before

    assert run(scratch, "--now", "2000", "work", "--max", "3").returncode == 0
    late = run(scratch, "--now", "2125", "metrics")
    assert late.stdout.splitlines()[1:3] == [
        "depth:          ready 1, leased 0, done 3, dead 0",
        "oldest due:     waiting 125 s (about 2.1 minutes), since t=2000"]
    assert run(scratch, "--now", "2125", "work").returncode == 0
    done = run(scratch, "--now", "2125", "metrics")
    assert done.stdout.splitlines()[2:] == ["oldest due:     none due, none ready",
                                            "expired leases: 0", "dead attempts:  E0004 1"]
    assert ledger(scratch / "queue.sqlite3") == expect(total=17000, effects=3, done=3, dead=1)


def test_metrics_on_the_system_clock_shows_the_moment_as_a_utc_date(scratch: Path) -> None:
    assert run(scratch, "enqueue", "demo.jsonl").returncode == 0

    result = run(scratch, "metrics")

    at = re.fullmatch(r"at:\s+t=(\d+) \((.*) UTC\)", result.stdout.splitlines()[0])
    assert at is not None, result.stdout
    moment = datetime.fromtimestamp(int(at.group(1)), timezone.utc)
    assert at.group(2) == f"{moment:%Y-%m-%d %H:%M:%S}"
    assert row(scratch / "queue.sqlite3", "E0001")["available_at"] <= int(at.group(1))


def test_metrics_json_says_when_the_next_message_is_due_on_both_stores(
        scratch: Path, store: str) -> None:
    db = ["--db", store]
    assert run(scratch, *db, "--now", "2000", "enqueue", "demo.jsonl").returncode == 0
    assert run(scratch, *db, "--now", "2000", "work", "--max", "1").returncode == 0

    waiting = json.loads(run(scratch, *db, "--now", "1990", "metrics", "--json").stdout)
    due = json.loads(run(scratch, *db, "--now", "2005", "metrics", "--json").stdout)

    assert (waiting["oldest_ready_age"], waiting["next_due_at"]) == (None, 2000)
    assert (due["oldest_ready_age"], due["next_due_at"]) == (5, None)
    assert due["depth"] == {"ready": 3, "leased": 0, "done": 1, "dead": 0}
    assert status_json(scratch, *db)["total"] == 10000


def readme_session() -> list[tuple[str, list[str]]]:
    """The README's console session: (command, the lines it shows) per ``$`` line."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"^```console\n(.*?)^```", text, re.S | re.M)
    assert block is not None
    steps: list[tuple[str, list[str]]] = []
    for line in block.group(1).splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        else:
            steps[-1][1].append(line)
    return steps


def test_the_readme_session_prints_exactly_what_the_readme_shows(tmp_path: Path) -> None:
    shutil.copytree(DATA, tmp_path / "data")
    steps = readme_session()
    assert steps[0] == (". .venv/bin/activate", [])
    for command, shown in steps[1:]:
        words = command.split()
        assert words[:3] == ["python", "-m", "queue_core"], command
        result = subprocess.run([sys.executable, *words[1:]], cwd=tmp_path, capture_output=True,
                                text=True, timeout=120)
        assert (result.stdout + result.stderr).splitlines() == shown, command
        assert sorted(path.name for path in tmp_path.iterdir()) == ["data", "queue.sqlite3"], \
            command  # no -wal, no -shm, and no file made by a mistyped --db
    assert ledger(tmp_path / "queue.sqlite3") == expect(total=20300, effects=6, done=6, ready=18)


@pytest.mark.parametrize("metrics, processed, limit, line", [
    (Metrics(1000, DEPTH, 0, 0, {}), 3, 3,
     "stopped at --max 3 (3 processed); the rest is still queued (ready 2, leased 1): "
     "run work again to go on"),
    (Metrics(1001, DEPTH, 0, 0, {}), 3, None,
     "more became due at t=1001 (3 processed): run work again to take it"),
    (Metrics(1000, DEPTH, None, 1, {}), 3, None,
     "more became due at t=1000 (3 processed): run work again to take it"),
    (Metrics(1000, DEPTH, None, 0, {}, next_due_at=1000 + 3 * 3600), 3, 3,
     "nothing due at t=1000 (3 processed); 2 ready messages waiting, the next due at t=11800, "
     "in 10800 s (about 3.0 hours)"),
    (Metrics(1000, {**DEPTH, "ready": 0}, None, 0, {}), 0, None,
     "nothing left to claim at t=1000 (0 processed)"),
], ids=["limit-reached-with-more-due", "a-retry-came-due-meanwhile", "a-lease-expired-meanwhile",
        "limit-reached-and-nothing-due", "empty"])
def test_the_last_line_of_work_says_why_it_stopped(
        metrics: Metrics, processed: int, limit: int | None, line: str) -> None:
    assert work_summary(metrics, processed, limit) == line


@pytest.mark.parametrize("args, said", [
    (["stauts"], "'stauts' is no command; did you mean 'status'? as in: queue-core status"),
    (["--db", "q.sqlite3", "wrok", "--max", "2"],
     "'wrok' is no command; did you mean 'work'? as in: queue-core --db q.sqlite3 work --max 2"),
    (["frobnicate"], "'frobnicate' is no command; the commands are enqueue, work, status, "
                     "metrics, redrive, prune, migrate, demo")], ids=["status", "work", "none-close"])
def test_a_misspelt_command_is_refused_with_the_closest_command_and_touches_nothing(
        scratch: Path, args: list[str], said: str) -> None:
    before = sorted(path.name for path in scratch.iterdir())

    result = run(scratch, *args)

    assert (result.returncode, result.stdout) == (2, "")
    usage, refusal = result.stderr.splitlines()
    assert usage.startswith("usage: queue-core ")
    assert refusal == f"queue-core: error: unknown_command: {said}"
    assert sorted(path.name for path in scratch.iterdir()) == before
