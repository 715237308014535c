"""The read model's tables, and the rows a session's state maps to. Pure."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any, TypeVar

from pydantic import TypeAdapter

from helmline.contracts import (
    EVERY_ROW,
    ApprovalState,
    CheckpointState,
    SessionState,
    StepState,
    Touched,
)

OPEN = "status NOT IN ('completed', 'failed', 'cancelled')"
"""A session that has not ended (written out as the partial index's predicate, which a
query must repeat to use it)."""

MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE sessions (
        tenant text NOT NULL,
        session_id text NOT NULL,
        status text NOT NULL,
        goal text NOT NULL,
        mode text NOT NULL,
        requested_by text,
        started_at timestamptz,
        ended_at timestamptz,
        updated_at timestamptz,
        steps_total integer NOT NULL,
        steps_succeeded integer NOT NULL,
        steps_failed integer NOT NULL,
        pending_approvals integer NOT NULL,
        checkpoints integer NOT NULL,
        outcome text NOT NULL,
        event_count integer NOT NULL,
        last_seq bigint NOT NULL,
        PRIMARY KEY (tenant, session_id)
    );
    CREATE INDEX sessions_by_status ON sessions (tenant, status, started_at);
    CREATE TABLE steps (
        tenant text NOT NULL,
        session_id text NOT NULL,
        step_id text NOT NULL,
        position integer NOT NULL,
        tool text NOT NULL,
        status text NOT NULL,
        risk text,
        attempts integer NOT NULL,
        call_id text,
        output jsonb,
        error jsonb,
        reason text,
        scheduled_at timestamptz,
        finished_at timestamptz,
        duration_ms double precision,
        PRIMARY KEY (tenant, session_id, step_id)
    );
    CREATE TABLE approvals (
        tenant text NOT NULL,
        session_id text NOT NULL,
        request_id text NOT NULL,
        step_id text,
        tool text,
        risk text NOT NULL,
        status text NOT NULL,
        reason text NOT NULL,
        expires_at timestamptz NOT NULL,
        decided_by jsonb NOT NULL,
        decided_at timestamptz,
        PRIMARY KEY (tenant, session_id, request_id)
    );
    CREATE INDEX approvals_pending ON approvals (tenant, status, expires_at);
    CREATE TABLE checkpoints (
        tenant text NOT NULL,
        session_id text NOT NULL,
        checkpoint_id text NOT NULL,
        step_id text NOT NULL,
        at_seq bigint NOT NULL,
        reversible boolean NOT NULL,
        compensation text,
        created_at timestamptz NOT NULL,
        PRIMARY KEY (tenant, session_id, checkpoint_id)
    );
    """,
    # 2: what a session's model calls cost.
    """
    ALTER TABLE sessions
        ADD COLUMN model_calls integer NOT NULL DEFAULT 0,
        ADD COLUMN tokens_used bigint NOT NULL DEFAULT 0,
        ADD COLUMN cost_usd double precision NOT NULL DEFAULT 0;
    """,
    # 3: when a step whose call failed is tried again, if not at once.
    """
    ALTER TABLE steps ADD COLUMN retry_at timestamptz;
    """,
    # 4: the sessions not ended yet, counted every few seconds across tenants.
    f"""
    CREATE INDEX sessions_open ON sessions (status) WHERE {OPEN};
    """,
    # 5: the requests waiting for a person, counted likewise, with the oldest's age (a
    # request's time asked is filled at its session's next event).
    """
    ALTER TABLE approvals ADD COLUMN requested_at timestamptz;
    CREATE INDEX approvals_waiting ON approvals (requested_at) WHERE status = 'pending';
    """,
)
"""Schema versions in order; version N is MIGRATIONS[N - 1]. Never edit one that shipped."""

SESSION_COLUMNS = (
    "tenant",
    "session_id",
    "status",
    "goal",
    "mode",
    "requested_by",
    "started_at",
    "ended_at",
    "updated_at",
    "steps_total",
    "steps_succeeded",
    "steps_failed",
    "pending_approvals",
    "checkpoints",
    "outcome",
    "model_calls",
    "tokens_used",
    "cost_usd",
    "event_count",
    "last_seq",
)
STEP_COLUMNS = (
    "tenant",
    "session_id",
    "step_id",
    "position",
    "tool",
    "status",
    "risk",
    "attempts",
    "call_id",
    "output",
    "error",
    "reason",
    "scheduled_at",
    "finished_at",
    "duration_ms",
    "retry_at",
)
APPROVAL_COLUMNS = (
    "tenant",
    "session_id",
    "request_id",
    "step_id",
    "tool",
    "risk",
    "status",
    "reason",
    "expires_at",
    "decided_by",
    "decided_at",
    "requested_at",
)
CHECKPOINT_COLUMNS = (
    "tenant",
    "session_id",
    "checkpoint_id",
    "step_id",
    "at_seq",
    "reversible",
    "compensation",
    "created_at",
)

