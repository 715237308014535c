"""Projecting the log into PostgreSQL: the events gathered in a few milliseconds in one
transaction, each session's rows with the sequence of its newest event."""

from __future__ import annotations

import asyncio
import functools
import logging
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from helmline.contracts import EVERY_ROW, Event, SessionState, Touched, touched
from helmline.readmodel import (
    APPROVALS,
    CHECKPOINTS,
    MIGRATIONS,
    OPEN,
    SESSIONS,
    STEPS,
    Table,
)
from helmline.runtime import Delivery, RetryableError, SessionCache
from helmline.state._rows import approval_rows, checkpoint_rows, session_row, step_rows

logger = logging.getLogger(__name__)
Connection = asyncpg.Connection | asyncpg.pool.PoolConnectionProxy

# Errors that mean "PostgreSQL is not there right now": retry later, lose nothing.
UNAVAILABLE = (
    OSError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    # Class 57: the server is shutting down, starting up, or an administrator intervened.
    asyncpg.exceptions.OperatorInterventionError,
)


async def migrate(connection: Connection) -> None:
    """Bring the read model's tables in the connection's schema up to the newest version."""
    async with connection.transaction():
        # One migrator at a time, whichever replica (or rebuild) gets here first.
        await connection.execute("SELECT pg_advisory_xact_lock(7240531)")
        await connection.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations (version integer PRIMARY KEY)"
        )
        done = await connection.fetchval("SELECT coalesce(max(version), 0) FROM schema_migrations")
        for version, statement in enumerate(MIGRATIONS, start=1):
            if version > done:
                await connection.execute(statement)
                await connection.execute(
                    "INSERT INTO schema_migrations (version) VALUES ($1)", version
                )


class ReadModel:
    """The read model's database: schema migrations and per-event upserts."""

    def __init__(self, database_url: str) -> None:
        self._url = database_url
        self._pool: asyncpg.Pool | None = None
        # Sessions are projected concurrently: the first writers must share one pool.
        self._connecting = asyncio.Lock()

    async def _connected(self) -> asyncpg.Pool:
        async with self._connecting:
            return self._pool or await self._connect()

    async def _connect(self) -> asyncpg.Pool:
        pool = await asyncpg.create_pool(self._url, min_size=0, max_size=4)
        try:
            async with pool.acquire() as connection:
                await migrate(connection)
        except BaseException:
            pool.terminate()
            raise
        self._pool = pool
        return pool

    async def apply(self, changes: Sequence[Projected]) -> int:
        """Write the rows that sessions' new events changed, in one transaction; how many
        sessions were written (a session whose rows hold these events already is not)."""
        try:
            pool = await self._connected()
            async with pool.acquire() as connection, connection.transaction():
                return await self._apply(connection, changes)
        except UNAVAILABLE as error:
            # Drop every connection (they are dead or soon will be) and reconnect next time.
            if self._pool is not None:
                self._pool.terminate()
                self._pool = None
            raise RetryableError(f"read model unavailable: {error!r}") from error

    async def _apply(self, connection: Connection, changes: Sequence[Projected]) -> int:
        sessions = ([c.state.tenant for c in changes], [c.state.session_id for c in changes])
        # Locked in one order, so that two replicas writing the same sessions cannot deadlock.
        written = {
            (row["tenant"], row["session_id"]): row
            for row in await connection.fetch(
                f"SELECT tenant, session_id, last_seq, event_count FROM {SESSIONS.name}"
                f" WHERE {_ANY_SESSION} ORDER BY tenant, session_id FOR UPDATE",
                *sessions,
            )
        }
        due: list[tuple[Projected, Touched]] = []
        for change in changes:
            row = written.get((change.state.tenant, change.state.session_id))
            if row is not None and row["last_seq"] >= change.last_seq:
                continue  # A redelivery: these events are in the rows already.
            # The rows are just these events behind the state only if every earlier event was
            # written in order; after a retry or a redelivery they may not be, and then the
            # whole session is written again rather than the rows these events name.
            previous = row["event_count"] if row is not None else 0
            behind = change.state.event_count - change.events
            due.append((change, change.rows if previous == behind else EVERY_ROW))
        rewritten = [c.state for c, rows in due if rows.every_row]
        if rewritten:
            for table in (STEPS, APPROVALS, CHECKPOINTS):
                await connection.execute(
                    f"DELETE FROM {table.name} WHERE {_ANY_SESSION}",
                    [state.tenant for state in rewritten],
                    [state.session_id for state in rewritten],
                )
        tables = ((STEPS, step_rows), (APPROVALS, approval_rows), (CHECKPOINTS, checkpoint_rows))
        await _upsert(connection, SESSIONS, [session_row(c.state, c.last_seq) for c, _ in due])
        for table, rows_of in tables:
            rows = [
                row for change, touched_rows in due for row in rows_of(change.state, touched_rows)
            ]
            await _upsert(connection, table, rows)
        return len(due)

    async def waiting(self) -> Waiting:
        """What every tenant has not finished: sessions not ended, approval requests
        waiting for a person."""
        pool = await self._connected()
        async with pool.acquire() as connection:
            sessions = await connection.fetch(
                f"SELECT status, count(*) AS sessions FROM {SESSIONS.name} WHERE {OPEN}"
                " GROUP BY status"
            )
            approvals = await connection.fetchrow(
                f"SELECT count(*) AS waiting, min(requested_at) AS oldest FROM {APPROVALS.name}"
                " WHERE status = 'pending'"
            )
        assert approvals is not None  # An aggregate without GROUP BY is one row.
        return Waiting(
            sessions={row["status"]: row["sessions"] for row in sessions},
            approvals=approvals["waiting"],
            oldest_approval_at=approvals["oldest"],
        )

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None


