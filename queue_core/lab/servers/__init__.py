"""Private servers for the chapters beyond one file (10, 12) and the tests.

A PostgreSQL server and a fresh schema per run (``postgres_server``), many
schemas for a sweep's cases (``pgcases``), a Redis server (``redis_server``),
and a TCP proxy on 127.0.0.1 that breaks a worker's PostgreSQL connection at
a chosen message (``faultproxy``, notebook 14).
Each starts from a pip wheel on this machine only, or uses the server a
variable names (``QUEUE_CORE_PG_DSN``, ``QUEUE_CORE_REDIS_URL``).
``DatabaseClock`` is the engine's, named here for notebook 10. Importing
this loads neither psycopg nor redis.

    from queue_core.lab.servers import fresh_schema, private_postgres
"""

from .faultproxy import Fault, FaultProxy
from .postgres_server import fresh_schema, private_postgres
from .redis_server import private_redis

__all__ = ["DatabaseClock", "Fault", "FaultProxy", "fresh_schema", "private_postgres",
           "private_redis"]


def __getattr__(name: str) -> object:
    """``DatabaseClock`` on first use: importing the servers does not load psycopg."""
    if name == "DatabaseClock":
        from ...postgres import DatabaseClock
        return DatabaseClock
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
