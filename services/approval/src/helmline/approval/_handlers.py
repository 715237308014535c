"""The approval service's edge: policy on the hot path, timers for expiring requests."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import nats.errors
from cachetools import LRUCache

from helmline.approval._policy import (
    Decision,
    judge_escalation,
    judge_expiry,
    judge_plan,
    judge_release,
    judge_step,
    judge_vote,
    judge_vote_again,
    permission_request_id,
    requests_to_watch,
    uses_by_rule,
)
from helmline.approval._policy_source import PolicySource
from helmline.approval._rules import NO_USES, Policy
from helmline.approval._webhooks import WebhookNotifier
from helmline.contracts import (
    APPROVAL_CONSUMER,
    Actor,
    ApprovalDecisionSubmitted,
    ApprovalDenied,
    ApprovalExpired,
    ApprovalGranted,
    ApprovalRequested,
    ApprovalState,
    Event,
    PermissionRequested,
    PlanProposed,
    PlanStep,
    SessionCancelled,
    SessionCompleted,
    SessionFailed,
    SessionPaused,
    SessionResumed,
    SessionStarted,
    SessionState,
    StepScheduled,
    ToolCallAuthorized,
    ToolCallDenied,
    event_type_filter,
    fold,
    source_of,
)
from helmline.runtime import (
    ConcurrencyConflict,
    Delivery,
    EventStore,
    FoldedStates,
    RetryableError,
    Router,
    SessionCache,
    StoredEvent,
)

logger = logging.getLogger(__name__)

SOURCE = source_of("approval")
REQUESTER_CACHE_LIMIT = 10_000
RECOUNTS = 5
"""Times a scheduled call is judged again when another replica authorised a call of the
session meanwhile, before its message is left to be delivered again."""
SETTLING = (ApprovalGranted, ApprovalDenied, SessionCompleted, SessionFailed, SessionCancelled)
"""Events after which a request's timers have nothing to do (see `requests_to_watch`)."""
TIMER_RETRY_DELAYS_S = (1.0, 2.0, 5.0, 10.0)
"""Pauses before a due timer tries again to record its decision when NATS did not take it
(the last repeats): a timer fires once, so it must not give up."""