async def _upsert(connection: Connection, table: Table, rows: list[tuple[Any, ...]]) -> None:
    if not rows:
        return
    columns = table.columns
    names = ", ".join(columns)
    values = ", ".join(f"${index}" for index in range(1, len(columns) + 1))
    keys = ", ".join(table.key)
    updates = ", ".join(f"{name} = excluded.{name}" for name in columns[len(table.key) :])
    # Table and column names come from the read model's declarations, never from input.
    statement = (
        f"INSERT INTO {table.name} ({names}) VALUES ({values}) "
        f"ON CONFLICT ({keys}) DO UPDATE SET {updates}"
    )
    await connection.executemany(statement, rows)


_ANY_SESSION = "(tenant, session_id) IN (SELECT * FROM unnest($1::text[], $2::text[]))"
"""Rows of the sessions named by two arrays: tenants, and their session ids."""


@dataclass(frozen=True, slots=True)
class Waiting:
    """What the whole stack has not finished, as the read model says."""

    sessions: dict[str, int]
    """Sessions not ended, by status (a status no session is in is left out)."""
    approvals: int
    """Approval requests waiting for a person."""
    oldest_approval_at: datetime | None
    """When the oldest of them was made (None: none is waiting, or only requests written
    before the read model kept that time)."""


@dataclass(frozen=True, slots=True)
class Projected:
    """A session folded through some more of its events, to be written."""

    state: SessionState
    """The state after them."""
    rows: Touched
    """The rows they changed."""
    events: int
    """How many they are."""
    last_seq: int
    """The stream sequence of the last."""


class ProjectionHandler:
    """Folds every event of a session and writes the rows they changed; events gather for
    a few milliseconds, so that many are written in one transaction."""

    def __init__(self, sessions: SessionCache, read_model: ReadModel) -> None:
        self._sessions = sessions
        self._read_model = read_model

    async def __call__(self, delivery: Delivery) -> None:
        await self.handle_gathered([delivery])

    def may_wait(self, event: Event) -> bool:
        """Every event: the read model is a projection, never on a session's path."""
        return True

    async def handle_gathered(self, deliveries: Sequence[Delivery]) -> None:
        """Fold each session through its events, then write them all in one transaction."""
        by_session: dict[tuple[str, str], list[Delivery]] = {}
        for delivery in deliveries:
            by_session.setdefault((delivery.event.tenant, delivery.event.session_id), []).append(
                delivery
            )
        try:
            changes = [
                Projected(
                    await self._sessions.advance_through(mine),
                    functools.reduce(operator.or_, (touched(d.event.data) for d in mine)),
                    len(mine),
                    # Redeliveries come back in any order among new events.
                    max(d.seq for d in mine),
                )
                for mine in by_session.values()
            ]
            await self._read_model.apply(changes)
        except BaseException:
            # Handled again one by one, each event must meet the state just before it.
            for tenant, session_id in by_session:
                self._sessions.forget(tenant, session_id)
            raise
