"""Answers about sessions: one session folded from its log, many from the read model.

A session's state (now or after any sequence) is always the fold of its log, exactly what
`helmline show` prints. Lists across sessions read the state service's PostgreSQL read model
(read-only connections; docs/read-model.md) and, where there is none, fold each session.
This module is the API's only reader of the read model; its tables and columns are
helmline.readmodel's, the declarations the state service writes them by.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime
from typing import Any

import asyncpg
from pydantic import BaseModel

from helmline.api._problems import not_found
from helmline.contracts import SessionStarted, SessionState, SessionStatus, event_type_filter
from helmline.readmodel import APPROVALS, SESSIONS
from helmline.runtime import EventStore, FoldedStates, SessionSnapshot

logger = logging.getLogger(__name__)

# Folding many sessions at once when there is no read model: enough to overlap round trips,
# few enough to leave the machine to the rest of the stack.
CONCURRENT_LOADS = 8


class WaitingFor(BaseModel):
    """A pending approval request a session waits for."""

    request_id: str
    step_id: str | None
    tool: str | None
    risk: str


class SessionSummary(BaseModel):
    """One line of the session list."""

    session_id: str
    status: SessionStatus
    goal: str
    mode: str
    requested_by: str | None
    started_at: datetime | None
    updated_at: datetime | None
    ended_at: datetime | None
    steps_total: int
    steps_succeeded: int
    steps_failed: int
    outcome: str
    waiting_for: list[WaitingFor]
    """Pending approval requests, oldest first."""
    last_seq: int
    """Stream sequence of the session's last event this line reflects. The list is read from
    a projection that may trail the live event stream: a client that heard an event later
    than this knows the line is behind, and reads again."""


class SessionFilter(BaseModel):
    status: list[SessionStatus] = []
    waiting: bool | None = None
    """Only sessions with (True) or without (False) a pending approval."""
    ended_after: datetime | None = None
    """Only sessions that ended at or after this time (the fleet's "failed in the last
    hour")."""
    limit: int = 100
    offset: int = 0


async def load_session(
    states: FoldedStates, tenant: str, session_id: str, *, at_seq: int | None = None
) -> SessionSnapshot:
    """The session folded from its log (up to a sequence); 404 when it has no events there."""
    snapshot = await states.load(tenant, session_id, up_to_seq=at_seq)
    if snapshot.last_seq == 0:
        where = f" at or before sequence {at_seq}" if at_seq is not None else ""
        raise not_found(f"no session {session_id}{where}")
    return snapshot


def summary_of(state: SessionState, last_seq: int) -> SessionSummary:
    steps = state.steps.values()
    return SessionSummary(
        session_id=state.session_id,
        status=state.status,
        goal=state.goal,
        mode=state.mode,
        requested_by=state.requested_by.id if state.requested_by else None,
        started_at=state.started_at,
        updated_at=state.updated_at,
        ended_at=state.ended_at,
        steps_total=len(state.steps),
        steps_succeeded=sum(1 for step in steps if step.status == "succeeded"),
        steps_failed=sum(1 for step in steps if step.status == "failed"),
        outcome=state.outcome,
        waiting_for=[
            WaitingFor(request_id=a.request_id, step_id=a.step_id, tool=a.tool, risk=a.risk)
            for a in state.pending_approvals
        ],
        last_seq=last_seq,
    )


class SessionLister:
    """Lists a tenant's sessions from the read model, or by folding when there is none."""

    def __init__(self, store: EventStore, database_url: str | None) -> None:
        self._store = store
        self._database_url = database_url
        self._pool: asyncpg.Pool[Any] | None = None
        self._lock = asyncio.Lock()

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()

    async def sessions(self, tenant: str, query: SessionFilter) -> list[SessionSummary]:
        pool = await self.connected()
        if pool is not None:
            try:
                return await _from_read_model(pool, tenant, query)
            except (asyncpg.UndefinedTableError, asyncpg.UndefinedColumnError) as error:
                # The state service migrates at its first write; until then, fold.
                logger.info("read model not ready (%s); folding the log instead", error)
        return await self._folded(tenant, query)

    async def connected(self) -> asyncpg.Pool[Any] | None:
        """The read model's connection pool (made on first use); None without one."""
        if self._database_url is None:
            return None
        async with self._lock:
            if self._pool is None:
                self._pool = await asyncpg.create_pool(
                    self._database_url,
                    min_size=0,
                    max_size=4,
                    # The read model belongs to the state service: this side only reads.
                    server_settings={"default_transaction_read_only": "on"},
                )
            return self._pool

    async def _folded(self, tenant: str, query: SessionFilter) -> list[SessionSummary]:
        started = await self._store.read_matching(event_type_filter(SessionStarted.TYPE, tenant))
        ids = list(dict.fromkeys(stored.event.session_id for stored in started))
        limit = asyncio.Semaphore(CONCURRENT_LOADS)

        async def load(session_id: str) -> tuple[SessionState, int]:
            async with limit:
                loaded = await self._store.load(tenant, session_id)
                return loaded.state, loaded.last_seq

        states = await asyncio.gather(*(load(session_id) for session_id in ids))
        chosen = [
            summary_of(state, last_seq)
            for state, last_seq in reversed(states)
            if (not query.status or state.status in query.status)
            and (query.waiting is None or bool(state.pending_approvals) == query.waiting)
            and (
                query.ended_after is None
                or (state.ended_at is not None and state.ended_at >= query.ended_after)
            )
        ]
        return chosen[query.offset : query.offset + query.limit]


SUMMARY_COLUMNS = tuple(name for name in SessionSummary.model_fields if name != "waiting_for")
"""A summary's fields but its requests: columns of `sessions` of the same names."""
PENDING_COLUMNS = ("session_id", *WaitingFor.model_fields)
"""Which session is waiting, and the request's fields: columns of `approvals`."""

# The SELECT lists fail at import if a field is not a column of its table.
SESSIONS_QUERY = f"""
SELECT {SESSIONS.listing(SUMMARY_COLUMNS)}
FROM {SESSIONS.name}
WHERE tenant = $1
  AND (cardinality($2::text[]) = 0 OR status = ANY($2::text[]))
  AND ($3::boolean IS NULL OR (pending_approvals > 0) = $3)
  AND ($6::timestamptz IS NULL OR ended_at >= $6)
ORDER BY started_at DESC NULLS LAST, session_id
LIMIT $4 OFFSET $5
"""

PENDING_QUERY = f"""
SELECT {APPROVALS.listing(PENDING_COLUMNS)}
FROM {APPROVALS.name}
WHERE tenant = $1 AND session_id = ANY($2::text[]) AND status = 'pending'
ORDER BY expires_at
"""


async def _from_read_model(
    pool: asyncpg.Pool[Any], tenant: str, query: SessionFilter
) -> list[SessionSummary]:
    async with pool.acquire() as connection:
        rows = await connection.fetch(
            SESSIONS_QUERY,
            tenant,
            list(query.status),
            query.waiting,
            query.limit,
            query.offset,
            query.ended_after,
        )
        ids = [row["session_id"] for row in rows]
        pending = await connection.fetch(PENDING_QUERY, tenant, ids) if ids else []
    waiting: dict[str, list[WaitingFor]] = {}
    for row in pending:
        request = dict(row)
        waiting.setdefault(request.pop("session_id"), []).append(WaitingFor(**request))
    return [
        SessionSummary(**dict(row), waiting_for=waiting.get(row["session_id"], [])) for row in rows
    ]
