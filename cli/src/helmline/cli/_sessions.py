"""Session commands' work on the log: start, find, decide, steer, list and watch sessions.

Every answer is folded from the log right here; the CLI keeps nothing of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from helmline.cli._connection import EventLog
from helmline.cli._errors import CliError
from helmline.cli._follow import following, session_ids
from helmline.cli._intents import (
    Control,
    Goal,
    PermissionGrant,
    StandingGrant,
    control_requested,
    current_actor,
    decision_submitted,
    new_session_id,
    session_started,
)
from helmline.contracts import (
    Actor,
    ApprovalDecisionRefused,
    ApprovalDenied,
    ApprovalGranted,
    ApprovalState,
    ApprovalVoteCounted,
    Playbook,
    RollbackCompleted,
    SessionCancelled,
    SessionCompleted,
    SessionFailed,
    SessionFold,
    SessionState,
)
from helmline.runtime import FoldedStates, SessionSnapshot, StoredEvent

EXIT_CODES: dict[str, int] = {"completed": 0, "failed": 1, "cancelled": 2, "waiting": 3}
"""How `run --wait` ends: by the session's status when it stopped being followed."""

# Folding many sessions at once for `sessions`: enough to overlap round trips, few enough
# to leave the 2-core development machine to the stack.
CONCURRENT_LOADS = 8


async def start_session(
    log: EventLog, plan: Playbook | Goal, *, tenant: str, actor: Actor | None = None
) -> tuple[str, int]:
    """Append `session.started` for a new session, requested by `actor` (or the person at
    the terminal); its id and the event's sequence."""
    session_id = new_session_id()
    requester = actor or current_actor()
    event = session_started(plan, tenant=tenant, session_id=session_id, actor=requester)
    # A new id has no events, so expecting none only guards against an id collision.
    appended = await log.store.append(event, expected_last_seq=0)
    return session_id, appended.seq


async def load_session(
    log: EventLog, tenant: str, session_id: str, *, up_to_seq: int | None = None
) -> SessionSnapshot:
    """The session folded from its log (up to a sequence); an error if it has no events."""
    # Folded states the state service stored spare replaying a long session from the start.
    snapshot = await FoldedStates(log.js, log.store).load(tenant, session_id, up_to_seq=up_to_seq)
    if snapshot.last_seq == 0:
        where = f" at or before sequence {up_to_seq}" if up_to_seq is not None else ""
        raise CliError(f"no session {session_id} in tenant {tenant!r}{where}")
    return snapshot


ANSWER_TIMEOUT_S = 10.0
"""How long `approve`/`deny` wait for the approval service to answer a decision."""

Answer = ApprovalGranted | ApprovalDenied | ApprovalDecisionRefused | ApprovalVoteCounted


@dataclass(frozen=True, slots=True)
class Decided:
    """A decision submitted on one request, and the approval service's answer to it."""

    request: ApprovalState
    answer: Answer | None
    """None when the service did not answer in time (the decision stays in the log)."""


