"""The queue in one SQLite file: the embedded default, which needs nothing started.

The SQLite file: one schema text that encodes the state machine, the mark
that tells the queue's own files from every other file, the connection
settings, and the single write-transaction helper.

Every request opens its own connection and closes it in ``finally`` (a
``with`` block on a ``sqlite3.Connection`` commits or rolls back but does
NOT close it). A request is one call, or a whole worker session (see
``Queue.session``), whose transactions then share one connection. Nothing
else in the package says ``BEGIN``.

A queue file carries a mark: ``PRAGMA application_id`` and the schema
version in ``PRAGMA user_version``. ``prepare`` reads a file's header
before anything is written (the switch to WAL included) and accepts only a
missing or empty file, to create (under a name that does not end in
``-wal``, ``-shm`` or ``-journal``, as SQLite names the files it keeps
beside a database), or a file with the queue's own mark: a file of another
application is left byte for byte as it was.

``schema`` holds the schema text, ``connection`` connections and
transactions, ``files`` the reads that leave nothing behind, ``identity``
what a file is, ``migrations`` one module per schema version, ``turns`` the
order in which the workers of one file take the write lock, ``store`` the
store class.
"""

from .connection import (SQLITE_BUSY, begin_immediate, connect, data_version, polling,
                         read_transaction, transaction)
from .files import connect_readonly, may_write, read, roll_back_hot_journal, unwritable
from .identity import file_rule, inspect, prepare, schema_version
from .schema import (BUSY_TIMEOUT_SECONDS, CHECKPOINT_PAGES, PAGE_SIZE, SCHEMA, SCHEMA_VERSION,
                     SYNCHRONOUS_MODES)
from .store import SqliteStore, has_table, is_connection_string

__all__ = ["BUSY_TIMEOUT_SECONDS", "CHECKPOINT_PAGES", "PAGE_SIZE", "SCHEMA", "SCHEMA_VERSION",
           "SQLITE_BUSY", "SYNCHRONOUS_MODES", "begin_immediate", "connect",
           "connect_readonly", "data_version", "file_rule", "has_table", "inspect",
           "is_connection_string", "may_write", "polling", "prepare", "read", "read_transaction",
           "roll_back_hot_journal", "schema_version", "SqliteStore", "transaction",
           "unwritable"]
