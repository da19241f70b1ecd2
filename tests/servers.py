"""The servers some tests need, had the same way for PostgreSQL and Redis.

A test module asks for a server through ``server_or_skip``: the server the
environment names, or a private one started from a wheel. Without one the
tests are skipped with the reason, unless the machine's required-variable
(``QUEUE_CORE_PG_REQUIRED=1``, ``QUEUE_CORE_REDIS_REQUIRED=1``: CI sets both)
says it must have one: then they fail.
"""

from __future__ import annotations

import os
from contextlib import ExitStack
from typing import Callable, ContextManager, Iterator

import pytest


def server_or_skip(start: Callable[[], ContextManager[str]], unavailable: type[Exception],
                   required_variable: str) -> Iterator[str]:
    """Yield the address ``start`` gives; its ``unavailable`` error is a skip, or a
    failure where ``required_variable`` is ``1``."""
    with ExitStack() as stack:
        try:
            address = stack.enter_context(start())
        except unavailable as exc:
            if os.environ.get(required_variable) == "1":
                pytest.fail(f"{exc} ({required_variable}=1: this machine must run them)",
                            pytrace=False)
            pytest.skip(str(exc))
        yield address
