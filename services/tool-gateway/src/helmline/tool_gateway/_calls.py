"""How the gateway judges an authorised call before running it. Pure, except for the clock."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from helmline.contracts import (
    Payload,
    SandboxExecutionRequested,
    SandboxLimits,
    ToolCallAuthorized,
    ToolCallCompleted,
    ToolCallFailed,
    ToolError,
    ToolSpec,
)
from helmline.runtime import ArgumentChecker, make_error_safe

MAX_ARGUMENTS_BYTES = 1024 * 1024
"""Largest arguments document accepted (as JSON), whatever the tool's schema says."""


@dataclass(frozen=True, slots=True)
class RunOnServer:
    """The call goes to the MCP server that serves its tool."""

    tool: ToolSpec


def route(
    call: ToolCallAuthorized,
    tools: Mapping[str, ToolSpec],
    checker: ArgumentChecker,
    *,
    arguments_bytes: int = 0,
) -> Payload | RunOnServer:
    """The next step of an authorised call: its result, its failure, a sandbox request, or
    a call to an MCP server."""
    tool = tools.get(call.tool)
    if tool is None:
        return failed(
            call,
            ToolError(
                kind="not_found",
                message=f"no tool named {call.tool!r}",
                suggestion="use one of: " + ", ".join(sorted(tools)),
            ),
        )
    if arguments_bytes > MAX_ARGUMENTS_BYTES:
        return failed(
            call,
            ToolError(
                kind="validation",
                message=f"arguments are {arguments_bytes} bytes, more than the "
                f"{MAX_ARGUMENTS_BYTES} allowed",
                field="/",
                suggestion="pass large content by reference (a workspace file) instead",
            ),
        )
    problem = checker.problem(tool, call.arguments)
    if problem is not None:
        return failed(call, problem)
    match tool.executor:
        case "sandbox":
            return SandboxExecutionRequested(
                call_id=call.call_id,
                step_id=call.step_id,
                tool=call.tool,
                arguments=call.arguments,
                limits=SandboxLimits(timeout_s=tool.timeout_s),
                network=call.network,
                profile=call.sandbox_profile,
            )
        case "mcp":
            return RunOnServer(tool)
        case "gateway":
            return _run_pure(call)


def _run_pure(call: ToolCallAuthorized) -> Payload:
    began = time.perf_counter()
    match call.tool:
        case "echo":
            output = {"message": call.arguments["message"]}
        case _:
            return failed(
                call, ToolError(kind="internal", message=f"the gateway cannot run {call.tool!r}")
            )
    return ToolCallCompleted(
        call_id=call.call_id,
        step_id=call.step_id,
        tool=call.tool,
        output=output,
        duration_ms=(time.perf_counter() - began) * 1000,
    )


def failed(
    call: ToolCallAuthorized,
    error: ToolError,
    *,
    attempts: int = 1,
    duration_ms: float = 0.0,
    retry_in_s: float | None = None,
) -> ToolCallFailed:
    """The failure event of a call, its message made safe; `retry_in_s`: how long until trying
    again may succeed, where that is known."""
    error, safe = make_error_safe(error)
    return ToolCallFailed(
        call_id=call.call_id,
        step_id=call.step_id,
        tool=call.tool,
        error=error,
        redacted_by=dict(safe.redacted_by),
        neutralised_by=dict(safe.neutralised_by),
        attempts=attempts,
        duration_ms=duration_ms,
        retry_at=None if retry_in_s is None else datetime.now(UTC) + timedelta(seconds=retry_in_s),
    )
