"""A person's decision delivered again (the approval service was killed while handling it)
leaves the log as one handling would: what the first did not record, and nothing twice."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from pathlib import Path

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
    new_event,
)
from helmline.runtime import Appended, Delivery, EventStore, FoldedStates
from helmline.runtime.testing import session_started

POLICY = "rules: [{name: ask, tool: run_command, effect: require_approval}]\n"
APPROVER = Actor(id="bo", roles=("approver",))


class KilledAfterFirstAppend(EventStore):
    """A store whose process dies after the first event of a decision is stored."""

    async def append_pipelined(self, events: Sequence[Event]) -> list[Appended]:
        await super().append_pipelined(events[:1])
        raise ConnectionError("killed")


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
    with pytest.raises(ConnectionError):
        await killed(vote)
    assert await types_after_the_vote(store, tenant, session_id) == ["approval.granted"]

    for deliveries in (2, 3):
        await restarted(Delivery(vote.event, vote.seq, deliveries))

    after = await types_after_the_vote(store, tenant, session_id)
    assert after == ["approval.granted", "tool.call.authorized"]


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
