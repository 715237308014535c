"""Calls let run by a count (an `at_most` rule's calls, an "approve similar" grant's uses)
stay within it when replicas judge calls of one session at the same moment: each counts
before deciding, and a decision counted before another replica's is judged again."""

from __future__ import annotations

import asyncio
from datetime import datetime
from pathlib import Path

from nats.js import JetStreamContext

from helmline.approval._handlers import ApprovalHandler
from helmline.approval._policy_source import PolicySource
from helmline.contracts import (
    Actor,
    ApprovalDecisionSubmitted,
    ApprovalGranted,
    ApprovalRequested,
    ApprovalVoteCounted,
    Event,
    StepScheduled,
    ToolCallAuthorized,
    ToolCallDenied,
)
from helmline.runtime import Delivery, EventsOfType, EventStore, FoldedStates, StoredEvent
from helmline.runtime.testing import session_started

POLICY = """
rules:
  - name: one-echo
    tool: echo
    at_most: {calls: 1, per: 10m}
    effect: allow
  - name: no-more-echoes
    tool: echo
    effect: deny
    reason: one echo per ten minutes
"""


ASK_FOR_ECHOES = "rules: [{name: ask, tool: echo, effect: require_approval}]\n"
APPROVER = Actor(id="bo", roles=("approver",))
SECOND_APPROVER = Actor(id="cy", roles=("approver",))
QUORUM_OF_TWO = "effect: require_approval\n    approval: {roles: [approver], quorum: 2}"


class CountingTogether(EventStore):
    """A replica's store whose first count waits until the other replica counted too, as
    when both are handed a call of one session at once. A count is a read of the session's
    authorisations, or of its whole log where a standing grant's uses are counted."""

    def __init__(self, js: JetStreamContext, both_counted: asyncio.Barrier) -> None:
        super().__init__(js)
        self._both_counted: asyncio.Barrier | None = both_counted

    async def read_since(
        self, tenant: str, session_id: str, event_type: str, *, since: datetime
    ) -> EventsOfType:
        counted = await super().read_since(tenant, session_id, event_type, since=since)
        await self._wait_for_the_other()
        return counted

    async def read_all(
        self,
        tenant: str,
        session_id: str,
        *,
        after_seq: int = 0,
        up_to_seq: int | None = None,
        known_seq: int = 0,
    ) -> list[StoredEvent]:
        log = await super().read_all(
            tenant, session_id, after_seq=after_seq, up_to_seq=up_to_seq, known_seq=known_seq
        )
        await self._wait_for_the_other()
        return log

    async def _wait_for_the_other(self) -> None:
        if self._both_counted is not None:
            barrier, self._both_counted = self._both_counted, None
            await barrier.wait()


def two_replicas(js: JetStreamContext, store: EventStore, policy: Path) -> list[ApprovalHandler]:
    both_counted = asyncio.Barrier(2)
    return [
        ApprovalHandler(
            CountingTogether(js, both_counted), FoldedStates(js, store), PolicySource(policy)
        )
        for _ in range(2)
    ]


def echo_scheduled(started: Event, step: str) -> Event:
    """The session's step `step` scheduled: an echo, whose call id is the step's."""
    return started.derive(
        StepScheduled(step_id=step, call_id=step, tool="echo", arguments={"message": step}),
        source="test",
        key=step,
    )


async def judge_at_once(
    replicas: list[ApprovalHandler], store: EventStore, started: Event, steps: tuple[str, str]
) -> None:
    """Schedule an echo for each step, and hand one to each replica at the same moment."""
    calls = [echo_scheduled(started, step) for step in steps]
    deliveries = [Delivery(call, (await store.append(call)).seq, 1) for call in calls]
    try:
        await asyncio.gather(
            *(replica(delivery) for replica, delivery in zip(replicas, deliveries, strict=True))
        )
    finally:
        for replica in replicas:
            await replica.close()


