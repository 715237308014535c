"""A call granted while its session is paused runs once the session resumes: released by the
resume, once however often it is delivered, and released by the grant itself when a replica
sharing the consumer handled the resume before the grant was in the log."""

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
    ApprovalGranted,
    ApprovalRequested,
    Event,
    SessionPaused,
    SessionResumed,
    StepScheduled,
    ToolCallAuthorized,
    new_event,
)
from helmline.runtime import Appended, Delivery, EventStore, FoldedStates
from helmline.runtime.testing import session_started

POLICY = "rules: [{name: ask, tool: run_command, effect: require_approval}]\n"
APPROVER = Actor(id="bo", roles=("approver",))


@pytest.fixture
async def handler(
    js: JetStreamContext, store: EventStore, tmp_path: Path
) -> AsyncIterator[ApprovalHandler]:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    handler = ApprovalHandler(store, FoldedStates(js, store), PolicySource(policy))
    yield handler
    await handler.close()


async def delivered(handler: ApprovalHandler, store: EventStore, event: Event) -> Delivery:
    """Append `event` and hand it to the handler, as the approval consumer would."""
    delivery = Delivery(event, (await store.append(event)).seq, 1)
    await handler(delivery)
    return delivery


async def paused_with_a_request(
    handler: ApprovalHandler, store: EventStore, tenant: str, steps: tuple[str, ...] = ("a",)
) -> Event:
    """A session paused while the calls of `steps` wait for a person; its first event."""
    started = session_started(tenant)
    await store.append(started)
    for step in steps:
        scheduled = StepScheduled(
            step_id=step, call_id=f"{step}.1", tool="run_command", arguments={"command": "ls"}
        )
        await delivered(handler, store, started.derive(scheduled, source="test", key=step))
    await delivered(handler, store, started.derive(SessionPaused(), source="test"))
    log = await store.read_all(tenant, started.session_id)
    for asked in [s for s in log if isinstance(s.event.data, ApprovalRequested)]:
        await handler(Delivery(asked.event, asked.seq, 1))
    return started


async def grant(
    handler: ApprovalHandler, store: EventStore, started: Event, request_id: str = "a.1"
) -> None:
    vote = ApprovalDecisionSubmitted(request_id=request_id, decision="grant", decided_by=APPROVER)
    await delivered(
        handler,
        store,
        new_event(vote, tenant=started.tenant, session_id=started.session_id, source="test"),
    )


async def authorisations(store: EventStore, started: Event) -> list[ToolCallAuthorized]:
    log = await store.read_all(started.tenant, started.session_id)
    return [s.event.data for s in log if isinstance(s.event.data, ToolCallAuthorized)]


async def test_the_resume_releases_the_call_once_however_often_it_is_delivered(
    handler: ApprovalHandler, store: EventStore, tenant: str
) -> None:
    started = await paused_with_a_request(handler, store, tenant)
    await grant(handler, store, started)
    assert await authorisations(store, started) == []

    resumed = await delivered(handler, store, started.derive(SessionResumed(), source="test"))
    await handler(Delivery(resumed.event, resumed.seq, 2))  # Killed before its ack.

    (authorized,) = await authorisations(store, started)
    assert (authorized.call_id, authorized.approval_request_id) == ("a.1", "a.1")


async def test_calls_released_together_are_not_released_again_at_the_next_resume(
    js: JetStreamContext, tenant: str, tmp_path: Path
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    duplicates: list[str] = []
    store = EventStore(
        js, on_append=lambda event, duplicate: duplicates.append(event.type) if duplicate else None
    )
    handler = ApprovalHandler(store, FoldedStates(js, store), PolicySource(policy))
    try:
        started = await paused_with_a_request(handler, store, tenant, steps=("a", "b"))
        for request_id in ("a.1", "b.1"):
            await grant(handler, store, started, request_id)
        await delivered(handler, store, started.derive(SessionResumed(), source="test"))
        assert sorted(a.call_id for a in await authorisations(store, started)) == ["a.1", "b.1"]

        # Paused and resumed again while both calls run: nothing is held any more.
        await delivered(handler, store, started.derive(SessionPaused(), source="test", key="2"))
        await delivered(handler, store, started.derive(SessionResumed(), source="test", key="2"))
    finally:
        await handler.close()
    assert duplicates == []


class ResumedMeanwhile(EventStore):
    """A store into which the session's resume lands between the handler's read of the log
    and its grant: another replica, handling the resume, found no grant to release."""

    resume: Event | None = None

    async def append_pipelined(self, events: Sequence[Event]) -> list[Appended]:
        if self.resume is not None and any(isinstance(e.data, ApprovalGranted) for e in events):
            await self.append(self.resume)
            self.resume = None
        return await super().append_pipelined(events)


async def test_a_grant_recorded_after_a_resume_it_did_not_see_releases_the_call_itself(
    js: JetStreamContext, tenant: str, tmp_path: Path
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    store = ResumedMeanwhile(js)
    handler = ApprovalHandler(store, FoldedStates(js, store), PolicySource(policy))
    try:
        started = await paused_with_a_request(handler, store, tenant)
        store.resume = started.derive(SessionResumed(), source="test")
        await grant(handler, store, started)
    finally:
        await handler.close()

    assert store.resume is None  # The resume landed between the read and the grant.
    (authorized,) = await authorisations(store, started)
    assert authorized.call_id == "a.1"