async def decide(
    log: EventLog,
    tenant: str,
    session_id: str,
    *,
    decision: Literal["grant", "deny"],
    request_id: str | None,
    every: bool,
    comment: str,
    actor: Actor,
    arguments: ArgumentChange | None = None,
    similar: StandingGrant | None = None,
    grant: PermissionGrant | None = None,
    wait_s: float = ANSWER_TIMEOUT_S,
) -> list[Decided]:
    """Submit the decision on the chosen pending requests and wait up to `wait_s` for each
    answer.

    The approval service answers every decision with an event caused by it: granted,
    denied, counted towards a quorum, or refused with the reason.
    """
    snapshot = await load_session(log, tenant, session_id)
    chosen = _choose_requests(snapshot.state, request_id=request_id, every=every)
    _check_kinds(chosen, arguments=arguments, similar=similar, grant=grant)
    submitted: dict[uuid.UUID, ApprovalState] = {}
    for request in chosen:
        event = decision_submitted(
            tenant=tenant,
            session_id=session_id,
            request_id=request.request_id,
            decision=decision,
            actor=actor,
            comment=comment,
            modified_arguments=arguments.applied_to(request) if arguments else None,
            similar=similar,
            grant=grant,
        )
        await log.store.append(event)
        submitted[event.id] = request
    answers: dict[uuid.UUID, Answer] = {}
    if wait_s <= 0:
        return [Decided(request, None) for request in submitted.values()]
    with contextlib.suppress(TimeoutError):
        async with (
            asyncio.timeout(wait_s),
            following(log.js, tenant, session_id, after_seq=snapshot.last_seq) as events,
        ):
            async for stored in events:
                cause = stored.event.causation_id
                if cause in submitted and isinstance(stored.event.data, Answer):
                    answers.setdefault(cause, stored.event.data)
                    if len(answers) == len(submitted):
                        break
    return [Decided(request, answers.get(cause)) for cause, request in submitted.items()]


@dataclass(frozen=True, slots=True)
class ArgumentChange:
    """Arguments a person substitutes when granting: all of them, or some fields."""

    replace: dict[str, Any] | None = None
    fields: dict[str, Any] = field(default_factory=dict)

    def applied_to(self, request: ApprovalState) -> dict[str, Any]:
        if request.tool is None:
            raise CliError(f"{request.request_id} approves a plan, which has no arguments")
        base = self.replace if self.replace is not None else dict(request.arguments or {})
        return {**base, **self.fields}


def _check_kinds(
    chosen: tuple[ApprovalState, ...],
    *,
    arguments: ArgumentChange | None,
    similar: StandingGrant | None,
    grant: PermissionGrant | None,
) -> None:
    """Refuse options that do not fit the kind of request chosen, before anything is sent:
    a permission is granted as asked (for the step or the session), a call is approved."""
    for request in chosen:
        if request.permissions and (arguments is not None or similar is not None):
            raise CliError(
                f"{request.request_id} asks for a permission, granted as asked: drop "
                "--arguments, --set and --similar (use --for step|session and --expires-in)",
                exit_code=2,
            )
        if not request.permissions and grant is not None:
            raise CliError(
                f"{request.request_id} asks to approve a call, not a permission: drop --for "
                "and --expires-in",
                exit_code=2,
            )


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


async def list_sessions(
    log: EventLog, tenant: str, *, latest: int | None = None, open_only: bool = False
) -> tuple[list[SessionState], int]:
    """The tenant's sessions, oldest first, each folded from its log: the `latest` started
    last, or all, or (`open_only`) those not ended; and how many the tenant has. Which
    sessions there are and which ended is read from subjects, without folding any."""
    limit = asyncio.Semaphore(CONCURRENT_LOADS)

    async def load(session_id: str) -> SessionState:
        async with limit:
            return (await log.store.load(tenant, session_id)).state

    ids = await session_ids(log.js, tenant)
    chosen = ids[-latest:] if latest else ids
    if open_only:
        ended = {
            session_id
            for end in (SessionCompleted, SessionFailed, SessionCancelled)
            for session_id in await session_ids(log.js, tenant, end.TYPE)
        }
        # A rollback reopens an ended session (paused, to be resumed): such a session is
        # folded to tell whether it is open now.
        ended -= set(await session_ids(log.js, tenant, RollbackCompleted.TYPE))
        chosen = [session_id for session_id in chosen if session_id not in ended]
    return list(await asyncio.gather(*(load(session_id) for session_id in chosen))), len(ids)


def needs_a_person(state: SessionState) -> bool:
    return state.status == "waiting" and bool(state.pending_approvals)


FOLLOW_REFRESH_S = 0.1
"""How often a follower hands on the state it folded while events keep coming: at most ten
times a second, and a change never later than that. Taking a state costs in proportion to
the session's length, so taking one per event made following a long session quadratic."""


