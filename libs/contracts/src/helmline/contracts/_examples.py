"""One example of every event type: documentation for subscribers, checked by the tests."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from helmline.contracts._catalogue import (
    Alternative,
    ApiKeyCreated,
    ApiKeyRevoked,
    ApiKeyRotated,
    ApprovalDecisionRefused,
    ApprovalDecisionSubmitted,
    ApprovalDenied,
    ApprovalExpired,
    ApprovalGranted,
    ApprovalRequested,
    ApprovalVoteCounted,
    CheckpointCreated,
    CompensationCompleted,
    CompensationFailed,
    CompensationScheduled,
    ContextCompacted,
    LoopDetected,
    ModelExchangeRecorded,
    Payload,
    PermissionNeed,
    PermissionRequested,
    PlanApproved,
    PlanProposed,
    PlanRejected,
    RollbackCompleted,
    RollbackFailed,
    RollbackRefused,
    RollbackRequested,
    SandboxExecutionRequested,
    SandboxLimitApproached,
    SandboxLimitExceeded,
    SessionCancelled,
    SessionCancelRequested,
    SessionCompleted,
    SessionFailed,
    SessionPaused,
    SessionPauseRequested,
    SessionResumed,
    SessionResumeRequested,
    SessionStarted,
    StepAuthorization,
    StepRetryDeferred,
    StepScheduled,
    StepSkipped,
    StreamLimitApproaching,
    ThoughtRecorded,
    ToolCallAttemptFailed,
    ToolCallAuthorized,
    ToolCallCompleted,
    ToolCallDenied,
    ToolCallFailed,
    ToolCallStarted,
    ToolCircuitChanged,
    ToolRegistryPublished,
    ToolServerHealthChanged,
    ToolServerStatus,
    WorkspaceRestored,
    WorkspaceSnapshotsPruned,
    WorkspaceSnapshotted,
    call_digest,
)
from helmline.contracts._envelope import Event, new_event
from helmline.contracts._exchanges import (
    ModelMessage,
    ModelReply,
    ModelRequestRecord,
    ModelToolCall,
    ModelUsage,
)
from helmline.contracts._plans import PlanStep, Playbook
from helmline.contracts._tools import BUILTIN_TOOLS_BY_NAME, ToolSpec
from helmline.contracts._values import (
    Actor,
    ClassifierVerdict,
    LimitHit,
    ResourceUsage,
    ToolError,
)

_ANA = Actor(id="ana", kind="user", roles=("operator", "approver"))
_POLICY = Actor(id="default-policy", kind="policy")
_AT = datetime(2026, 11, 30, 9, 30, tzinfo=UTC)
_WRITE = PlanStep(
    id="write",
    description="Write the note",
    tool="write_file",
    arguments={"path": "notes.txt", "content": "hello"},
)
_COUNT = PlanStep(
    id="count",
    description="Count its bytes",
    tool="run_command",
    arguments={"command": "wc -c notes.txt"},
    depends_on=("write",),
)
_CALL = {"call_id": "count.1", "step_id": "count", "tool": "run_command"}
_UNDO = {"rollback_id": "rb-1", "compensation_id": "undo-write", "step_id": "write"}

EXAMPLE_PAYLOADS: tuple[Payload, ...] = (
    SessionStarted(
        goal="Write a note and count its bytes",
        requested_by=_ANA,
        playbook=Playbook(goal="Write a note and count its bytes", steps=(_WRITE, _COUNT)),
        labels={"team": "docs"},
    ),
    SessionPauseRequested(requested_by=_ANA, reason="lunch"),
    SessionPaused(),
    SessionResumeRequested(requested_by=_ANA),
    SessionResumed(),
    SessionCancelRequested(requested_by=_ANA, reason="wrong goal"),
    SessionCancelled(reason="wrong goal"),
    SessionCompleted(summary="2 of 2 steps succeeded"),
    SessionFailed(reason="step 'count' was denied: denied by ana", step_id="count"),
    ThoughtRecorded(
        kind="decision",
        text="Count the bytes with wc",
        confidence=0.9,
        alternatives=(
            Alternative(
                option="read the file and count in Python", reason="wc is simpler and auditable"
            ),
        ),
    ),
    PlanProposed(
        revision=1,
        steps=(_WRITE, _COUNT),
        reasoning="declared playbook",
        confidence=1.0,
        permissions=("run_command", "write_file"),
    ),
    PlanApproved(
        revision=1,
        approved_by=_POLICY,
        policy_hash="sha256:9f2c",
        authorized_steps=(
            StepAuthorization(
                step_id="write",
                call_digest=call_digest(_WRITE.tool, _WRITE.arguments),
                risk="medium",
                rule="workspace-writes",
            ),
        ),
    ),
    PlanRejected(revision=1, reason="plans touching production need a person", rejected_by=_POLICY),
    ModelExchangeRecorded(
        turn=1,
        purpose="plan",
        provider="openai",
        request=ModelRequestRecord(
            model="gpt-4o-mini",
            system="You are Helmline's planner.",
            messages=(ModelMessage(role="user", content="Goal: write a note and count its bytes"),),
            tools=("create_plan", "write_file", "run_command"),
        ),
        reply=ModelReply(
            content="Two steps: write, then count.",
            tool_calls=(
                ModelToolCall(
                    id="call_1", name="create_plan", arguments='{"steps": [], "reasoning": "..."}'
                ),
            ),
            stop_reason="tool_calls",
            usage=ModelUsage(input_tokens=812, output_tokens=95),
        ),
        cost_usd=0.000179,
        duration_ms=640.0,
    ),
    ContextCompacted(
        turn=12,
        budget_tokens=8000,
        tokens_before=7100,
        tokens_after=2300,
        dropped_messages=18,
        kept=("step read (read_file): succeeded", "plan revision 2: write then count"),
    ),
    LoopDetected(calls=('read_file {"path": "notes.txt"}',), repeats=3),
    ApprovalRequested(
        request_id="count.1",
        scope="step",
        step_id="count",
        call_id="count.1",
        tool="run_command",
        arguments={"command": "wc -c notes.txt"},
        risk="high",
        reason="high-risk tool calls need a person's approval",
        rule="default: require approval for high and critical risk",
        approver_roles=("approver",),
        expires_at=_AT,
    ),
    PermissionRequested(
        request_id="permission-fetch.1",
        scope="step",
        step_id="fetch",
        call_id="fetch.1",
        tool="run_command",
        arguments={"command": "curl -s https://api.example.com/status"},
        risk="high",
        reason="the call needs network host api.example.com, which rule commands-offline "
        "does not grant",
        rule="commands-offline",
        approver_roles=("approver", "admin"),
        expires_at=_AT,
        permissions=(
            PermissionNeed(
                kind="network",
                name="api.example.com",
                reason="rule commands-offline grants no network host",
            ),
        ),
    ),
    ApprovalDecisionSubmitted(
        request_id="count.1", decision="grant", decided_by=_ANA, comment="fine"
    ),
    ApprovalGranted(request_id="count.1", decided_by=(_ANA,), comment="fine"),
    ApprovalDenied(request_id="count.1", decided_by=_ANA, comment="not now"),
    ApprovalDecisionRefused(
        request_id="count.1",
        decided_by=Actor(id="eve", kind="user", roles=("viewer",)),
        reason="eve holds none of the roles that may decide (approver)",
    ),
    ApprovalVoteCounted(request_id="count.1", decided_by=_ANA, grants=1, quorum=2),
    ApprovalExpired(request_id="count.1"),
    StepScheduled(
        step_id="count",
        call_id="count.1",
        tool="run_command",
        arguments={"command": "wc -c notes.txt"},
    ),
    StepSkipped(step_id="count", reason="denied: not now"),
    StepRetryDeferred(
        step_id="count",
        call_id="count.1",
        retry_at=_AT,
        reason="the circuit of MCP server tickets is open",
    ),
    ToolCallAuthorized(
        **_CALL,
        arguments={"command": "wc -c notes.txt"},
        risk="high",
        approval_request_id="count.1",
    ),
    ToolCallDenied(**_CALL, reason="denied by ana: not now", approval_request_id="count.1"),
    ToolCallStarted(**_CALL),
    ToolCallCompleted(
        **_CALL,
        output={"exit_code": 0, "stdout": "5 notes.txt\n"},
        duration_ms=3.2,
        classifier=ClassifierVerdict(
            endpoint="classifier.internal:8080", verdict="clean", score=0.02, elapsed_ms=41.0
        ),
    ),
    ToolCallFailed(
        **_CALL,
        error=ToolError(kind="timeout", message="ran longer than 60 s", retryable=True),
        duration_ms=60000,
    ),
    ToolCallAttemptFailed(
        **_CALL,
        attempt=1,
        error=ToolError(kind="unavailable", message="server git: connection reset", retryable=True),
        retry_in_s=0.07,
    ),
    ToolRegistryPublished(
        tools=(
            BUILTIN_TOOLS_BY_NAME["echo"],
            ToolSpec(
                name="time__get_current_time",
                description="Get the current time in a timezone.",
                parameters={
                    "type": "object",
                    "properties": {"timezone": {"type": "string"}},
                    "required": ["timezone"],
                },
                risk="low",
                executor="mcp",
                server="time",
                remote_name="get_current_time",
                idempotent=True,
            ),
        ),
        servers=(
            ToolServerStatus(server="time", transport="stdio", available=True, tools=1),
            ToolServerStatus(
                server="tickets", transport="http", available=False, error="connection refused"
            ),
        ),
    ),
    ToolCircuitChanged(
        server="tickets",
        state="open",
        previous="closed",
        failures=5,
        reason="timed out after 10 s",
        retry_at=_AT,
    ),
    ToolServerHealthChanged(
        server="git",
        transport="stdio",
        health="dead",
        previous="healthy",
        reason="its process exited",
        restarts=1,
        retry_at=_AT,
        gateway="gateway-7d9f/41",
    ),
    SandboxExecutionRequested(**_CALL, arguments={"command": "wc -c notes.txt"}),
    SandboxLimitApproached(
        **{k: v for k, v in _CALL.items() if k != "tool"},
        limit=LimitHit(limit="memory", value=256, command="python big.py"),
        used=231,
        usage=ResourceUsage(wall_ms=600, peak_memory_mb=231),
    ),
    SandboxLimitExceeded(
        **{k: v for k, v in _CALL.items() if k != "tool"},
        hit=LimitHit(limit="memory", value=256, command="python big.py"),
        usage=ResourceUsage(wall_ms=850, peak_memory_mb=256),
    ),
    WorkspaceSnapshotted(
        snapshot_id="snap-7", call_id="write.1", files=1, bytes=5, digest="sha256:2cf24dba5fb0a30e"
    ),
    WorkspaceRestored(snapshot_id="snap-6", compensation_id="undo-write"),
    WorkspaceSnapshotsPruned(
        snapshot_ids=("snap-2", "snap-3"),
        reason="a session keeps its newest 100 workspace snapshots",
    ),
    CheckpointCreated(
        checkpoint_id="cp-count.1",
        step_id="count",
        call_id="count.1",
        at_seq=42,
        snapshot_id="snap-7",
        reversible=True,
        compensation="restore the workspace to the previous checkpoint's snapshot",
        tool="run_command",
        effect="workspace",
    ),
    RollbackRequested(rollback_id="rb-1", checkpoint_id="cp-write.1", requested_by=_ANA),
    RollbackRefused(
        rollback_id="rb-1", reason="step 'deploy' cannot be undone", blocking_steps=("deploy",)
    ),
    CompensationScheduled(**_UNDO, kind="restore_workspace", snapshot_id="snap-6"),
    CompensationCompleted(**_UNDO),
    CompensationFailed(
        **_UNDO,
        error=ToolError(kind="unavailable", message="snapshot store unreachable", retryable=True),
    ),
    RollbackCompleted(rollback_id="rb-1", checkpoint_id="cp-write.1", undone_steps=("count",)),
    RollbackFailed(
        rollback_id="rb-1",
        checkpoint_id="cp-write.1",
        reason="an undo failed",
        undone_steps=("count",),
        not_undone_steps=("write",),
    ),
    StreamLimitApproaching(
        stream="HELMLINE_EVENTS",
        limit="bytes",
        used=0.83,
        limit_value=10 * 1024**3,
        current_value=0.83 * 10 * 1024**3,
        oldest_at=_AT,
    ),
    ApiKeyCreated(
        key_id="3f9a6c0d2b7e4158",
        tenant="acme",
        roles=("operator",),
        permissions=("repo.write",),
        name="ci",
        expires_at=datetime(2026, 6, 1, 9, 30, tzinfo=UTC),
        by=Actor(id="ana", roles=("admin",)),
    ),
    ApiKeyRotated(
        key_id="3f9a6c0d2b7e4158",
        tenant="acme",
        expires_at=datetime(2026, 9, 1, 9, 30, tzinfo=UTC),
        by=Actor(id="ana", roles=("admin",)),
    ),
    ApiKeyRevoked(
        key_id="3f9a6c0d2b7e4158",
        tenant="acme",
        reason="the CI runner's disk was shared",
        by=Actor(id="ana", roles=("admin",)),
    ),
)
"""An example payload of every event type, in catalogue order."""


def example_event(payload: Payload) -> Event:
    """The example payload in a complete, stable envelope."""
    return new_event(
        payload,
        tenant="acme",
        session_id="7f3c2a1b9d8e4f60a1b2c3d4e5f60718",
        source="helmline/example",
        at=_AT,
        event_id=uuid.uuid5(uuid.NAMESPACE_URL, f"helmline:example:{payload.TYPE}"),
        traceparent="00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    )
