"""A session's end withdraws its open requests in the approval service too: a vote that
comes late is refused, and no timer waits on for the request to expire."""

from __future__ import annotations

import asyncio
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
from helmline.runtime import Delivery, EventStore, FoldedStates
from helmline.runtime.testing import session_started

POLICY = (
    "rules: [{name: ask, tool: run_command, effect: require_approval,"
    " approval: {expires_in: 1h, escalate_after: 30m, escalate_to: [sre]}}]\n"
)
APPROVER = Actor(id="bo", roles=("approver",))


def timers_waiting() -> list[str]:
    """The approval handler's expiry and escalation timers running in this loop."""
    names = ("ApprovalHandler._expire_at", "ApprovalHandler._escalate_at")
    return [
        name
        for task in asyncio.all_tasks()
        if (name := getattr(task.get_coro(), "__qualname__", "")) in names
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
        assert sorted(timers_waiting()) == [
            "ApprovalHandler._escalate_at",
            "ApprovalHandler._expire_at",
        ]

        await delivered(started.derive(SessionCancelled(reason="enough"), source="test"))
        await asyncio.sleep(0)  # The cancelled timers end at the loop's next turn.
        assert timers_waiting() == []

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
