"""Two replicas of every service, as the Helm chart runs them: a consumer's messages are
split between replicas whatever their session, and every session still runs as with one."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Iterator

import pytest

from helmline.contracts import (
    Actor,
    ApprovalDecisionSubmitted,
    PlanStep,
    Playbook,
    SessionCancelRequested,
    SessionState,
    new_event,
)
from helmline.runtime import EventStore
from helmline.runtime.testing import (
    ServiceProcesses,
    checkpointed,
    ended,
    eventually,
    start_playbook,
)

SERVICES = ("planner", "approval", "tool_gateway", "state", "sandbox")
POLICY = """
rules:
  - name: two-sre
    tool: run_command
    arguments: {command: {regex: '^echo '}}
    effect: require_approval
    approval: {roles: [sre], quorum: 2}
  - name: touch-expires-fast
    tool: run_command
    arguments: {command: {regex: '^touch '}}
    effect: require_approval
    approval: {roles: [approver], expires_in: 3s}
  - name: the-rest
    effect: allow
"""
REQUESTER = Actor(id="ana", roles=("operator",))
SESSIONS = 12


@pytest.fixture(scope="module")
def replicas(
    nats_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[ServiceProcesses]]:
    folder = tmp_path_factory.mktemp("replicas")
    policy = folder / "policy.yaml"
    policy.write_text(POLICY)
    # Each replica its own process, health port and log; all share the workspaces folder.
    pairs = [ServiceProcesses(nats_url, folder, {"HELMLINE_POLICY": str(policy)}) for _ in "ab"]
    try:
        for processes in pairs:
            for name in SERVICES:
                processes.start(name)
        yield pairs
    finally:
        for processes in pairs:
            processes.stop_all()


def fan_out_and_in(branches: int, tail: int) -> Playbook:
    """One step, `branches` steps after it, one step after all of them, then a chain."""
    steps = [PlanStep(id="a", tool="echo", arguments={"message": "a"})]
    steps += [
        PlanStep(id=f"b{i}", tool="echo", arguments={"message": "b"}, depends_on=("a",))
        for i in range(branches)
    ]
    steps.append(
        PlanStep(
            id="c",
            tool="echo",
            arguments={"message": "c"},
            depends_on=tuple(f"b{i}" for i in range(branches)),
        )
    )
    steps += [
        PlanStep(
            id=f"d{i}",
            tool="echo",
            arguments={"message": "d"},
            depends_on=(f"d{i - 1}",) if i else ("c",),
        )
        for i in range(tail)
    ]
    return Playbook(goal="fan out and in", steps=tuple(steps))


@pytest.mark.usefixtures("replicas")
async def test_sessions_fanning_out_and_in_complete_with_one_checkpoint_a_step(
    store: EventStore, tenant: str
) -> None:
    playbook = fan_out_and_in(branches=4, tail=6)
    sessions = [await start_playbook(store, tenant, playbook, REQUESTER) for _ in range(SESSIONS)]
    states = await asyncio.gather(*(ended(store, tenant, s) for s in sessions))
    for state in states:
        assert state.status == "completed", state.outcome
        assert all(step.attempts == 1 for step in state.steps.values())

    for session_id in sessions:
        state = await checkpointed(store, tenant, session_id)
        assert sorted(c.step_id for c in state.checkpoints) == sorted(s.id for s in playbook.steps)


@pytest.mark.usefixtures("replicas")
async def test_two_approvers_votes_make_the_quorum_whichever_replica_each_reaches(
    store: EventStore, tenant: str
) -> None:
    playbook = Playbook(
        goal="ask two",
        steps=(PlanStep(id="cmd", tool="run_command", arguments={"command": "echo hi"}),),
    )
    sessions = [await start_playbook(store, tenant, playbook, REQUESTER) for _ in range(6)]

    async def waiting(session_id: str) -> SessionState | None:
        state = (await store.load(tenant, session_id)).state
        return state if state.pending_approvals else None

    for session_id in sessions:
        state = await eventually(functools.partial(waiting, session_id), what="the request")
        (request,) = state.pending_approvals
        for approver in ("bob", "cem"):
            vote = ApprovalDecisionSubmitted(
                request_id=request.request_id,
                decision="grant",
                decided_by=Actor(id=approver, roles=("sre",)),
            )
            await store.append(new_event(vote, tenant=tenant, session_id=session_id, source="t"))
    for session_id in sessions:
        state = await ended(store, tenant, session_id)
        assert state.status == "completed", state.outcome
        (approval,) = state.approvals.values()
        assert sorted(actor.id for actor in approval.decided_by) == ["bob", "cem"]


@pytest.mark.usefixtures("replicas")
async def test_a_cancel_kills_the_running_command_whichever_sandbox_runs_it(
    store: EventStore, tenant: str
) -> None:
    playbook = Playbook(
        goal="sleep",
        steps=(PlanStep(id="nap", tool="run_command", arguments={"command": "sleep 60"}),),
    )
    # Each cancel reaches one sandbox replica; the command runs on either.
    sessions = [await start_playbook(store, tenant, playbook, REQUESTER) for _ in range(4)]

    async def running(session_id: str) -> bool:
        state = (await store.load(tenant, session_id)).state
        nap = state.steps.get("nap")  # None until the plan is laid out.
        return nap is not None and nap.status == "running"

    for session_id in sessions:
        await eventually(functools.partial(running, session_id), what="the command to run")
    cancel = SessionCancelRequested(requested_by=REQUESTER, reason="enough")
    began = asyncio.get_running_loop().time()
    for session_id in sessions:
        await store.append(new_event(cancel, tenant=tenant, session_id=session_id, source="t"))

    async def killed(session_id: str) -> SessionState | None:
        state = (await store.load(tenant, session_id)).state
        return state if state.steps["nap"].status == "failed" else None

    for session_id in sessions:
        state = await eventually(functools.partial(killed, session_id), what="the command killed")
        assert state.status == "cancelled"
    assert asyncio.get_running_loop().time() - began < 10  # Not the minute the nap takes.


async def test_a_request_expires_though_the_replica_it_was_handed_to_stopped_for_good(
    replicas: list[ServiceProcesses], store: EventStore, tenant: str
) -> None:
    playbook = Playbook(
        goal="touch",
        steps=(PlanStep(id="t", tool="run_command", arguments={"command": "touch x"}),),
    )
    # Each request is handed to one approval replica; about half of them to the one stopped.
    sessions = [await start_playbook(store, tenant, playbook, REQUESTER) for _ in range(4)]

    async def waiting(session_id: str) -> bool:
        return bool((await store.load(tenant, session_id)).state.pending_approvals)

    for session_id in sessions:
        await eventually(functools.partial(waiting, session_id), what="the request")
    replicas[0].kill("approval")
    try:
        for session_id in sessions:
            state = await ended(store, tenant, session_id)
            assert state.status == "failed"
            assert [a.status for a in state.approvals.values()] == ["expired"]
    finally:
        await asyncio.to_thread(replicas[0].start, "approval")
