"""How the gateway turns an authorised call into its outcome. Pure, except for the clock."""

from __future__ import annotations

import time
from collections.abc import Mapping

from jsonschema import Draft202012Validator

from helmline.contracts import (
    BUILTIN_TOOLS,
    Payload,
    SandboxExecutionRequested,
    SandboxLimits,
    ToolCallAuthorized,
    ToolCallCompleted,
    ToolCallFailed,
    ToolError,
    ToolSpec,
)

_TOOLS: dict[str, tuple[ToolSpec, Draft202012Validator]] = {
    tool.name: (tool, Draft202012Validator(tool.parameters)) for tool in BUILTIN_TOOLS
}


def route(call: ToolCallAuthorized) -> Payload:
    """The next event of an authorised call: its result, its failure, or a sandbox request."""
    known = _TOOLS.get(call.tool)
    if known is None:
        return _failed(
            call,
            ToolError(
                kind="not_found",
                message=f"no tool named {call.tool!r}",
                suggestion="use one of: " + ", ".join(sorted(_TOOLS)),
            ),
        )
    tool, validator = known
    problem = invalid_argument(validator, call.arguments)
    if problem is not None:
        return _failed(call, problem)
    if tool.executor == "sandbox":
        return SandboxExecutionRequested(
            call_id=call.call_id,
            step_id=call.step_id,
            tool=call.tool,
            arguments=call.arguments,
            limits=SandboxLimits(timeout_s=tool.timeout_s),
            network=call.network,
            profile=call.sandbox_profile,
        )
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
            return _failed(
                call, ToolError(kind="internal", message=f"the gateway cannot run {call.tool!r}")
            )
    return ToolCallCompleted(
        call_id=call.call_id,
        step_id=call.step_id,
        tool=call.tool,
        output=output,
        duration_ms=(time.perf_counter() - began) * 1000,
    )


def _failed(call: ToolCallAuthorized, error: ToolError) -> ToolCallFailed:
    return ToolCallFailed(call_id=call.call_id, step_id=call.step_id, tool=call.tool, error=error)
