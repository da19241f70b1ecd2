"""A private JupyterLab server for the browser check, and the sweep that stops
everything it started.

The server listens on 127.0.0.1 only, on a free port, behind a random token,
with its runtime, config, user settings and workspaces in a temporary folder
(the learner's own JupyterLab settings are neither read nor written). Its
root is the repository, as ``make course`` has it; the notebook-windowing
default that ``make course`` installs in the virtual environment applies here
too, since it lives in the environment's own JupyterLab settings.

Every process the check starts (the server, its kernels, what the notebooks
start, Playwright's driver and Chromium) carries one marker in its
environment: ``leftovers(marker)`` finds them by it, never by name.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

MARKER_VARIABLE = "QUEUE_LABCHECK_RUN"
START_SECONDS = 90

# What a learner's JupyterLab would otherwise do that a check must not: save a
# dirty notebook over the stored one, keep a kernel running after its tab is
# closed, or ask a question in a pop-up over the links.
USER_SETTINGS = {
    "@jupyterlab/docmanager-extension/plugin": {"autosave": False},
    "@jupyterlab/notebook-extension/tracker": {"kernelShutdown": True},
    "@jupyterlab/apputils-extension/notification": {"fetchNews": "false",
                                                    "checkForUpdates": False},
}


@dataclass(frozen=True)
class Lab:
    """A running server: where it is, how to reach it, and its process."""

    url: str
    token: str
    process: subprocess.Popen
    log: Path

    def api(self, path: str, method: str = "GET") -> object:
        request = urllib.request.Request(f"{self.url}{path}", method=method,
                                         headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(request, timeout=10) as response:
            body = response.read()
        return json.loads(body) if body else None

    def kernels(self) -> list[dict]:
        return self.api("/api/kernels")  # type: ignore[return-value]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def write_config(folder: Path, root: Path, port: int, token: str) -> dict[str, str]:
    """Config and settings for one run under ``folder``; the environment that points at them."""
    config_dir = folder / "config"
    config_dir.mkdir(parents=True)
    config = {
        "ServerApp": {"ip": "127.0.0.1", "port": port, "port_retries": 0,
                      "open_browser": False, "root_dir": str(root),
                      "allow_root": os.geteuid() == 0, "terminals_enabled": False},
        "IdentityProvider": {"token": token},
        # JupyterLab checkpoints every file it opens: into the run's folder, not the course.
        "FileCheckpoints": {"root_dir": str(folder / "checkpoints")},
        "LabApp": {"expose_app_in_browser": True, "news_url": None,
                   "check_for_updates_class": "jupyterlab.NeverCheckForUpdate",
                   "extension_manager": "readonly"},
    }
    (config_dir / "jupyter_server_config.json").write_text(json.dumps(config), encoding="utf-8")
    settings_dir = folder / "settings"
    for name, values in USER_SETTINGS.items():
        path = settings_dir / f"{name}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values), encoding="utf-8")
    return {"JUPYTER_CONFIG_DIR": str(config_dir),
            "JUPYTER_RUNTIME_DIR": str(folder / "runtime"),
            "JUPYTERLAB_SETTINGS_DIR": str(settings_dir),
            "JUPYTERLAB_WORKSPACES_DIR": str(folder / "workspaces")}


def start(root: Path, folder: Path, marker: str) -> Lab:
    """Start JupyterLab on 127.0.0.1 with ``root`` as its root; return once it answers."""
    port, token = free_port(), secrets.token_hex(24)
    env = {**os.environ, **write_config(folder, root, port, token), MARKER_VARIABLE: marker}
    env.pop("JUPYTER_PATH", None)
    log = folder / "jupyterlab.log"
    with open(log, "wb") as out:
        process = subprocess.Popen([sys.executable, "-m", "jupyter", "lab"], cwd=root, env=env,
                                   stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    lab = Lab(f"http://127.0.0.1:{port}", token, process, log)
    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"JupyterLab exited with {process.returncode}:\n{tail(log)}")
        try:
            lab.api("/api/status")
            return lab
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(0.2)
    stop(lab)
    raise RuntimeError(f"JupyterLab did not answer within {START_SECONDS} s:\n{tail(log)}")


def stop(lab: Lab) -> None:
    """Ask the server to shut down (it stops its kernels first); force it if it will not."""
    if lab.process.poll() is None:
        try:
            lab.api("/api/shutdown", method="POST")
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        try:
            lab.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            signal_group(lab.process.pid, signal.SIGTERM)
            try:
                lab.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                signal_group(lab.process.pid, signal.SIGKILL)
                lab.process.wait(timeout=10)


def signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def leftovers(marker: str) -> list[tuple[int, str]]:
    """(pid, command line) of every other process whose environment carries ``marker``."""
    needle = f"{MARKER_VARIABLE}={marker}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            if needle not in environ.split(b"\0"):
                continue
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # gone meanwhile, or not ours to read
        found.append((int(entry.name), command.strip()[:160]))
    return found


def stop_leftovers(marker: str, settle_seconds: float = 5,
                   grace_seconds: float = 10) -> list[tuple[int, str]]:
    """Stop every process still carrying ``marker`` once those that are ending have had
    ``settle_seconds`` to end (TERM, then KILL); return what had to be stopped."""
    deadline = time.monotonic() + settle_seconds
    while leftovers(marker) and time.monotonic() < deadline:
        reap()
        time.sleep(0.2)
    found = leftovers(marker)
    for pid, _ in found:
        try:
            os.kill(pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + grace_seconds
    while leftovers(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid, _ in leftovers(marker):
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    return found


def adopt_orphans() -> None:
    """Make this process the one that inherits its descendants' orphans (Linux), so that
    a process whose parent exited (Chromium's helpers, a daemon a notebook starts)
    is still ours to find, stop and reap, instead of init's."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


def reap() -> None:
    """Collect the exit status of every child that has ended (no zombie is left behind)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
