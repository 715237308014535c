"""Session commands' work on the log: start, find, decide, steer, list and watch sessions.

Every answer is folded from the log right here; the CLI keeps nothing of its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Literal

from helmline.cli._connection import EventLog
from helmline.cli._errors import CliError
from helmline.cli._follow import following, session_ids
from helmline.cli._intents import (
    Control,
    control_requested,
    current_actor,
    decision_submitted,
    new_session_id,
    session_started,
)
from helmline.contracts import ApprovalState, Playbook, SessionFold, SessionState
from helmline.runtime import SessionSnapshot

EXIT_CODES: dict[str, int] = {"completed": 0, "failed": 1, "cancelled": 2, "waiting": 3}
"""How `run --wait` ends: by the session's status when it stopped being followed."""

# Folding many sessions at once for `sessions`: enough to overlap round trips, few enough
# to leave the 2-core development machine to the stack.
CONCURRENT_LOADS = 8


async def start_session(log: EventLog, playbook: Playbook, *, tenant: str) -> tuple[str, int]:
    """Append `session.started` for a new session; its id and the event's sequence."""
    session_id = new_session_id()
    event = session_started(playbook, tenant=tenant, session_id=session_id, actor=current_actor())
    # A new id has no events, so expecting none only guards against an id collision.
    appended = await log.store.append(event, expected_last_seq=0)
    return session_id, appended.seq


async def load_session(
    log: EventLog, tenant: str, session_id: str, *, up_to_seq: int | None = None
) -> SessionSnapshot:
    """The session folded from its log (up to a sequence); an error if it has no events."""
    snapshot = await log.store.load(tenant, session_id, up_to_seq=up_to_seq)
    if snapshot.last_seq == 0:
        where = f" at or before sequence {up_to_seq}" if up_to_seq is not None else ""
        raise CliError(f"no session {session_id} in tenant {tenant!r}{where}")
    return snapshot


async def decide(
    log: EventLog,
    tenant: str,
    session_id: str,
    *,
    decision: Literal["grant", "deny"],
    request_id: str | None,
    every: bool,
    comment: str,
) -> tuple[ApprovalState, ...]:
    """Submit the decision on the chosen pending requests; the requests decided on."""
    state = (await load_session(log, tenant, session_id)).state
    chosen = _choose_requests(state, request_id=request_id, every=every)
    actor = current_actor()
    for request in chosen:
        await log.store.append(
            decision_submitted(
                tenant=tenant,
                session_id=session_id,
                request_id=request.request_id,
                decision=decision,
                actor=actor,
                comment=comment,
            )
        )
    return chosen


def _choose_requests(
    state: SessionState, *, request_id: str | None, every: bool
) -> tuple[ApprovalState, ...]:
    pending = state.pending_approvals
    listed = ", ".join(request.request_id for request in pending)
    if request_id is not None:
        request = state.approvals.get(request_id)
        if request is None:
            known = f"; pending: {listed}" if pending else ""
            raise CliError(
                f"session {state.session_id} has no approval request {request_id}{known}"
            )
        if request.status != "pending":
            raise CliError(f"approval request {request_id} is already {request.status}")
        return (request,)
    if not pending:
        raise CliError(f"session {state.session_id} has no pending approval request")
    if len(pending) > 1 and not every:
        raise CliError(
            f"session {state.session_id} has {len(pending)} pending approval requests "
            f"({listed}): choose one with --request, or decide all with --all"
        )
    return pending


async def request_control(
    log: EventLog, control: Control, tenant: str, session_id: str, *, reason: str
) -> SessionState:
    """Append a pause, resume or cancel request; the session as it was before it."""
    state = (await load_session(log, tenant, session_id)).state
    if state.is_terminal:
        raise CliError(f"session {session_id} has already ended: {state.status}")
    event = control_requested(
        control, tenant=tenant, session_id=session_id, actor=current_actor(), reason=reason
    )
    await log.store.append(event)
    return state


async def list_sessions(log: EventLog, tenant: str) -> list[SessionState]:
    """Every session of the tenant, oldest first, each folded from its log."""
    limit = asyncio.Semaphore(CONCURRENT_LOADS)

    async def load(session_id: str) -> SessionState:
        async with limit:
            return (await log.store.load(tenant, session_id)).state

    ids = await session_ids(log.js, tenant)
    return list(await asyncio.gather(*(load(session_id) for session_id in ids)))


def needs_a_person(state: SessionState) -> bool:
    return state.status == "waiting" and bool(state.pending_approvals)


async def watch(
    log: EventLog,
    tenant: str,
    session_id: str,
    *,
    on_change: Callable[[SessionState], None],
) -> SessionState:
    """Follow the session until it ends or waits for a person; the state it stopped at."""
    folding = SessionFold()
    last_seq = 0
    for stored in await log.store.read_all(tenant, session_id):
        folding.apply(stored.event)
        last_seq = stored.seq
    state = folding.state()
    on_change(state)
    if state.is_terminal or needs_a_person(state):
        return state
    async with following(log.js, tenant, session_id, after_seq=last_seq) as events:
        async for stored in events:
            folding.apply(stored.event)
            state = folding.state()
            on_change(state)
            if state.is_terminal or needs_a_person(state):
                break
    return state