class ApprovalHandler:
    """Applies the policy to plans and steps, records decisions, expires requests."""

    router = Router(APPROVAL_CONSUMER)

    def __init__(
        self,
        store: EventStore,
        states: FoldedStates,
        policies: PolicySource,
        notifier: WebhookNotifier | None = None,
    ) -> None:
        self._store = store
        self._policies = policies
        self._notifier = notifier or WebhookNotifier({})
        # Each session's armed timers, by what they do ("expire/<request>", "escalate/...").
        self._timers: dict[tuple[str, str], dict[str, asyncio.Task[None]]] = {}
        # Requests and votes kept folded in memory, so that a decision is judged without
        # replaying the session: it is on the path from a person's click to the tool.
        self._sessions = SessionCache(states)
        # Who started a session never changes, so it is looked up once per session, and
        # only when some rule asks about the requester or a tool requires a permission.
        self._requesters: LRUCache[tuple[str, str], Actor | None] = LRUCache(REQUESTER_CACHE_LIMIT)

    async def __call__(self, delivery: Delivery) -> None:
        await self.router.dispatch(self, delivery)

    @router.on(PlanProposed)
    async def _on_plan(self, delivery: Delivery) -> None:
        event = delivery.event
        assert isinstance(event.data, PlanProposed)
        plan, policy = event.data, self._policies.current
        earlier = await self._earlier_steps(event, plan)
        # A step whose tool requires a permission the requester lacks is neither authorised
        # with the plan nor asked about with it: it is refused when scheduled.
        needs_requester = any(policy.needs_requester(step.tool) for step in plan.steps)
        requester = await self._requester(event) if needs_requester else None
        decisions = judge_plan(
            plan,
            policy,
            tenant=event.tenant,
            requester=requester,
            now=datetime.now(UTC),
            earlier=earlier,
        )
        await self._append(event, decisions)

    @router.on(StepScheduled)
    async def _on_step(self, delivery: Delivery) -> None:
        event = delivery.event
        assert isinstance(event.data, StepScheduled)
        scheduled = event.data
        if scheduled.authorized_by_plan is not None:
            return  # Its approved plan authorised it: the tool gateway runs it.
        if delivery.maybe_handled and await self._already_judged(event, scheduled):
            return
        for _ in range(RECOUNTS):
            with contextlib.suppress(ConcurrencyConflict):
                await self._judge_step(event, scheduled, self._policies.current)
                return
        raise RetryableError(f"calls of the session kept being authorised: {scheduled.call_id}")

    @router.on(ApprovalRequested, PermissionRequested)
    async def _on_request(self, delivery: Delivery) -> None:
        event = delivery.event
        assert isinstance(event.data, ApprovalRequested)
        await self._sessions.advance(delivery)
        self._expire_later(event, event.data)
        self._escalate_later(event, event.data)
        if delivery.deliveries == 1:
            self._notifier.announce(event, self._policies.current.document.webhooks)

    @router.on(ApprovalDecisionSubmitted)
    async def _on_vote(self, delivery: Delivery) -> None:
        event = delivery.event
        assert isinstance(event.data, ApprovalDecisionSubmitted)
        vote, policy = event.data, self._policies.current
        if delivery.maybe_handled:
            decisions = await self._release_again(event, vote, policy)
            self._settle_timers(event, vote, decisions)
            return
        state = await self._sessions.advance(delivery)
        now = datetime.now(UTC)
        request = state.approvals.get(vote.request_id)
        tool = request.tool if request is not None else None
        rule_uses, last_authorised = await self._counted_calls(event, tool, policy, now)
        decisions = judge_vote(state, vote, policy, now, rule_uses)
        try:
            appended = await self._append(
                event, decisions, expected_last_authorised=last_authorised
            )
        except ConcurrencyConflict:
            # Another replica let a call of the session run since the count: the grant is
            # recorded, the call it releases is judged against the new count.
            decisions = await self._release_again(event, vote, policy)
        else:
            state = self._sessions.record(state, appended)
            if state.status == "paused" and state.held_grants:
                await self._release_if_resumed(event, policy)
        self._settle_timers(event, vote, decisions)

    @router.on(SessionCompleted, SessionFailed, SessionCancelled)
    async def _on_end(self, delivery: Delivery) -> None:
        # Requests still open are withdrawn with the session (the fold says so): a late vote
        # is refused, and nothing is left to expire or escalate.
        event = delivery.event
        await self._keep_up(delivery)
        for task in self._timers.pop((event.tenant, event.session_id), {}).values():
            task.cancel()

    @router.on(SessionResumed)
    async def _on_resume(self, delivery: Delivery) -> None:
        event, policy = delivery.event, self._policies.current
        state = await self._sessions.advance(delivery)
        for request in state.held_grants:
            released = await self._release(event, state, request, policy)
            state = self._sessions.record(state, released)

    @router.on(SessionPaused)
    async def _keep_up(self, delivery: Delivery) -> None:
        """Fold the event into the session's state if it is held: one this replica never
        needed (most sessions, whose calls all ran without a person) is read from the log
        when it first is, and the log then holds the event. Reading it now cost each
        session's whole log at its end."""
        event = delivery.event
        if self._sessions.holds(event.tenant, event.session_id):
            await self._sessions.advance(delivery)

    def arm_timers(self, asked: Event) -> None:
        """Arm the expiry (and escalation) of a request made in any session, whichever
        replica handles it: should that replica stop for good, another still expires it
        (whichever fires first records it; the others find it decided)."""
        if isinstance(asked.data, ApprovalRequested):
            self._expire_later(asked, asked.data)
            self._escalate_later(asked, asked.data)

    async def recover(self, lookback: timedelta) -> None:
        """Re-arm the timers of requests made before a restart and still open (expired ones
        fire now); those decided or withdrawn since need none."""
        since = datetime.now(UTC) - lookback
        asked = [
            stored
            for kind in (ApprovalRequested, PermissionRequested)
            for stored in await self._store.read_matching(event_type_filter(kind.TYPE), since=since)
        ]
        settling = [
            stored
            for kind in SETTLING
            for stored in await self._store.read_matching(event_type_filter(kind.TYPE), since=since)
        ]
        for request in requests_to_watch(asked, settling):
            self.arm_timers(request)

    async def close(self) -> None:
        """Stop every timer (they are re-armed from the log at the next start)."""
        await self._notifier.close()
        tasks = [task for timers in self._timers.values() for task in timers.values()]
        self._timers.clear()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _judge_step(self, event: Event, scheduled: StepScheduled, policy: Policy) -> None:
        """Judge a scheduled call and record the decision.

        A call let run by a count (of an `at_most` rule's calls, or of an "approve similar"
        grant's uses) is recorded only if no call of the session was authorised since the
        count was read: else `ConcurrencyConflict`, and it is judged again. Replicas judging
        two calls of one session at once would otherwise both take the last use."""
        now = datetime.now(UTC)
        requester = await self._requester(event) if policy.needs_requester(scheduled.tool) else None
        rule_uses, last_authorised = await self._counted_calls(event, scheduled.tool, policy, now)
        decisions = judge_step(
            scheduled,
            policy,
            tenant=event.tenant,
            requester=requester,
            now=now,
            rule_uses=rule_uses,
        )
        if any(isinstance(d.payload, ApprovalRequested) for d in decisions):
            # Off the hot path (a person would be asked): a standing "approve similar
            # calls" grant of the session may cover the call.
            log = await self._store.read_all(event.tenant, event.session_id)
            session, approved_plan = _session_and_plan([stored.event for stored in log])
            if last_authorised is None:
                last_authorised = _last_authorised(log)
            decisions = judge_step(
                scheduled,
                policy,
                tenant=event.tenant,
                requester=session.requested_by,
                now=now,
                session=session,
                approved_plan=approved_plan,
                rule_uses=rule_uses,
            )
        await self._append(event, decisions, expected_last_authorised=last_authorised)

    async def _counted_calls(
        self, event: Event, tool: str | None, policy: Policy, now: datetime
    ) -> tuple[Mapping[str, Sequence[datetime]], int | None]:
        """The session's calls by the rule that let them run (`uses_by_rule`), as far back as
        the `at_most` conditions of the rules that may decide a call of `tool` count, and
        the sequence of its last authorisation; no uses and no sequence when none of those
        rules counts (or no tool is called). Read from the log rather than a cached fold, so
        that each replica counts the calls the others let run."""
        span = policy.counted_span_for(tenant=event.tenant, tool=tool) if tool else None
        if span is None:
            return NO_USES, None
        authorised = await self._store.read_since(
            event.tenant, event.session_id, ToolCallAuthorized.TYPE, since=now - span
        )
        return uses_by_rule(s.event for s in authorised.events), authorised.last_seq

    async def _release(
        self, cause: Event, state: SessionState, request: ApprovalState, policy: Policy
    ) -> list[Event]:
        """Let the call of a request granted while its session was paused run, now that it is
        not (`judge_release`), counted as a grant's call is. Its authorisation is the one the
        grant would have recorded, so a release decided twice (by two replicas) is stored
        once. The events appended."""
        for _ in range(RECOUNTS):
            now = datetime.now(UTC)
            rule_uses, last_authorised = await self._counted_calls(cause, request.tool, policy, now)
            decisions = judge_release(state, request, policy, now, rule_uses)
            with contextlib.suppress(ConcurrencyConflict):
                return await self._append(
                    cause, decisions, expected_last_authorised=last_authorised
                )
        raise RetryableError(f"calls of the session kept being authorised: {request.request_id}")

    async def _release_if_resumed(self, granted: Event, policy: Policy) -> None:
        """After recording a grant held for a paused session: should the session have resumed
        meanwhile (a replica sharing the consumer handled the resume before the grant was in
        the log, and found nothing to release), release the call here."""
        state = (await self._store.load(granted.tenant, granted.session_id)).state
        if state.status == "paused":
            return
        for request in state.held_grants:
            state = fold(await self._release(granted, state, request, policy), state)
        self._sessions.forget(granted.tenant, granted.session_id)

    async def _earlier_steps(
        self, event: Event, proposed: PlanProposed
    ) -> tuple[PlanStep, ...] | None:
        """The steps of the session's earlier plans, when `proposed` is a plan-mode replan
        with a step proposed after a suspected injection (what `steered_steps` compares);
        else None, without reading the log: most plans have no such step."""
        if proposed.revision == 1 or not any(
            step.taint is not None and step.taint.after_injection_suspected
            for step in proposed.steps
        ):
            return None
        log = [
            stored.event for stored in await self._store.read_all(event.tenant, event.session_id)
        ]
        # In act mode each turn's calls are a revision of their own: the calls are judged
        # one by one when scheduled, and no plan is laid out ahead of the data.
        if any(isinstance(e.data, SessionStarted) and e.data.mode == "act" for e in log):
            return None
        return tuple(
            step
            for e in log
            if isinstance(e.data, PlanProposed) and e.data.revision < proposed.revision
            for step in e.data.steps
        )

    async def _requester(self, event: Event) -> Actor | None:
        key = (event.tenant, event.session_id)
        if key not in self._requesters:
            state = (await self._store.load(event.tenant, event.session_id)).state
            self._requesters[key] = state.requested_by
        return self._requesters[key]

    async def _release_again(
        self, cause: Event, vote: ApprovalDecisionSubmitted, policy: Policy
    ) -> list[Decision]:
        """Judge a vote again until what the log lacks of its decisions is recorded: another
        replica may let a call of the session run between the count and the authorisation."""
        for _ in range(RECOUNTS):
            with contextlib.suppress(ConcurrencyConflict):
                return await self._judge_vote_again(cause, vote, policy)
        raise RetryableError(f"calls of the session kept being authorised: {vote.request_id}")

    async def _judge_vote_again(
        self, cause: Event, vote: ApprovalDecisionSubmitted, policy: Policy
    ) -> list[Decision]:
        """Judge a vote delivered again (or cut short by another replica's authorisation) as
        it was judged first, against the session as it was then, and append what of that the
        log lacks: nothing when it holds it all (not a refusal of a vote that counted), the
        rest when the service stopped halfway.

        Until the log holds more of the vote's decisions than its grant, the call it releases
        is counted against every call authorised in the session so far, and appended only if
        none was authorised since the count (else `ConcurrencyConflict`)."""
        log = await self._store.read_all(cause.tenant, cause.session_id)
        events = [stored.event for stored in log]
        upto = next(
            (index for index, event in enumerate(events) if event.id == cause.id), len(events)
        )
        recorded = [event.data for event in events[upto + 1 :] if event.causation_id == cause.id]
        before = events[: upto + 1]
        session = fold(before)
        request = session.approvals.get(vote.request_id)
        counted = before
        last_authorised = None
        if (
            all(isinstance(data, ApprovalGranted) for data in recorded)
            and request is not None
            and request.tool is not None
            and policy.counted_span_for(tenant=cause.tenant, tool=request.tool) is not None
        ):
            counted = events
            last_authorised = _last_authorised(log)
        decisions = judge_vote_again(
            session, vote, policy, cause.time, recorded, uses_by_rule(counted)
        )
        await self._append(cause, decisions, events, expected_last_authorised=last_authorised)
        self._sessions.forget(cause.tenant, cause.session_id)
        return decisions

    def _settle_timers(
        self, cause: Event, vote: ApprovalDecisionSubmitted, decisions: Sequence[Decision]
    ) -> None:
        # A call denied after its grant (see `judge_vote_again`) is decided too.
        decided = ApprovalGranted | ApprovalDenied | ToolCallDenied
        if any(isinstance(d.payload, decided) for d in decisions):
            self._cancel_timer(cause.tenant, cause.session_id, vote.request_id)

    async def _already_judged(self, event: Event, scheduled: StepScheduled) -> bool:
        state = (await self._store.load(event.tenant, event.session_id)).state
        step = state.steps.get(scheduled.step_id)
        return step is not None and (
            step.call_id != scheduled.call_id
            or step.status != "scheduled"
            or step.approval_request_id
            in (scheduled.call_id, permission_request_id(scheduled.call_id))
        )

    def _arm(self, event: Event, name: str, due: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run `due` as the session's timer `name`, unless that timer is armed already."""
        timers = self._timers.setdefault((event.tenant, event.session_id), {})
        if name not in timers:
            timers[name] = asyncio.create_task(due())

    def _disarm(self, tenant: str, session_id: str, name: str) -> asyncio.Task[None] | None:
        """Forget the session's timer `name` (it fired, or is to be cancelled)."""
        timers = self._timers.get((tenant, session_id), {})
        task = timers.pop(name, None)
        if not timers:
            self._timers.pop((tenant, session_id), None)
        return task

    def _expire_later(self, event: Event, request: ApprovalRequested) -> None:
        self._arm(event, _expiry(request.request_id), lambda: self._expire_at(event, request))

    def _cancel_timer(self, tenant: str, session_id: str, request_id: str) -> None:
        for name in (_expiry(request_id), _escalation(request_id)):
            task = self._disarm(tenant, session_id, name)
            if task is not None:
                task.cancel()

    def _escalate_later(self, event: Event, request: ApprovalRequested) -> None:
        terms = self._policies.current.approval_terms(request.rule)
        if (
            # The permission terms name no one to escalate to: such requests only expire.
            isinstance(request, PermissionRequested)
            or terms is None
            or terms.escalate_after is None
            or request.approver_roles == terms.escalate_to
        ):
            return
        due = event.time + terms.escalate_after
        self._arm(
            event,
            _escalation(request.request_id),
            lambda: self._escalate_at(event, request, due),
        )

    async def _escalate_at(self, event: Event, request: ApprovalRequested, due: datetime) -> None:
        await _sleep_until(due)
        await _until_recorded(
            lambda: self._escalate(event, request), f"the escalation of {request.request_id}"
        )
        self._sessions.forget(event.tenant, event.session_id)
        self._disarm(event.tenant, event.session_id, _escalation(request.request_id))

    async def _escalate(self, cause: Event, request: ApprovalRequested) -> None:
        state = (await self._store.load(cause.tenant, cause.session_id)).state
        decisions = judge_escalation(state, request, self._policies.current, datetime.now(UTC))
        await self._append(cause, decisions)

    async def _expire_at(self, event: Event, request: ApprovalRequested) -> None:
        await _sleep_until(request.expires_at)
        await _until_recorded(
            lambda: self._expire(event, request), f"the expiry of {request.request_id}"
        )
        # The cache did not see the expiry; the next decision on the session replays the log.
        self._sessions.forget(event.tenant, event.session_id)
        self._disarm(event.tenant, event.session_id, _expiry(request.request_id))

    async def _expire(self, cause: Event, request: ApprovalRequested) -> None:
        """Deny the request if nobody decided it; or finish an expiry the log holds only in
        part (the service stopped between its events), judged as of the session then."""
        log = [s.event for s in await self._store.read_all(cause.tenant, cause.session_id)]
        upto = next(
            (
                index
                for index, event in enumerate(log)
                if isinstance(event.data, ApprovalExpired)
                and event.data.request_id == request.request_id
            ),
            len(log),
        )
        decisions = judge_expiry(
            fold(log[:upto]), request.request_id, datetime.now(UTC), self._policies.current
        )
        await self._append(cause, decisions, log)

    async def _append(
        self,
        cause: Event,
        decisions: Sequence[Decision],
        log: Sequence[Event] = (),
        *,
        expected_last_authorised: int | None = None,
    ) -> list[Event]:
        """Append the events of `decisions` that `log` does not hold already (the same
        cause deciding the same thing again derives the same ids); those appended.
        Given `expected_last_authorised`, an authorisation among them is appended only if
        the session's last authorisation is still that one (else `ConcurrencyConflict`)."""
        derived = [
            cause.derive(
                decision.payload, source=SOURCE, key=str(index), identity=decision.identity
            )
            for index, decision in enumerate(decisions)
        ]
        recorded = {event.id for event in log}
        events = [event for event in derived if event.id not in recorded]
        counted = next(
            (i for i, event in enumerate(events) if event.type == ToolCallAuthorized.TYPE), None
        )
        if expected_last_authorised is None or counted is None:
            # A grant and the authorisation it releases are one decision: sent together, the
            # tool call starts a round trip sooner.
            await self._store.append_pipelined(events)
            return events
        # What comes before the authorisation (a grant) is recorded first: should the count
        # have changed, the vote is judged again from the log, which then holds its grant.
        await self._store.append_pipelined(events[:counted])
        await self._store.append(events[counted], expected_last_of_type=expected_last_authorised)
        await self._store.append_pipelined(events[counted + 1 :])
        return events


def _session_and_plan(events: Sequence[Event]) -> tuple[SessionState, PlanProposed | None]:
    """The session, and the plan revision in force as proposed (the fold keeps each step's
    latest arguments, not the ones people approved with the plan)."""
    session = fold(events)
    plans = (
        e.data
        for e in reversed(events)
        if isinstance(e.data, PlanProposed) and e.data.revision == session.plan_approved_revision
    )
    return session, next(plans, None)


def _last_authorised(log: Sequence[StoredEvent]) -> int:
    """The sequence of the session's last authorisation (0: none), which an authorisation
    let by a count expects to be still the last."""
    return max((s.seq for s in log if isinstance(s.event.data, ToolCallAuthorized)), default=0)


def _expiry(request_id: str) -> str:
    return f"expire/{request_id}"


def _escalation(request_id: str) -> str:
    return f"escalate/{request_id}"


async def _sleep_until(due: datetime) -> None:
    delay = (due - datetime.now(UTC)).total_seconds()
    if delay > 0:
        await asyncio.sleep(delay)


async def _until_recorded(decide: Callable[[], Awaitable[None]], what: str) -> None:
    """Run a due timer's `decide` until NATS takes what it appends."""
    for attempt in itertools.count():
        try:
            await decide()
            return
        except (nats.errors.Error, TimeoutError) as error:
            pause = TIMER_RETRY_DELAYS_S[min(attempt, len(TIMER_RETRY_DELAYS_S) - 1)]
            logger.warning("could not record %s (%r); trying again in %.0f s", what, error, pause)
            await asyncio.sleep(pause)
