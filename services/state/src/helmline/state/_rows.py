"""The rows a session's state maps to, in the read model's tables (helmline.readmodel): each
row's values in its table's column order. Pure."""

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
from helmline.readmodel import APPROVALS, CHECKPOINTS, SESSIONS, STEPS

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
    """Every row of a session, by table name."""
    return {
        SESSIONS.name: [session_row(state, last_seq)],
        STEPS.name: step_rows(state, EVERY_ROW),
        APPROVALS.name: approval_rows(state, EVERY_ROW),
        CHECKPOINTS.name: checkpoint_rows(state, EVERY_ROW),
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