async def watch(
    log: EventLog,
    tenant: str,
    session_id: str,
    *,
    on_change: Callable[[SessionState], None],
    refresh_s: float = FOLLOW_REFRESH_S,
) -> SessionState:
    """Follow the session until it ends or waits for a person; the state it stopped at."""
    return await fold_until(
        log,
        tenant,
        session_id,
        lambda state: state.is_terminal or needs_a_person(state),
        on_change=on_change,
        refresh_s=refresh_s,
    )


async def fold_until(
    log: EventLog,
    tenant: str,
    session_id: str,
    reached: Callable[[SessionState], bool],
    *,
    on_change: Callable[[SessionState], None] = lambda state: None,
    refresh_s: float = FOLLOW_REFRESH_S,
) -> SessionState:
    """Fold the session's log, then follow it as it grows, until `reached` holds; the state
    then.

    Each new event is folded once, as it comes, and no event is read twice. A state is
    taken (and handed to `on_change`, and `reached` asked of it) when the session's status,
    approvals or rollbacks change, which is what a person or a rollback waits on; and
    otherwise at most once every `refresh_s`, the last change no later than that.
    """
    snapshot = await log.store.load(tenant, session_id)
    state = snapshot.state
    on_change(state)
    if reached(state):
        return state
    async with following(log.js, tenant, session_id, after_seq=snapshot.last_seq) as events:
        return await _Following(state, reached, on_change, refresh_s).run(events)


class _Following:
    """One `fold_until` after the log so far: events folded as they come, states taken
    when something a waiter looks at changed, or at a bounded rate."""

    def __init__(
        self,
        state: SessionState,
        reached: Callable[[SessionState], bool],
        on_change: Callable[[SessionState], None],
        refresh_s: float,
    ) -> None:
        self._folding = SessionFold(state)
        self._reached = reached
        self._on_change = on_change
        self._refresh_s = refresh_s
        self._state = state
        self._taken_at = asyncio.get_running_loop().time()
        self._watched = self._what_waiters_watch()
        self._behind = False
        self._done = False

    async def run(self, events: AsyncIterator[StoredEvent]) -> SessionState:
        reader = asyncio.create_task(self._read(events))
        try:
            while not self._done:
                # A state the reader folded but did not hand on (no event came after it
                # for a while) is handed on here: a pause in the session shows.
                finished, _ = await asyncio.wait({reader}, timeout=self._refresh_s)
                if finished:
                    reader.result()  # The feed failed: raise why.
                    break
                if self._behind:
                    self._take()
        finally:
            if not reader.done():
                reader.cancel()
                await asyncio.wait({reader})
        return self._state

    async def _read(self, events: AsyncIterator[StoredEvent]) -> None:
        clock = asyncio.get_running_loop()
        async for stored in events:
            self._folding.apply(stored.event)
            self._behind = True
            if self._watched_changed() or clock.time() - self._taken_at >= self._refresh_s:
                self._take()
                if self._done:
                    return
                # Events already queued are taken without a pause: let the connection read
                # its socket now and then, or the server cuts off a follower far behind.
                await asyncio.sleep(0)

    def _take(self) -> None:
        self._state = self._folding.state()
        self._taken_at = asyncio.get_running_loop().time()
        self._watched = self._what_waiters_watch()
        self._behind = False
        self._on_change(self._state)
        self._done = self._reached(self._state)

    def _what_waiters_watch(self) -> tuple[str, object, object]:
        folding = self._folding
        return (folding.v["status"], folding.approvals, folding.rollbacks)

    def _watched_changed(self) -> bool:
        status, approvals, rollbacks = self._watched
        folding = self._folding
        # The fold copies a dict before its first write after a state is taken, so a dict
        # other than the one seen then was written to: a glance, whatever its size.
        return (
            folding.v["status"] != status
            or folding.approvals is not approvals
            or folding.rollbacks is not rollbacks
        )
