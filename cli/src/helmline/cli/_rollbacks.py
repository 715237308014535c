"""Rollback and fork on the log: choose a checkpoint, ask for the rollback and follow it to
its end, start a fork. The state service and the sandbox do the work; this only asks."""

from __future__ import annotations

import uuid

from helmline.cli._connection import EventLog
from helmline.cli._errors import CliError
from helmline.cli._intents import SOURCE, current_actor, new_session_id
from helmline.cli._sessions import fold_until, load_session
from helmline.contracts import (
    CheckpointState,
    ForkOrigin,
    RollbackRequested,
    RollbackState,
    SessionStarted,
    SessionState,
    new_event,
)


def choose_checkpoint(
    state: SessionState, *, to: str | None, to_step: str | None
) -> CheckpointState:
    """The checkpoint named by id or number (`--to`), or the latest after a step (`--to-step`)."""
    if (to is None) == (to_step is None):
        raise CliError("give either --to CHECKPOINT or --to-step STEP_ID", exit_code=2)
    checkpoints = state.checkpoints
    if to is not None:
        for checkpoint in checkpoints:
            if checkpoint.checkpoint_id == to:
                return checkpoint
        if to.isdigit() and 1 <= int(to) <= len(checkpoints):
            return checkpoints[int(to) - 1]
        raise CliError(
            f"session {state.session_id} has no checkpoint {to!r} (it has {len(checkpoints)}: "
            "see `helmline checkpoints`)",
            exit_code=2,
        )
    after_step = [c for c in checkpoints if c.step_id == to_step]
    if not after_step:
        raise CliError(
            f"session {state.session_id} has no checkpoint after step {to_step!r}", exit_code=2
        )
    return after_step[-1]


def latest_checkpoint(state: SessionState) -> CheckpointState:
    """The session's latest checkpoint: where a retry of what failed after it starts."""
    if not state.checkpoints:
        raise CliError(
            f"session {state.session_id} has no checkpoint yet: start its playbook again "
            "with `helmline run`",
            exit_code=2,
        )
    return state.checkpoints[-1]


def forkable(state: SessionState, checkpoint: CheckpointState) -> CheckpointState:
    """The checkpoint, if a fork can start from its workspace."""
    refusal = state.fork_refusal(checkpoint)
    if refusal is not None:
        raise CliError(refusal, exit_code=1)
    return checkpoint


async def request_rollback(
    log: EventLog,
    tenant: str,
    session_id: str,
    checkpoint: CheckpointState,
    *,
    accept_partial: bool,
    reason: str,
) -> str:
    """Append `rollback.requested`; the rollback's id."""
    rollback_id = f"rb-{uuid.uuid4().hex[:12]}"
    requested = RollbackRequested(
        rollback_id=rollback_id,
        checkpoint_id=checkpoint.checkpoint_id,
        requested_by=current_actor(),
        accept_partial=accept_partial,
        reason=reason,
    )
    await log.store.append(
        new_event(requested, tenant=tenant, session_id=session_id, source=SOURCE)
    )
    return rollback_id


async def follow_rollback(
    log: EventLog, tenant: str, session_id: str, rollback_id: str
) -> tuple[RollbackState, SessionState]:
    """Follow the session until the rollback ends, or waits for a person to approve an undo
    call; the rollback and the session as they stood then."""
    state = await fold_until(log, tenant, session_id, lambda state: _settled(state, rollback_id))
    return state.rollbacks[rollback_id], state


def _settled(state: SessionState, rollback_id: str) -> bool:
    rollback = state.rollbacks.get(rollback_id)
    if rollback is None:
        return False
    # A completed session stays completed while it is rolled back: a pending approval of
    # one of the rollback's undo calls (each runs as the call of its compensation), not the
    # session's status, tells that the rollback waits for a person. Requests of the plan's
    # own steps do not: under those the rollback is refused.
    return not rollback.active or any(
        request.call_id in rollback.compensations for request in state.pending_approvals
    )


async def start_fork(
    log: EventLog, tenant: str, session_id: str, checkpoint: CheckpointState
) -> str:
    """Start a session that begins where `session_id` stood at `checkpoint`; its id."""
    origin = (await log.store.read_all(tenant, session_id, up_to_seq=checkpoint.at_seq))[0].event
    if not isinstance(origin.data, SessionStarted):
        raise CliError(f"session {session_id} does not begin with session.started")
    then = (await load_session(log, tenant, session_id, up_to_seq=checkpoint.at_seq)).state
    started = origin.data.model_copy(
        update={
            "requested_by": current_actor(),
            "fork_of": ForkOrigin(
                session_id=session_id,
                at_seq=checkpoint.at_seq,
                checkpoint_id=checkpoint.checkpoint_id,
                snapshot_id=checkpoint.snapshot_id,
                completed_steps=tuple(s.id for s in then.steps.values() if s.status == "succeeded"),
            ),
        }
    )
    fork_id = new_session_id()
    event = new_event(started, tenant=tenant, session_id=fork_id, source=SOURCE)
    await log.store.append(event, expected_last_seq=0)
    return fork_id
