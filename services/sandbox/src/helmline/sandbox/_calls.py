"""The events that record how a call went, and the ids a call's redeliveries share. Pure."""

from __future__ import annotations

import uuid
from typing import assert_never

from helmline.contracts import (
    EVENTS_STREAM,
    MAX_EGRESS_REFUSED,
    Event,
    FileChanges,
    LimitHit,
    ResourceUsage,
    SandboxExecutionRequested,
    SandboxLimitApproached,
    SandboxLimitExceeded,
    ToolCallCompleted,
    ToolCallFailed,
    ToolCallStarted,
    ToolError,
    WorkspaceSnapshotted,
    encode_event,
    source_of,
)
from helmline.runtime import SafeOutput, make_error_safe, make_safe
from helmline.sandbox._snapshots import Snapshot
from helmline.sandbox._tools import Completed, Failed, Outcome

SOURCE = source_of("sandbox")

INTERRUPTED = ToolError(
    kind="internal",
    message="interrupted: the sandbox stopped while the call ran; not re-run so it cannot "
    "run twice",
    retryable=False,
    suggestion="check the workspace for partial effects before running it again",
)
CANCELLED_BEFORE_START = ToolError(
    kind="cancelled",
    message="the session was cancelled before the call started; it did not run",
)

_ENVELOPE_ROOM = 4096
"""Bytes kept free in a message for the envelope and headers around a call's output."""


def process_marker(cause: Event) -> str:
    """The marker of the processes a request runs; the same for every delivery of it."""
    return uuid.uuid5(cause.id, f"{SOURCE}/processes").hex


MUTATING_TOOLS = frozenset({"write_file", "delete_file", "run_command"})
"""Built-in tools that may change the workspace: a snapshot is taken around each call."""


def snapshot_id(cause: Event, when: str) -> str:
    """The id of the snapshot taken `when` ("before" or "after") a request's call; the same
    for every delivery of it."""
    return f"snap-{uuid.uuid5(cause.id, f'{SOURCE}/snapshot/{when}').hex}"


def snapshotted(
    cause: Event, snapshot: Snapshot, call_id: str | None, changes: FileChanges | None = None
) -> Event:
    """`workspace.snapshotted` for a snapshot taken after `call_id` (None: before any), and
    what the call changed."""
    return cause.derive(
        WorkspaceSnapshotted(
            snapshot_id=snapshot.snapshot_id,
            call_id=call_id,
            files=snapshot.files,
            bytes=snapshot.bytes,
            digest=snapshot.digest,
            changes=changes,
            irreversible_reason=snapshot.refused,
        ),
        source=SOURCE,
        key=snapshot.snapshot_id,
    )


def approached(
    cause: Event,
    request: SandboxExecutionRequested,
    hit: LimitHit,
    used: float,
    usage: ResourceUsage,
) -> Event:
    """`sandbox.limit_approached`: the running call has used 90 % of a limit."""
    return cause.derive(
        SandboxLimitApproached(
            call_id=request.call_id, step_id=request.step_id, limit=hit, used=used, usage=usage
        ),
        source=SOURCE,
        key=hit.limit,
    )


def started(cause: Event, request: SandboxExecutionRequested) -> Event:
    """`tool.call.started`, recorded before the call runs."""
    return cause.derive(
        ToolCallStarted(call_id=request.call_id, step_id=request.step_id, tool=request.tool),
        source=SOURCE,
    )


def failed(
    cause: Event,
    request: SandboxExecutionRequested,
    error: ToolError,
    duration_ms: float = 0.0,
    usage: ResourceUsage | None = None,
    egress_refused: tuple[str, ...] = (),
) -> Event:
    """`tool.call.failed` with a structured error, its message made safe; `egress_refused`:
    the connections its command was refused.

    Every failure of a call derives the same id, so at most one is stored.
    """
    error, safe = make_error_safe(error)
    return cause.derive(
        ToolCallFailed(
            call_id=request.call_id,
            step_id=request.step_id,
            tool=request.tool,
            error=error,
            redacted_by=dict(safe.redacted_by),
            neutralised_by=dict(safe.neutralised_by),
            duration_ms=duration_ms,
            usage=usage,
            egress_refused=egress_refused[:MAX_EGRESS_REFUSED],
        ),
        source=SOURCE,
    )


def safe_output(outcome: Completed) -> SafeOutput:
    """A completed call's output made safe, cut to what an event can hold. Both backends'
    results pass here: nothing a built-in tool read or a command printed reaches the log
    unredacted."""
    return make_safe(outcome.output, max_bytes=EVENTS_STREAM.max_msg_size - _ENVELOPE_ROOM)


def results(
    cause: Event,
    request: SandboxExecutionRequested,
    outcome: Outcome,
    duration_ms: float,
    safe: SafeOutput | None = None,
) -> list[Event]:
    """The events that close a call: a limit hit, if any, then completed or failed. `safe`:
    a completed call's `safe_output`, as the caller had it judged by the injection
    classifier, if any; made here when not given."""
    match outcome:
        case Completed(truncated=truncated, exit_code=exit_code, usage=usage):
            refused = outcome.egress_refused
            safe = safe if safe is not None else safe_output(outcome)
            completed = cause.derive(
                ToolCallCompleted(
                    call_id=request.call_id,
                    step_id=request.step_id,
                    tool=request.tool,
                    output=safe.output,
                    duration_ms=duration_ms,
                    truncated=truncated or safe.truncated,
                    redactions=safe.redactions,
                    redacted_by=dict(safe.redacted_by),
                    injection_suspected=safe.injection_suspected,
                    neutralised=safe.neutralised,
                    neutralised_by=dict(safe.suspected_by),
                    exit_code=exit_code,
                    usage=usage,
                    classifier=safe.classifier,
                    egress_refused=refused[:MAX_EGRESS_REFUSED],
                ),
                source=SOURCE,
            )
            size = len(encode_event(completed))
            if size + _ENVELOPE_ROOM > EVENTS_STREAM.max_msg_size:
                return [failed(cause, request, _too_large(size), duration_ms, None, refused)]
            return [completed]
        case Failed(error=error, limit=limit, usage=usage):
            events: list[Event] = []
            if limit is not None:
                events.append(
                    cause.derive(
                        SandboxLimitExceeded(
                            call_id=request.call_id,
                            step_id=request.step_id,
                            hit=limit,
                            usage=usage or ResourceUsage(wall_ms=duration_ms),
                        ),
                        source=SOURCE,
                    )
                )
            events.append(failed(cause, request, error, duration_ms, usage, outcome.egress_refused))
            return events
        case _:
            assert_never(outcome)


def _too_large(size: int) -> ToolError:
    return ToolError(
        kind="limit",
        message=f"the call's output ({size} bytes as an event) is too large to record; "
        "it ran, but its output is lost",
        suggestion="lower max_output_bytes, or write the output to a file and read parts",
    )
