"""The queue on PostgreSQL: for workers on several hosts (README, notebook 10).

``store`` holds ``PostgresStore`` and the server's clock; ``schema``, ``step``
(the worker's step as a function of the schema), ``connection``, ``session``
(what bounds each session) and ``migrations`` (one module per schema version)
what it is made of. Nothing here imports the SQLite store.
"""

from .migrations import STEPS as POSTGRES_STEPS
from .schema import EXPIRED_READ, SCHEMA_VERSION
from .step import STEP_FUNCTION
from .store import MIGRATION_LOCK_TIMEOUT, DatabaseClock, PgConnection, PostgresStore

__all__ = ["DatabaseClock", "EXPIRED_READ", "MIGRATION_LOCK_TIMEOUT", "POSTGRES_STEPS",
           "PgConnection", "PostgresStore", "SCHEMA_VERSION", "STEP_FUNCTION"]
