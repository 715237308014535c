"""How the gateway judges an authorised call before running it. Pure, except for the clock."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

from jsonschema import Draft202012Validator

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

MAX_ARGUMENTS_BYTES = 1024 * 1024
"""Largest arguments document accepted (as JSON), whatever the tool's schema says."""


@dataclass(frozen=True, slots=True)
class RunOnServer:
    """The call goes to the MCP server that serves its tool."""

    tool: ToolSpec


class Validators:
    """Compiled JSON Schema validators, one per tool, rebuilt when a tool's schema changes."""

    def __init__(self) -> None:
        self._compiled: dict[str, tuple[ToolSpec, Draft202012Validator]] = {}

    def of(self, tool: ToolSpec) -> Draft202012Validator:
        """The validator of a tool's arguments."""
        known = self._compiled.get(tool.name)
        if known is None or known[0] is not tool:
            known = (tool, Draft202012Validator(tool.parameters))
            self._compiled[tool.name] = known
        return known[1]


def route(
    call: ToolCallAuthorized,
    tools: Mapping[str, ToolSpec],
    validators: Validators,
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
    problem = invalid_argument(validators.of(tool), call.arguments)
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


def invalid_argument(
    validator: Draft202012Validator, arguments: Mapping[str, object]
) -> ToolError | None:
    """The first schema violation of a call's arguments, naming the field, or None."""
    error = next(iter(sorted(validator.iter_errors(arguments), key=lambda e: e.path)), None)
    if error is None:
        return None
    field = "/" + "/".join(str(part) for part in error.absolute_path)
    return ToolError(
        kind="validation",
        message=f"argument {field}: {error.message}",
        field=field,
        suggestion="fix the argument to match the tool's schema",
    )


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
    call: ToolCallAuthorized, error: ToolError, *, attempts: int = 1, duration_ms: float = 0.0
) -> ToolCallFailed:
    """The failure event of a call."""
    return ToolCallFailed(
        call_id=call.call_id,
        step_id=call.step_id,
        tool=call.tool,
        error=error,
        attempts=attempts,
        duration_ms=duration_ms,
    )