async def test_two_replicas_counting_at_once_let_no_more_calls_run_than_the_rule_allows(
    js: JetStreamContext, store: EventStore, tenant: str, tmp_path: Path
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    started = session_started(tenant)
    await store.append(started)

    await judge_at_once(two_replicas(js, store, policy), store, started, ("a", "b"))

    outcomes = {
        stored.event.data.call_id: stored.event.data
        for stored in await store.read_all(tenant, started.session_id)
        if isinstance(stored.event.data, ToolCallAuthorized | ToolCallDenied)
    }
    assert sorted(outcomes) == ["a", "b"]
    authorised = [o for o in outcomes.values() if isinstance(o, ToolCallAuthorized)]
    denied = [o for o in outcomes.values() if isinstance(o, ToolCallDenied)]
    assert [o.rule for o in authorised] == ["one-echo"]
    assert [o.rule for o in denied] == ["no-more-echoes"]


async def test_two_replicas_judging_at_once_use_a_standing_grant_no_more_than_its_limit(
    js: JetStreamContext, store: EventStore, tenant: str, tmp_path: Path
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(ASK_FOR_ECHOES)
    started = session_started(tenant)
    await store.append(started)
    # A person approves the first echo, and one more like it.
    first = ApprovalHandler(store, FoldedStates(js, store), PolicySource(policy))
    try:
        asked = echo_scheduled(started, "a")
        await first(Delivery(asked, (await store.append(asked)).seq, 1))
        vote = started.derive(
            ApprovalDecisionSubmitted(
                request_id="a", decision="grant", decided_by=APPROVER, similar_limit=1
            ),
            source="test",
        )
        await first(Delivery(vote, (await store.append(vote)).seq, 1))
    finally:
        await first.close()

    await judge_at_once(two_replicas(js, store, policy), store, started, ("b", "c"))

    log = [stored.event.data for stored in await store.read_all(tenant, started.session_id)]
    under_the_grant = [
        data.call_id
        for data in log
        if isinstance(data, ToolCallAuthorized) and data.approval_request_id == "a"
    ]
    asked_again = [
        data.call_id
        for data in log
        if isinstance(data, ApprovalRequested) and data.call_id in ("b", "c")
    ]
    assert len(under_the_grant) == 2  # The call approved, and one similar call.
    assert sorted([*under_the_grant[1:], *asked_again]) == ["b", "c"]


ASK_FOR_ONE_ECHO = POLICY.replace("effect: allow", "effect: require_approval")


async def asked_for(
    handler: ApprovalHandler, store: EventStore, started: Event, steps: tuple[str, ...]
) -> None:
    """Schedule an echo for each step, each of which the policy sends to a person."""
    for step in steps:
        asked = echo_scheduled(started, step)
        await handler(Delivery(asked, (await store.append(asked)).seq, 1))


def granted(started: Event, request_id: str, approver: Actor = APPROVER) -> Event:
    vote = ApprovalDecisionSubmitted(request_id=request_id, decision="grant", decided_by=approver)
    return started.derive(vote, source="test", key=f"{request_id}/{approver.id}")


async def test_two_replicas_granting_at_once_release_no_more_calls_than_the_rule_allows(
    js: JetStreamContext, store: EventStore, tenant: str, tmp_path: Path
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(ASK_FOR_ONE_ECHO)
    started = session_started(tenant)
    await store.append(started)
    first = ApprovalHandler(store, FoldedStates(js, store), PolicySource(policy))
    try:
        await asked_for(first, store, started, ("a", "b"))
    finally:
        await first.close()

    # People grant both requests at once; each vote goes to another replica.
    votes = [granted(started, request_id) for request_id in ("a", "b")]
    deliveries = [Delivery(vote, (await store.append(vote)).seq, 1) for vote in votes]
    replicas = two_replicas(js, store, policy)
    try:
        await asyncio.gather(
            *(replica(delivery) for replica, delivery in zip(replicas, deliveries, strict=True))
        )
    finally:
        for replica in replicas:
            await replica.close()

    log = [stored.event.data for stored in await store.read_all(tenant, started.session_id)]
    grants = [data.request_id for data in log if isinstance(data, ApprovalGranted)]
    authorised = [data for data in log if isinstance(data, ToolCallAuthorized)]
    denied = [data for data in log if isinstance(data, ToolCallDenied)]
    assert sorted(grants) == ["a", "b"]  # Both votes counted; one call ran.
    assert len(authorised) == 1
    assert [data.call_id for data in denied] == list({"a", "b"} - {authorised[0].call_id})
    assert "one echo per ten minutes" in denied[0].reason


async def test_a_vote_counted_towards_a_quorum_and_delivered_again_is_not_judged_anew(
    js: JetStreamContext, store: EventStore, tenant: str, tmp_path: Path
) -> None:
    """A vote whose decision the log holds (counted towards a quorum) is judged as it was
    first, not against the calls authorised since: it is not refused on redelivery."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(ASK_FOR_ONE_ECHO.replace("effect: require_approval", QUORUM_OF_TWO))
    started = session_started(tenant)
    await store.append(started)
    handler = ApprovalHandler(store, FoldedStates(js, store), PolicySource(policy))
    try:
        await asked_for(handler, store, started, ("a", "b"))
        first_for_b = granted(started, "b")
        seq = (await store.append(first_for_b)).seq
        await handler(Delivery(first_for_b, seq, 1))
        for approver in (APPROVER, SECOND_APPROVER):  # a runs, and uses up the count.
            vote = granted(started, "a", approver)
            await handler(Delivery(vote, (await store.append(vote)).seq, 1))
        handled = len(await store.read_all(tenant, started.session_id))

        await handler(Delivery(first_for_b, seq, 2))
    finally:
        await handler.close()

    log = [stored.event.data for stored in await store.read_all(tenant, started.session_id)]
    assert [data.call_id for data in log if isinstance(data, ToolCallAuthorized)] == ["a"]
    assert [data.request_id for data in log if isinstance(data, ApprovalVoteCounted)] == [
        "b",
        "a",
    ]
    assert len(log) == handled
