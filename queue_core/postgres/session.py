"""What bounds a PostgreSQL session, and how its end reaches the caller.

``PostgresStore`` opens every connection with these limits (``SESSION_SETTINGS``
in the startup packet, ``transaction_timeout`` by ``SET`` where the server
has it, ``CLIENT_SETTINGS`` as libpq's own parameters; a connection that only
reads with ``READING_SETTINGS`` instead of the transaction limits), and translates the
driver's errors with ``raise_translated``: a session that ended is
``ConnectionLost``, a lock waited for too long ``LockTimeout``.
"""

from __future__ import annotations

import re

import psycopg

from ..errors import ConnectionLost, LockTimeout

# What bounds a session, and why each value (all real seconds, the server's
# and the kernel's, never the queue's model clock). Every transaction the
# protocol runs takes milliseconds; the handler inside the ACK only writes the
# effect. Long work belongs before the ACK, outside any transaction, its lease
# kept by the heartbeat (``Queue.extend``): none of these limits applies to a
# session idle between transactions, so they never end such a worker.
#
# lock_timeout: a worker never waits long for a row another transaction holds.
#   A claim skips locked rows and waits for none; the ACK's guarded UPDATE
#   waits for a transaction that is changing its message (a claim recovering
#   the lease, a stalled holder). Past this the ACK is rolled back whole
#   (``LockTimeout``, a known outcome: nothing committed) and the worker goes
#   on with the next message; whoever holds the row settles it, or its lease
#   runs out. Shorter than the transaction limit, so a lock wait ends as this
#   defined outcome, never as a killed session.
# transaction_timeout (PostgreSQL 17 and later): the server ends a session
#   whose transaction is older than this, whatever its state. It is the only
#   setting that frees the row locks of a worker stalled in the middle of a
#   pipeline (a suspended process, a network that drops everything): the
#   backend is then "active", waiting on ClientRead, so the idle-in-transaction
#   limit never fires. PostgreSQL 16 has no such setting: there a stalled
#   holder keeps its message for as long as it stays stalled.
# idle_in_transaction_session_timeout: PostgreSQL's own advice for a client
#   that stops between statements (after a Sync) with a transaction open; the
#   same limit as the transaction's, and it works on 16 as well.
# tcp_keepalives_* and tcp_user_timeout, on the server and in the client:
#   notice a peer that is gone (a dead host, a pulled cable), which the
#   kernel's defaults notice after about two hours. A peer whose kernel still
#   answers (a stopped process, a proxy that stops forwarding) is not gone,
#   so these free nothing there; and they free no lock by themselves: a dead
#   client's transaction ends when the server notices. About 10 s idle, then
#   3 probes 5 s apart, or 25 s of unacknowledged data. Over a Unix socket
#   they do nothing, and the server ignores them.
LOCK_TIMEOUT_MS = 2000
TRANSACTION_TIMEOUT_MS = 5000
IDLE_IN_TRANSACTION_TIMEOUT_MS = 5000
KEEPALIVE_IDLE_SECONDS = 10
KEEPALIVE_INTERVAL_SECONDS = 5
KEEPALIVE_COUNT = 3
TCP_USER_TIMEOUT_MS = 25000
# A connection that only reads (``Store.read``: the audit, status, a snapshot)
# holds no row lock, so neither transaction limit has anything to free there,
# and its one snapshot of a large queue outlasts them: the audit over a million
# events reads for longer than 5 s, and builds its rows in the client between
# statements. It is read-only instead, whatever its statements say.
READING_SETTINGS = {
    "idle_in_transaction_session_timeout": "0",
    "default_transaction_read_only": "on",
}
# The settings sent in the startup packet (no round trip), every major alike.
SESSION_SETTINGS = {
    "lock_timeout": str(LOCK_TIMEOUT_MS),
    "idle_in_transaction_session_timeout": str(IDLE_IN_TRANSACTION_TIMEOUT_MS),
    "tcp_keepalives_idle": str(KEEPALIVE_IDLE_SECONDS),
    "tcp_keepalives_interval": str(KEEPALIVE_INTERVAL_SECONDS),
    "tcp_keepalives_count": str(KEEPALIVE_COUNT),
    "tcp_user_timeout": str(TCP_USER_TIMEOUT_MS),
}
# The client's half: libpq's own connection parameters.
CLIENT_SETTINGS = {
    "keepalives": 1,
    "keepalives_idle": KEEPALIVE_IDLE_SECONDS,
    "keepalives_interval": KEEPALIVE_INTERVAL_SECONDS,
    "keepalives_count": KEEPALIVE_COUNT,
    "tcp_user_timeout": TCP_USER_TIMEOUT_MS,
}
TRANSACTION_TIMEOUT_SINCE = 170000  # server_version_num of PostgreSQL 17
# SQLSTATEs that mean the session is over: 08 connection exception; 57P the
# server shuts down or ended this session; 25P03 idle in transaction too long,
# 25P04 transaction too long (the server then closes the connection).
SESSION_ENDED = ("08", "57P", "25P03", "25P04")


def session_ended(exc: BaseException, broken: bool = False) -> bool:
    """Whether ``exc`` means the session is over (lost, ended by the server or
    by one of its timeouts), as opposed to a refused statement."""
    if not isinstance(exc, psycopg.Error):
        return False
    if exc.sqlstate is not None:  # 25P04 is an InternalError to psycopg, not Operational
        return exc.sqlstate.startswith(SESSION_ENDED)
    if isinstance(exc, psycopg.OperationalError):  # no SQLSTATE: the socket itself
        return True
    return broken


def raise_translated(exc: BaseException, where: str, broken: bool) -> None:
    """Raise the queue's error for a driver error that has one: a session that
    ended (``ConnectionLost``), a lock waited for too long (``LockTimeout``)."""
    if isinstance(exc, psycopg.errors.LockNotAvailable):
        raise LockTimeout(f"waited over the session's lock_timeout for a row another "
                          f"transaction holds, and rolled back: {one_line(exc)}") from exc
    if session_ended(exc, broken):
        raise ConnectionLost(where, one_line(exc)) from exc


def given_options(dsn: str) -> str:
    """The connection string's own ``options`` (such as ``-c lock_timeout=500``)."""
    return str(psycopg.conninfo.conninfo_to_dict(dsn).get("options") or "")


def session_options(given: str, *, reading: bool = False) -> str:
    """The startup packet's ``options``: this module's settings (a reading
    connection's own, ``READING_SETTINGS``, over them), then the connection
    string's own, which win (a later ``-c`` overrides)."""
    named = set(re.findall(r"-c\s*([A-Za-z_.]+)=", given))
    settings = {**SESSION_SETTINGS, **READING_SETTINGS} if reading else SESSION_SETTINGS
    ours = " ".join(f"-c {name}={value}" for name, value in settings.items()
                    if name not in named)
    return f"{ours} {given}".strip()


def one_line(exc: BaseException) -> str:
    """An error's text on one line, for ``error: CODE: ...``."""
    return re.sub(r"\s*\n\s*", "; ", str(exc).strip())