TABLE_COLUMNS: dict[str, tuple[str, ...]] = {
    "sessions": SESSION_COLUMNS,
    "steps": STEP_COLUMNS,
    "approvals": APPROVAL_COLUMNS,
    "checkpoints": CHECKPOINT_COLUMNS,
}
"""The projected tables (not `schema_migrations`) and their columns; each is keyed by
tenant and session id first."""

JSON_COLUMNS = frozenset({"output", "error", "decided_by"})
"""Columns of type jsonb."""

_json_value: TypeAdapter[Any] = TypeAdapter(Any)
T = TypeVar("T")


def session_row(state: SessionState, last_seq: int) -> tuple[Any, ...]:
    steps = state.steps.values()
    return (
        state.tenant,
        state.session_id,
        state.status,
        state.goal,
        state.mode,
        state.requested_by.id if state.requested_by else None,
        state.started_at,
        state.ended_at,
        state.updated_at,
        len(state.steps),
        sum(s.status == "succeeded" for s in steps),
        sum(s.status == "failed" for s in steps),
        len(state.pending_approvals),
        len(state.checkpoints),
        state.outcome,
        state.model_calls,
        state.tokens_used,
        state.cost_usd,
        state.event_count,
        last_seq,
    )


def session_rows(state: SessionState, last_seq: int) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of a session, by table."""
    return {
        "sessions": [session_row(state, last_seq)],
        "steps": step_rows(state, EVERY_ROW),
        "approvals": approval_rows(state, EVERY_ROW),
        "checkpoints": checkpoint_rows(state, EVERY_ROW),
    }


def step_rows(state: SessionState, touched_rows: Touched) -> list[tuple[Any, ...]]:
    wanted = set(touched_rows.steps)
    return [
        _step_row(state, position, step)
        for position, step in enumerate(state.steps.values())
        if touched_rows.every_row or step.id in wanted
    ]


def _step_row(state: SessionState, position: int, step: StepState) -> tuple[Any, ...]:
    return (
        state.tenant,
        state.session_id,
        step.id,
        position,
        step.tool,
        step.status,
        step.risk,
        step.attempts,
        step.call_id,
        _json(step.output),
        _json(step.error.model_dump(mode="json")) if step.error else None,
        step.reason,
        step.scheduled_at,
        step.finished_at,
        step.duration_ms,
        step.retry_at,
    )


def approval_rows(state: SessionState, touched_rows: Touched) -> list[tuple[Any, ...]]:
    return [
        _approval_row(state, approval)
        for approval in _selected(
            state.approvals.values(),
            touched_rows.approvals,
            touched_rows.every_row,
            key=lambda a: a.request_id,
        )
    ]


def _approval_row(state: SessionState, approval: ApprovalState) -> tuple[Any, ...]:
    decided_by = [actor.model_dump(mode="json") for actor in approval.decided_by]
    return (
        state.tenant,
        state.session_id,
        approval.request_id,
        approval.step_id,
        approval.tool,
        approval.risk,
        approval.status,
        approval.reason,
        approval.expires_at,
        json.dumps(decided_by),
        approval.decided_at,
        approval.requested_at,
    )


def checkpoint_rows(state: SessionState, touched_rows: Touched) -> list[tuple[Any, ...]]:
    return [
        _checkpoint_row(state, checkpoint)
        for checkpoint in _selected(
            state.checkpoints,
            touched_rows.checkpoints,
            touched_rows.every_row,
            key=lambda c: c.checkpoint_id,
        )
    ]


def _checkpoint_row(state: SessionState, checkpoint: CheckpointState) -> tuple[Any, ...]:
    return (
        state.tenant,
        state.session_id,
        checkpoint.checkpoint_id,
        checkpoint.step_id,
        checkpoint.at_seq,
        checkpoint.reversible,
        checkpoint.compensation,
        checkpoint.created_at,
    )


def _selected(items: Iterable[T], ids: tuple[str, ...], every: bool, key: Any) -> list[T]:
    wanted = set(ids)
    return [item for item in items if every or key(item) in wanted]


def _json(value: Any) -> str | None:
    return None if value is None else _json_value.dump_json(value).decode()
