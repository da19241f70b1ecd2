"""What may be published: only files on an allowlist are tracked, no typical
secret is committed, and no database, build output or large binary slips in."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from conftest import ROOT

# Patterns over repository paths: ``*`` stays inside one folder, ``**/`` spans folders
# (but not hidden ones such as .ipynb_checkpoints/).
ALLOWED = (
    "README.md", "EXERCISES.md", "Makefile", "pyproject.toml", "environment.yml", ".gitignore",
    ".ci/*",
    "queue_core/*.py", "queue_core/cli/*.py", "queue_core/sqlite/*.py", "queue_core/sqlite/migrations/*.py",
    "queue_core/postgres/*.py", "queue_core/postgres/migrations/*.py",
    "queue_core/lab/*.py", "queue_core/lab/*/*.py", "queue_core/py.typed",
    "tests/*.py", "tests/files/*.py",
    "notebooks/**/*.ipynb", "notebooks/*.cfg",
    "data/*.jsonl",
    "benchmarks/*.py", "benchmarks/*.c",
)
# The queue files earlier engines wrote, each named with its engine's commit, which the
# migration tests open (tests/files/make_files.py writes them again): the only databases.
FIXTURES = re.compile(r"tests/files/schema[0-9]+-[0-9a-f]{7,40}\.sqlite3\Z")
MAX_BYTES = 2 * 1024 * 1024
BINARY_SUFFIXES = (".sqlite3", ".sqlite", ".db", ".pyc", ".pyo", ".so", ".whl", ".zip",
                   ".tar", ".gz", ".egg", ".pkl", ".npy", ".parquet", ".png", ".jpg")

SECRETS = {
    "private key block": r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----",
    "AWS access key id": r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b",
    "GitHub token": r"\b(?:gh[pousr]_[A-Za-z0-9]{36}|github_pat_[A-Za-z0-9_]{22,})\b",
    "Slack token": r"\bxox[abposr]-[A-Za-z0-9-]{10,}",
    "Google API key": r"\bAIza[0-9A-Za-z_\-]{35}\b",
    "Stripe live key": r"\b[rs]k_live_[0-9A-Za-z]{20,}\b",
    "password assignment": r"""(?i:password|passwd|pwd|secret|api_?key|access_?token)"""
                           r"""["']?\s*[:=]\s*["'][^"'\s]{6,}["']""",
    # USER:PASSWORD@ is the README's placeholder for a connection string, not a secret.
    "credentials in a URL": r"\b[a-z][a-z0-9+.-]*://[^/\s:@]+:(?!PASSWORD@)[^/\s:@]+@[\w.-]+",
}
_SECRET = re.compile("|".join(f"(?P<g{i}>{pattern})" for i, pattern in enumerate(SECRETS.values())))


def _glob_regex(pattern: str) -> re.Pattern[str]:
    parts = re.split(r"(\*\*/|\*)", pattern)
    pieces = {"**/": "(?:[^/.][^/]*/)*", "*": "[^/]*"}
    regex = "".join(pieces.get(part, re.escape(part)) for part in parts)
    return re.compile(regex + r"\Z")


_ALLOWED = [_glob_regex(pattern) for pattern in ALLOWED]


def allowed(path: str) -> bool:
    return any(regex.match(path) for regex in _ALLOWED) or FIXTURES.match(path) is not None


def secrets_in(text: str) -> list[str]:
    """Names of the kinds of secret found in ``text``."""
    kinds = list(SECRETS)
    return sorted({kinds[int(match.lastgroup[1:])] for match in _SECRET.finditer(text)
                   if match.lastgroup})


def tracked_files() -> list[str]:
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    result = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True)
    if result.returncode != 0:
        pytest.skip("not a git checkout")
    return [name for name in result.stdout.decode().split("\0") if name]


# -- the checks ----------------------------------------------------------------------------

def test_only_files_on_the_allowlist_are_tracked() -> None:
    files = tracked_files()

    assert "queue_core/queue.py" in files  # the listing itself works
    assert [name for name in files if not allowed(name)] == []


