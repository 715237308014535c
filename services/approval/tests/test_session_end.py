"""A session's end withdraws its open requests in the approval service too: a vote that
comes late is refused, and no timer waits on for the request to expire; nor, after a
restart, for requests decided or withdrawn before it."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path

from nats.js import JetStreamContext

from helmline.approval._handlers import ApprovalHandler
from helmline.approval._policy_source import PolicySource
from helmline.contracts import (
    Actor,
    ApprovalDecisionRefused,
    ApprovalDecisionSubmitted,
    ApprovalRequested,
    Event,
    SessionCancelled,
    StepScheduled,
    ToolCallAuthorized,
    new_event,
)
from helmline.runtime import Delivery, EventStore, FoldedStates, connect_nats
from helmline.runtime.testing import eventually, session_started

POLICY = (
    "rules: [{name: ask, tool: run_command, effect: require_approval,"
    " approval: {expires_in: 1h, escalate_after: 30m, escalate_to: [sre]}}]\n"
)
APPROVER = Actor(id="bo", roles=("approver",))


TIMERS = ("ApprovalHandler._expire_at", "ApprovalHandler._escalate_at")


def timers_waiting() -> list[str]:
    """The approval handler's expiry and escalation timers running in this loop."""
    return [
        name
        for task in asyncio.all_tasks()
        if (name := getattr(task.get_coro(), "__qualname__", "")) in TIMERS
    ]


async def test_a_vote_after_the_session_ended_is_refused_and_no_timer_is_left(
    js: JetStreamContext, store: EventStore, tenant: str, tmp_path: Path
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    handler = ApprovalHandler(store, FoldedStates(js, store), PolicySource(policy))

    async def delivered(event: Event) -> None:
        # One replica alone on the consumer: its cache folds only what it is handed.
        await handler(Delivery(event, (await store.append(event)).seq, 1, shared=False))

    try:
        started = session_started(tenant)
        await store.append(started)
        scheduled = StepScheduled(
            step_id="a", call_id="a.1", tool="run_command", arguments={"command": "ls"}
        )
        await delivered(started.derive(scheduled, source="test"))
        log = await store.read_all(tenant, started.session_id)
        (asked,) = [s for s in log if isinstance(s.event.data, ApprovalRequested)]
        await handler(Delivery(asked.event, asked.seq, 1, shared=False))
        assert sorted(timers_waiting()) == sorted(TIMERS)

        await delivered(started.derive(SessionCancelled(reason="enough"), source="test"))
        # Cancelled, the timers end at the loop's next turn.
        await eventually(lambda: timers_waiting() == [], timeout_s=5, what="no timer left")

        vote = ApprovalDecisionSubmitted(request_id="a.1", decision="grant", decided_by=APPROVER)
        await delivered(
            new_event(vote, tenant=tenant, session_id=started.session_id, source="test")
        )
    finally:
        await handler.close()

    log = await store.read_all(tenant, started.session_id)
    assert not any(isinstance(s.event.data, ToolCallAuthorized) for s in log)
    (refused,) = [s.event.data for s in log if isinstance(s.event.data, ApprovalDecisionRefused)]
    assert refused.reason == "request a.1 is already withdrawn"


async def test_a_restart_arms_timers_only_for_requests_still_open(
    own_log: tuple[str, EventStore], tenant: str, tmp_path: Path
) -> None:
    # A log of its own: a restart looks back over every tenant's requests.
    url, store = own_log
    connection = await connect_nats(url)
    js = connection.jetstream()
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    first = ApprovalHandler(store, FoldedStates(js, store), PolicySource(policy))
    sessions: dict[str, Event] = {}
    try:
        for name in ("open", "granted", "ended"):
            started = sessions[name] = session_started(tenant)
            await store.append(started)
            scheduled = StepScheduled(
                step_id="a", call_id="a.1", tool="run_command", arguments={"command": "ls"}
            )
            event = started.derive(scheduled, source="test")
            await first(Delivery(event, (await store.append(event)).seq, 1))
        vote = ApprovalDecisionSubmitted(request_id="a.1", decision="grant", decided_by=APPROVER)
        granted = sessions["granted"]
        event = new_event(vote, tenant=tenant, session_id=granted.session_id, source="test")
        await first(Delivery(event, (await store.append(event)).seq, 1))
        await store.append(sessions["ended"].derive(SessionCancelled(reason="x"), source="test"))
    finally:
        await first.close()
    assert timers_waiting() == []

    restarted = ApprovalHandler(store, FoldedStates(js, store), PolicySource(policy))
    try:
        await restarted.recover(timedelta(hours=1))
        # The open request's expiry and escalation; none for the granted or withdrawn one.
        assert sorted(timers_waiting()) == sorted(TIMERS)
    finally:
        await restarted.close()
        await connection.close()
