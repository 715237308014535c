"""Projecting the log into PostgreSQL: each event in one transaction with its sequence."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

import asyncpg

from helmline.contracts import Event, SessionState
from helmline.runtime import Delivery, RetryableError, SessionCache
from helmline.state._readmodel import (
    APPROVAL_COLUMNS,
    CHECKPOINT_COLUMNS,
    EVERY_ROW,
    MIGRATIONS,
    SESSION_COLUMNS,
    STEP_COLUMNS,
    approval_rows,
    checkpoint_rows,
    session_row,
    step_rows,
    touched,
)

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

    async def apply(self, state: SessionState, event: Event, seq: int) -> bool:
        """Write the rows `event` changed, unless this sequence is already applied."""
        try:
            pool = await self._connected()
            async with pool.acquire() as connection, connection.transaction():
                return await self._apply(connection, state, event, seq)
        except UNAVAILABLE as error:
            # Drop every connection (they are dead or soon will be) and reconnect next time.
            if self._pool is not None:
                self._pool.terminate()
                self._pool = None
            raise RetryableError(f"read model unavailable: {error!r}") from error

    async def _apply(
        self, connection: Connection, state: SessionState, event: Event, seq: int
    ) -> bool:
        row = await connection.fetchrow(
            "SELECT last_seq, event_count FROM sessions"
            " WHERE tenant = $1 AND session_id = $2 FOR UPDATE",
            state.tenant,
            state.session_id,
        )
        if row is not None and row["last_seq"] >= seq:
            return False  # A redelivery: this event is in the rows already.
        # The rows are one event behind the state only if every earlier event was written in
        # order; after a retry or a redelivery they may not be, and then the whole session is
        # written again rather than the rows this event names.
        previous = row["event_count"] if row is not None else 0
        rows = touched(event.data) if previous == state.event_count - 1 else EVERY_ROW
        if rows.every_row:
            for table in ("steps", "approvals", "checkpoints"):
                await connection.execute(
                    f"DELETE FROM {table} WHERE tenant = $1 AND session_id = $2",
                    state.tenant,
                    state.session_id,
                )
        await _upsert(connection, "sessions", SESSION_COLUMNS, 2, [session_row(state, seq)])
        await _upsert(connection, "steps", STEP_COLUMNS, 3, step_rows(state, rows))
        await _upsert(connection, "approvals", APPROVAL_COLUMNS, 3, approval_rows(state, rows))
        await _upsert(
            connection, "checkpoints", CHECKPOINT_COLUMNS, 3, checkpoint_rows(state, rows)
        )
        return True

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None


async def _upsert(
    connection: Connection,
    table: str,
    columns: Sequence[str],
    key_columns: int,
    rows: list[tuple[Any, ...]],
) -> None:
    if not rows:
        return
    names = ", ".join(columns)
    values = ", ".join(f"${index}" for index in range(1, len(columns) + 1))
    keys = ", ".join(columns[:key_columns])
    updates = ", ".join(f"{name} = excluded.{name}" for name in columns[key_columns:])
    # Table and column names come from this module's constants, never from input.
    statement = (
        f"INSERT INTO {table} ({names}) VALUES ({values}) "
        f"ON CONFLICT ({keys}) DO UPDATE SET {updates}"
    )
    await connection.executemany(statement, rows)


class ProjectionHandler:
    """Folds every event of a session and writes the rows it changed."""

    def __init__(self, sessions: SessionCache, read_model: ReadModel) -> None:
        self._sessions = sessions
        self._read_model = read_model

    async def __call__(self, delivery: Delivery) -> None:
        state = await self._sessions.advance(delivery)
        await self._read_model.apply(state, delivery.event, delivery.seq)
