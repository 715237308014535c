"""Time travel through stored folded states: the state at every sequence equals the fold of
the log up to there, whichever stored state it starts from."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from nats.js import JetStreamContext

from helmline.contracts import (
    SESSION_STATES_BUCKET,
    Actor,
    ApprovalGranted,
    ApprovalRequested,
    CheckpointCreated,
    CompensationCompleted,
    CompensationScheduled,
    Event,
    Payload,
    PlanApproved,
    PlanProposed,
    PlanStep,
    Playbook,
    RollbackCompleted,
    RollbackRequested,
    SessionStarted,
    StepScheduled,
    ThoughtRecorded,
    ToolCallAuthorized,
    ToolCallCompleted,
    ToolCallStarted,
    WorkspaceSnapshotted,
    fold,
    new_event,
)
from helmline.runtime import EventStore, FoldedStates

ANA = Actor(id="ana", roles=("approver",))
STEPS = 50


def fifty_steps(tenant: str, session_id: str) -> list[Event]:
    """A 50-step session with approvals, thoughts, snapshots, checkpoints and a rollback."""
    playbook = Playbook(
        goal="fifty",
        steps=tuple(PlanStep(id=f"s{i}", tool="write_file") for i in range(STEPS)),
    )
    root = new_event(
        SessionStarted(goal="fifty", playbook=playbook, requested_by=ANA),
        tenant=tenant,
        session_id=session_id,
        source="test",
    )
    payloads: list[Payload] = [
        PlanProposed(revision=1, steps=playbook.steps),
        PlanApproved(revision=1, approved_by=ANA),
    ]
    for i in range(STEPS):
        step, call = f"s{i}", f"s{i}.1"
        arguments = {"path": f"f{i}.txt", "content": str(i)}
        payloads.append(StepScheduled(step_id=step, call_id=call, tool="write_file"))
        if i % 7 == 0:
            payloads += [
                ApprovalRequested(
                    request_id=call,
                    scope="step",
                    step_id=step,
                    call_id=call,
                    tool="write_file",
                    risk="high",
                    reason="policy",
                    expires_at=datetime(2030, 1, 1, tzinfo=UTC) + timedelta(minutes=i),
                ),
                ApprovalGranted(request_id=call, decided_by=(ANA,)),
            ]
        if i % 5 == 0:
            payloads.append(ThoughtRecorded(kind="reasoning", text=f"on to {step}", step_id=step))
        payloads += [
            ToolCallAuthorized(
                call_id=call, step_id=step, tool="write_file", arguments=arguments, risk="medium"
            ),
            ToolCallStarted(call_id=call, step_id=step, tool="write_file"),
            WorkspaceSnapshotted(snapshot_id=f"snap-{i}", call_id=call, files=i + 1),
            ToolCallCompleted(call_id=call, step_id=step, tool="write_file", output={"bytes": i}),
            CheckpointCreated(
                checkpoint_id=f"cp-{call}",
                step_id=step,
                call_id=call,
                at_seq=1 + len(payloads),
                snapshot_id=f"snap-{i}",
                effect="workspace",
            ),
        ]
    undo = {"rollback_id": "rb", "compensation_id": "rb.undo1", "step_id": "s49"}
    payloads += [
        RollbackRequested(rollback_id="rb", checkpoint_id="cp-s47.1", requested_by=ANA),
        CompensationScheduled(
            **undo, kind="restore_workspace", snapshot_id="snap-47", steps=("s49", "s48")
        ),
        CompensationCompleted(**undo, steps=("s49", "s48")),
        RollbackCompleted(rollback_id="rb", checkpoint_id="cp-s47.1", undone_steps=("s49", "s48")),
    ]
    return [root] + [
        root.derive(payload, source="test", key=str(index))
        for index, payload in enumerate(payloads)
    ]


async def test_the_state_at_every_sequence_of_a_50_step_session_is_the_fold_of_that_prefix(
    js: JetStreamContext, store: EventStore, tenant: str
) -> None:
    events = fifty_steps(tenant, "fifty")
    other = fifty_steps(tenant, "other")
    states = FoldedStates(js, store, every=40)
    seqs: list[int] = []
    stored = 0
    # Another session's events lie between, as on a busy log.
    for mine, theirs in zip(events, other, strict=True):
        seqs.append((await store.append(mine)).seq)
        await store.append(theirs)
        stored += await states.keep_up(tenant, "fifty", seqs[-1])
    assert stored >= 5

    for index, seq in enumerate(seqs):
        snapshot = await states.load(tenant, "fifty", up_to_seq=seq)
        assert snapshot.last_seq == seq
        assert snapshot.state == fold(events[: index + 1]), f"at sequence {seq}"
    latest = await states.load(tenant, "fifty")
    assert latest.state == fold(events)
    assert latest.state.status == "paused"


async def test_a_damaged_stored_state_is_passed_over_for_the_log(
    js: JetStreamContext, store: EventStore, tenant: str
) -> None:
    events = fifty_steps(tenant, "damaged")[:60]
    states = FoldedStates(js, store, every=20)
    for event in events:
        seq = (await store.append(event)).seq
        await states.keep_up(tenant, "damaged", seq)
    bucket = await js.key_value(SESSION_STATES_BUCKET.bucket)
    for key in await bucket.keys():
        if f".{tenant}.damaged." in key and not key.endswith(".index"):
            await bucket.put(key, b"not a folded state")

    assert (await states.load(tenant, "damaged")).state == fold(events)