def test_no_typical_secret_is_committed() -> None:
    found = {}
    for name in tracked_files():
        path = ROOT / name
        if path.is_file():
            kinds = secrets_in(path.read_text(encoding="utf-8", errors="replace"))
            if kinds:
                found[name] = kinds
    assert found == {}


def test_no_database_binary_or_large_file_is_tracked() -> None:
    junk = []
    for name in tracked_files():
        path = ROOT / name
        if not path.is_file():
            continue
        data = path.read_bytes()
        if FIXTURES.match(name) and len(data) <= 64 * 1024:
            continue
        if name.endswith(BINARY_SUFFIXES) or len(data) > MAX_BYTES or b"\0" in data:
            junk.append(name)
    assert junk == []


# -- the checks can fail ---------------------------------------------------------------------

# Planted examples are assembled at run time so this file holds no secret itself.
PLANTED = [
    ("private key block", "-----BEGIN RSA " + "PRIVATE KEY-----\nMIIEow\n"),
    ("private key block", "-----BEGIN OPENSSH " + "PRIVATE KEY-----\nb3Bl\n"),
    ("AWS access key id", "aws_id = " + "AKIA" + "IOSFODNN7EXAMPLE"),
    ("GitHub token", "token: " + "ghp_" + "a1B2" * 9),
    ("GitHub token", "github_pat_" + "11ABCDEFG0" * 3),
    ("Slack token", "xoxb" + "-1234567890-abcdefghij"),
    ("Google API key", "AIza" + "Sy" + "A" * 33),
    ("Stripe live key", "sk_" + "live_" + "4eC39HqLyjWDarjtT1zdp7dc"),
    ("password assignment", '{"password": "' + "hunter2hunter2" + '"}'),
    ("password assignment", 'DB_PASSWORD = "' + "hunter2hunter2" + '"'),
    ("password assignment", "api_key='" + "0123456789abcdef" + "'"),
    ("credentials in a URL", "postgres://admin:" + "s3cr3t@db.example.com/shop"),
]


@pytest.mark.parametrize("kind, text", PLANTED,
                         ids=[f"{kind}-{n}" for n, (kind, _) in enumerate(PLANTED)])
def test_the_secret_detector_catches_a_planted_example(kind: str, text: str) -> None:
    assert secrets_in(f"some text\n{text}\nmore text\n") == [kind]


def test_the_secret_detector_knows_every_kind_it_names() -> None:
    assert {kind for kind, _ in PLANTED} == set(SECRETS)


@pytest.mark.parametrize("text", [
    'lease = queue.claim()  # the token a worker hands back',
    'password = os.environ["DB_PASSWORD"]',
    '"event_id": "E0001"',
    "https://docs.python.org/3/library/sqlite3.html",
    "queue-core --db postgresql://USER:PASSWORD@HOST:5432/DBNAME work",
], ids=["comment-about-a-token", "password-from-environment", "event-id", "plain-url",
        "placeholder-connection-string"])
def test_the_secret_detector_leaves_ordinary_code_alone(text: str) -> None:
    assert secrets_in(text) == []


@pytest.mark.parametrize("path, expected", [
    ("queue_core/queue.py", True), ("notebooks/00_overview.ipynb", True),
    ("notebooks/part1/01_leases.ipynb", True), ("notebooks/nbval_sanitize.cfg", True),
    ("data/demo.jsonl", True), (".ci/run", True), ("tests/test_cli.py", True),
    ("queue.sqlite3", False), ("queue_core/__pycache__/queue.cpython-311.pyc", False),
    ("queue_core/sub/module.py", False), ("notebooks/.ipynb_checkpoints/x.ipynb", False),
    (".env", False), ("data/secret.json", False), ("notes.md", False),
    ("queue_core.egg-info/PKG-INFO", False),
    ("tests/files/schema1-265c64c.sqlite3", True), ("tests/files/queue.sqlite3", False),
    ("tests/files/make_files.py", True),
], ids=lambda value: str(value))
def test_the_allowlist_admits_exactly_the_intended_paths(path: str, expected: bool) -> None:
    assert allowed(path) is expected
