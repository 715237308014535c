"""A decision the approval service was killed while recording (a person's vote, delivered
again; a request's expiry, due again after the restart) leaves the log as one handling
would: what the first did not record, and nothing twice. A due timer outlasts NATS not
answering."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import nats.errors
import pytest
from nats.js import JetStreamContext

from helmline.approval._handlers import ApprovalHandler
from helmline.approval._policy_source import PolicySource
from helmline.contracts import (
    Actor,
    ApprovalDecisionSubmitted,
    ApprovalRequested,
    Event,
    StepScheduled,
    ToolCallDenied,
    new_event,
)
from helmline.runtime import Appended, Delivery, EventStore, FoldedStates
from helmline.runtime.testing import eventually, session_started

POLICY = "rules: [{name: ask, tool: run_command, effect: require_approval}]\n"
APPROVER = Actor(id="bo", roles=("approver",))


class KilledAfterFirstAppend(EventStore):
    """A store whose process dies after the first event of a decision is stored."""

    async def append_pipelined(self, events: Sequence[Event]) -> list[Appended]:
        await super().append_pipelined(events[:1])
        raise asyncio.CancelledError  # Nothing after this line runs.


class UnansweredOnce(EventStore):
    """A store whose first append NATS does not answer."""

    def __init__(self, js: JetStreamContext) -> None:
        super().__init__(js)
        self.refused = 0

    async def append_pipelined(self, events: Sequence[Event]) -> list[Appended]:
        if not self.refused:
            self.refused += 1
            raise nats.errors.TimeoutError
        return await super().append_pipelined(events)


async def waiting_vote(
    handler: ApprovalHandler, store: EventStore, tenant: str
) -> tuple[str, Delivery]:
    """A session whose call waits for approval, and a grant of it not yet handled."""
    started = session_started(tenant)
    session_id = started.session_id
    await store.append(started)
    scheduled = started.derive(
        StepScheduled(step_id="a", call_id="a.1", tool="run_command", arguments={"command": "ls"}),
        source="test",
    )
    await handler(Delivery(scheduled, (await store.append(scheduled)).seq, 1))
    log = await store.read_all(tenant, session_id)
    (asked,) = [s for s in log if isinstance(s.event.data, ApprovalRequested)]
    await handler(Delivery(asked.event, asked.seq, 1))
    vote = new_event(
        ApprovalDecisionSubmitted(request_id="a.1", decision="grant", decided_by=APPROVER),
        tenant=tenant,
        session_id=session_id,
        source="test",
    )
    return session_id, Delivery(vote, (await store.append(vote)).seq, 1)


async def types_after_the_vote(store: EventStore, tenant: str, session_id: str) -> list[str]:
    log = [stored.event for stored in await store.read_all(tenant, session_id)]
    voted = next(
        index
        for index, event in enumerate(log)
        if isinstance(event.data, ApprovalDecisionSubmitted)
    )
    return [event.type for event in log[voted + 1 :]]


@pytest.fixture
async def handlers(
    js: JetStreamContext, store: EventStore, tmp_path: Path
) -> AsyncIterator[list[ApprovalHandler]]:
    """A handler, and one whose process dies halfway through appending a decision."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    both = [
        ApprovalHandler(kind, FoldedStates(js, store), PolicySource(policy))
        for kind in (store, KilledAfterFirstAppend(js))
    ]
    yield both
    for handler in both:
        await handler.close()


async def test_a_grant_recorded_without_its_authorisation_gets_it_when_the_vote_comes_again(
    handlers: list[ApprovalHandler], store: EventStore, tenant: str
) -> None:
    restarted, killed = handlers
    session_id, vote = await waiting_vote(restarted, store, tenant)
    with pytest.raises(asyncio.CancelledError):
        await killed(vote)
    assert await types_after_the_vote(store, tenant, session_id) == ["approval.granted"]

    for deliveries in (2, 3):
        await restarted(Delivery(vote.event, vote.seq, deliveries))

    after = await types_after_the_vote(store, tenant, session_id)
    assert after == ["approval.granted", "tool.call.authorized"]


