"""The PostgreSQL queues a Python user would pick instead, behind the peers' put / get / ack.

Both are asyncio libraries; each adapter keeps one event loop and runs a
whole slice's puts, or a whole slice's gets and acks, as one coroutine, so
a slice pays no more for the loop than an asyncio worker would. Each puts,
gets and acknowledges one job at a time, on its own defaults, in a schema
of its own on the benchmark's server.

``pgqueuer`` (``pgqueuer.Queries``, the calls its ``QueueManager`` makes)
    put: ``enqueue`` (one INSERT, its own commit). get: ``dequeue`` with a
    batch of one: an UPDATE of the oldest ``queued`` row (``FOR UPDATE SKIP
    LOCKED``) to ``picked``, stamped with the consumer's id and a
    heartbeat; a ``picked`` row whose heartbeat is older than
    ``heartbeat_timeout`` (30 s by default) is picked again by anyone.
    ack: ``log_jobs`` with ``successful``: DELETE the row by id and INSERT
    a log row, one statement. The ack names only the job id: it does not
    check that the row is still this consumer's pick (no consumer id, no
    heartbeat, no count of picks), so a consumer whose job was re-picked
    after a stale heartbeat deletes it under the new owner, and both run
    the job. Its ``QueueManager`` defaults to batches of 10 and buffers
    acks; one at a time is what our single-message mode does.
``procrastinate`` (``App.job_manager``, the calls its worker makes)
    put: ``defer_async`` (one INSERT through a function, its own commit).
    get: ``fetch_job``: an UPDATE of the oldest ``todo`` row (``FOR UPDATE
    SKIP LOCKED``) to ``doing`` with the worker's id. ack: ``finish_job``
    with ``succeeded``: UPDATE by id where the status is ``todo`` or
    ``doing``. The ack does not check the worker id, so it fences nothing
    beyond the status. A job whose worker died stays ``doing``: another
    worker prunes the dead worker's row after its heartbeat stops (30 s),
    but nothing hands the job out again until someone calls
    ``retry_job`` (the documented recipe: a periodic task over
    ``get_stalled_jobs``).

Neither writes a business effect in the ack's transaction, as our ACK does.
On the same work (``work``), the consumer commits the effect between the
get and the ack in an effects table of the same database, on a connection
of its own (``app_effects.PgEffects``), as their users' handlers do.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any, Coroutine, TypeVar

from app_effects import PgEffects, effect_of_item
from peer_base import Adapter, id_of

T = TypeVar("T")
ENTRYPOINT = "bench"


class AsyncAdapter(Adapter):
    """An asyncio library behind the peers' synchronous calls: one event loop per adapter."""

    store = "postgres"
    tables = ""  # the library's tables, for the durability read-back (LIKE pattern)

    def __init__(self, path: Path | str, variant: str = "defaults") -> None:
        super().__init__(str(path), variant)
        self.loop = asyncio.new_event_loop()
        self.run(self._open())

    def run(self, work: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(work)

    def put(self, items: list[str]) -> None:
        self.run(self._put(items))

    def take(self) -> tuple[Any, str | bytes] | None:
        return self.run(self._take())

    def ack(self, handle: Any) -> None:
        self.run(self._ack(handle))

    def consume(self, n: int) -> list[str]:
        return self.run(self._consume(n))

    async def _get(self) -> tuple[Any, str] | None:
        taken = await self._take()
        return None if taken is None else (taken[0], id_of(taken[1]))

    async def _consume(self, n: int) -> list[str]:
        got: list[str] = []
        while len(got) < n and (taken := await self._get()) is not None:
            await self._ack(taken[0])
            got.append(taken[1])
        return got

    def open_effects(self, where: str) -> dict[str, str]:
        """An effects table in ``where`` (the same database), on a connection of its own."""
        self.effects = PgEffects(where)
        self.run(self.effects.open())
        return self.run(self.effects.pragmas())

    def work(self, n: int) -> list[str]:
        return self.run(self._work(n))

    async def _work(self, n: int) -> list[str]:
        got: list[str] = []
        while len(got) < n and (taken := await self._take()) is not None:
            event_id, effect = effect_of_item(taken[1])
            await self.effects.commit(event_id, effect)
            await self._ack(taken[0])
            got.append(event_id)
        return got

    def pragmas(self) -> dict[str, str]:
        rows = self.run(self._fetch(
            "SELECT c.relpersistence FROM pg_class c WHERE c.relkind = 'r' AND c.relname LIKE %s "
            "AND c.relnamespace = current_schema()::regnamespace", self.tables))
        kinds = {"p": "LOGGED", "u": "UNLOGGED", "t": "TEMP"}
        found = sorted({kinds.get(row[0], row[0]) for row in rows})
        sync = self.run(self._fetch("SHOW synchronous_commit"))[0][0]
        return {"journal_mode": "/".join(found) or "none", "synchronous": str(sync)}

    def close(self) -> None:
        if self.effects is not None:
            self.run(self.effects.close())
            self.effects = None
        self.run(self._close())
        self.loop.close()

    async def _fetch(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        raise NotImplementedError

    async def _open(self) -> None:
        raise NotImplementedError

    async def _close(self) -> None:
        raise NotImplementedError

    async def _put(self, items: list[str]) -> None:
        raise NotImplementedError

    async def _take(self) -> tuple[Any, str | bytes] | None:
        raise NotImplementedError

    async def _ack(self, handle: Any) -> None:
        raise NotImplementedError


class PgQueuer(AsyncAdapter):
    name, dist, module = "pgqueuer", "pgqueuer", "pgqueuer"
    tables = "pgqueuer%"
    ack_means = ("log_jobs deletes the row by id and logs it: no check that it is still "
                 "this consumer's pick; a stale heartbeat (30 s) lets anyone pick it again")
    lease_seconds = 30.0  # its heartbeat_timeout default
    guarantee = "at least once, deduped"
    guarantee_why = ("the effect commits before log_jobs: a consumer that dies between them "
                     "leaves the job picked, any consumer picks it again once its heartbeat "
                     "is stale (30 s), and the effect's key makes the second run add nothing; "
                     "the key also absorbs a late ack's double run (log_jobs deletes the job "
                     "under its new owner, and both ran it)")
    reader_judges_lease = True  # each dequeue says how old a heartbeat may be

    async def _open(self) -> None:
        import psycopg
        from pgqueuer import Queries
        from pgqueuer.ports.repository import EntrypointExecutionParameter

        self.conn = await psycopg.AsyncConnection.connect(self.path, autocommit=True)
        self.queries = Queries.from_psycopg_connection(self.conn)
        if not await self.queries.schema_is_installed():
            await self.queries.install()
        self.manager_id = uuid.uuid4()
        self.entrypoints = {ENTRYPOINT: EntrypointExecutionParameter(concurrency_limit=0)}

    async def _close(self) -> None:
        await self.conn.close()

    async def _fetch(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        cursor = await self.conn.execute(sql, args or None)
        return list(await cursor.fetchall())

    async def _put(self, items: list[str]) -> None:
        for item in items:
            await self.queries.enqueue(ENTRYPOINT, item.encode())

    async def _take(self) -> tuple[Any, str | bytes] | None:
        jobs = await self.queries.dequeue(
            batch_size=1, entrypoints=self.entrypoints, queue_manager_id=self.manager_id,
            global_concurrency_limit=None,
            heartbeat_timeout=timedelta(seconds=float(self.lease_seconds or 30)))
        return (jobs[0], jobs[0].payload) if jobs else None

    async def _ack(self, handle: Any) -> None:
        await self.queries.log_jobs([(handle, "successful", None)])

    def settled(self) -> tuple[int, int] | None:
        rows = self.run(self._fetch(
            "SELECT (SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'), "
            "(SELECT count(*) FROM pgqueuer)"))
        return int(rows[0][0]), int(rows[0][1])

    def still_stored(self, event_id: str) -> bool:
        rows = self.run(self._fetch("SELECT count(*) FROM pgqueuer WHERE "
                                    "convert_from(payload, 'UTF8') LIKE %s", f"%{event_id}%"))
        return bool(rows[0][0])


async def _bench_task(item: str) -> None:
    """The task procrastinate's jobs name; the benchmark never runs it, it only takes jobs."""


class Procrastinate(AsyncAdapter):
    name, dist, module = "procrastinate", "procrastinate", "procrastinate"
    tables = "procrastinate%"
    ack_means = ("finish_job sets succeeded by id if the job is todo or doing: no worker "
                 "check; a dead worker's job stays doing until someone calls retry_job")
    guarantee = "at least once after a retry, deduped"
    guarantee_why = ("the effect commits before finish_job: a worker that dies between them "
                     "leaves the job doing until someone calls retry_job (the documented "
                     "periodic task over get_stalled_jobs); the rerun then finds the effect's "
                     "key and adds nothing")

    async def _open(self) -> None:
        import procrastinate

        logging.getLogger("procrastinate").setLevel(logging.ERROR)
        self.app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=self.path))
        self.task = self.app.task(name=ENTRYPOINT)(_bench_task)
        await self.app.open_async()
        if not (await self._fetch("SELECT to_regclass('procrastinate_jobs') IS NOT NULL"))[0][0]:
            await self.app.schema_manager.apply_schema_async()
        self.manager = self.app.job_manager
        self.worker_id = await self.manager.register_worker()

    async def _close(self) -> None:
        await self.manager.unregister_worker(self.worker_id)
        await self.app.close_async()

    async def _fetch(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        connector = self.app.connector
        async with connector.pool.connection() as conn:  # type: ignore[attr-defined]
            cursor = await conn.execute(sql, args or None)
            return [tuple(row.values()) if isinstance(row, dict) else tuple(row)
                    for row in await cursor.fetchall()]

    async def _put(self, items: list[str]) -> None:
        for item in items:
            await self.task.defer_async(item=item)

    async def _take(self) -> tuple[Any, str | bytes] | None:
        job = await self.manager.fetch_job(None, self.worker_id)
        return None if job is None else (job, job.task_kwargs["item"])

    async def _ack(self, handle: Any) -> None:
        from procrastinate.jobs import Status

        await self.manager.finish_job(handle, Status.SUCCEEDED, delete_job=False)

    def recover_stalled(self, seconds: float) -> None:
        """Its documented recipe: retry every job of a worker whose heartbeat is older."""
        self.run(self._recover(seconds))

    async def _recover(self, seconds: float) -> None:
        for job in await self.manager.get_stalled_jobs(seconds_since_heartbeat=seconds):
            await self.manager.retry_job(job)

    def settled(self) -> tuple[int, int] | None:
        rows = self.run(self._fetch(
            "SELECT count(*) FILTER (WHERE status = 'succeeded'), "
            "count(*) FILTER (WHERE status IN ('todo', 'doing')) FROM procrastinate_jobs"))
        return int(rows[0][0]), int(rows[0][1])

    def still_stored(self, event_id: str) -> bool:
        rows = self.run(self._fetch("SELECT count(*) FROM procrastinate_jobs WHERE "
                                    "status IN ('todo', 'doing') AND args->>'item' LIKE %s",
                                    f"%{event_id}%"))
        return bool(rows[0][0])


PG_PEERS: dict[str, type[Adapter]] = {a.name: a for a in (PgQueuer, Procrastinate)}