async def test_a_grant_recorded_before_the_policy_changed_denies_the_call_it_would_release(
    js: JetStreamContext, store: EventStore, tenant: str, tmp_path: Path
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    source = PolicySource(policy)
    restarted = ApprovalHandler(store, FoldedStates(js, store), source)
    killed = ApprovalHandler(KilledAfterFirstAppend(js), FoldedStates(js, store), source)
    try:
        session_id, vote = await waiting_vote(restarted, store, tenant)
        with pytest.raises(asyncio.CancelledError):
            await killed(vote)
        # Edited while the service was down: commands are refused from now on.
        policy.write_text("rules: [{name: no-commands, tool: run_command, effect: deny}]\n")
        assert source.reload_if_changed()

        await restarted(Delivery(vote.event, vote.seq, 2))
    finally:
        for handler in (restarted, killed):
            await handler.close()

    # Not left waiting for an authorisation that never comes, and the command never runs.
    after = await types_after_the_vote(store, tenant, session_id)
    assert after == ["approval.granted", "tool.call.denied"]
    denied = (await store.read_all(tenant, session_id))[-1].event.data
    assert isinstance(denied, ToolCallDenied)
    assert denied.reason.startswith("granted, but the policy refused the call when it was to run")


async def test_a_vote_handled_in_full_and_delivered_again_records_nothing_more(
    handlers: list[ApprovalHandler], store: EventStore, tenant: str
) -> None:
    handler, _ = handlers
    session_id, vote = await waiting_vote(handler, store, tenant)
    await handler(vote)
    handled = await types_after_the_vote(store, tenant, session_id)
    assert handled == ["approval.granted", "tool.call.authorized"]

    # Killed before acknowledging it: no refusal of a vote that counted.
    await handler(Delivery(vote.event, vote.seq, 2))

    assert await types_after_the_vote(store, tenant, session_id) == handled


async def expired_request(store: EventStore, tenant: str) -> tuple[str, Delivery]:
    """A session whose call waits for a request that expired a second ago."""
    started = session_started(tenant)
    await store.append(started)
    scheduled = StepScheduled(step_id="a", call_id="a.1", tool="run_command")
    await store.append(started.derive(scheduled, source="test"))
    asked = started.derive(
        ApprovalRequested(
            request_id="a.1",
            scope="step",
            step_id="a",
            call_id="a.1",
            tool="run_command",
            risk="high",
            reason="test",
            expires_at=datetime.now(UTC) - timedelta(seconds=1),
        ),
        source="test",
    )
    return started.session_id, Delivery(asked, (await store.append(asked)).seq, 1)


async def types_after_the_request(store: EventStore, tenant: str, session_id: str) -> list[str]:
    log = [stored.event for stored in await store.read_all(tenant, session_id)]
    return [event.type for event in log[3:]]


async def test_an_expiry_recorded_without_its_denial_gets_it_after_the_restart(
    handlers: list[ApprovalHandler], store: EventStore, tenant: str
) -> None:
    restarted, killed = handlers
    session_id, asked = await expired_request(store, tenant)
    await killed(asked)  # Its timer fires at once, and the process dies in it.
    await eventually(
        lambda: types_after_the_request(store, tenant, session_id),
        what="the expiry recorded",
    )
    assert await types_after_the_request(store, tenant, session_id) == ["approval.expired"]

    await restarted.recover(timedelta(hours=1))

    async def denied() -> bool:
        return len(await types_after_the_request(store, tenant, session_id)) > 1

    await eventually(denied, what="the call denied")
    await restarted.recover(timedelta(hours=1))  # Due again: nothing more to record.
    await restarted.close()
    after = await types_after_the_request(store, tenant, session_id)
    assert after == ["approval.expired", "tool.call.denied"]


async def test_a_due_expiry_is_recorded_once_nats_answers_again(
    js: JetStreamContext, store: EventStore, tenant: str, tmp_path: Path
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    unanswered = UnansweredOnce(js)
    handler = ApprovalHandler(unanswered, FoldedStates(js, store), PolicySource(policy))
    session_id, asked = await expired_request(store, tenant)
    try:
        await handler(asked)

        async def denied() -> bool:
            return len(await types_after_the_request(store, tenant, session_id)) > 1

        await eventually(denied, timeout_s=10, what="the expiry recorded after a retry")
    finally:
        await handler.close()
    assert unanswered.refused == 1
    after = await types_after_the_request(store, tenant, session_id)
    assert after == ["approval.expired", "tool.call.denied"]
