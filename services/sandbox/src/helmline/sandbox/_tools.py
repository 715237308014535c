"""Carrying out one sandboxed call: the built-in tools, and how each one ended."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Concatenate, ParamSpec, TypeVar

from pydantic import JsonValue

from helmline.contracts import LimitHit, SandboxExecutionRequested, ToolError
from helmline.sandbox._commands import CommandControl, run_shell
from helmline.sandbox._errors import ToolRefused
from helmline.sandbox._files import delete_file, list_files, read_file, write_file
from helmline.sandbox._output import cut_marker, cut_text


@dataclass(frozen=True, slots=True)
class Completed:
    """The call did its work."""

    output: JsonValue
    """What it returns, as JSON."""
    truncated: bool = False
    """Whether part of the output was cut to the cap."""


@dataclass(frozen=True, slots=True)
class Failed:
    """The call could not do its work."""

    error: ToolError
    """Why, for the planner and for people."""
    limit: LimitHit | None = None
    """The resource limit that stopped it, if one did."""


Outcome = Completed | Failed

P = ParamSpec("P")
R = TypeVar("R")


async def execute(
    request: SandboxExecutionRequested, workspace: Path, control: CommandControl
) -> Outcome:
    """Run one built-in tool in a session's workspace, creating the workspace if needed.

    A cancel kills a running command; file tools are too short to interrupt.
    """
    arguments = request.arguments
    cap = request.limits.max_output_bytes
    try:
        match request.tool:
            case "read_file":
                path = _string(arguments, "path")
                output, truncated = await _in_workspace(workspace, read_file, path, cap)
                return Completed(output, truncated)
            case "write_file":
                path, content = _string(arguments, "path"), _string(arguments, "content")
                return Completed(await _in_workspace(workspace, write_file, path, content))
            case "list_files":
                path = _string(arguments, "path", default=".")
                output, truncated = await _in_workspace(workspace, list_files, path, cap)
                return Completed(output, truncated)
            case "delete_file":
                path = _string(arguments, "path")
                return Completed(await _in_workspace(workspace, delete_file, path))
            case "run_command":
                return await _run_command(request, workspace, control)
            case other:
                raise ToolRefused(
                    ToolError(
                        kind="validation",
                        message=f"the sandbox does not run the tool {other!r}",
                        suggestion="use read_file, write_file, list_files, delete_file or "
                        "run_command",
                    )
                )
    except ToolRefused as refused:
        return Failed(refused.error)


async def _run_command(
    request: SandboxExecutionRequested, workspace: Path, control: CommandControl
) -> Outcome:
    command = _string(request.arguments, "command")
    timeout_s = _timeout(request)
    cap = request.limits.max_output_bytes
    await asyncio.to_thread(workspace.mkdir, parents=True, exist_ok=True)
    run = await run_shell(command, workspace, timeout_s=timeout_s, cap=cap, control=control)
    match run.ended:
        case "timeout":
            return Failed(
                ToolError(
                    kind="timeout",
                    message=f"the command ran longer than {timeout_s:g} s and was killed",
                    suggestion="raise timeout_s, or make the command finish sooner",
                ),
                LimitHit(limit="timeout", value=timeout_s, command=command),
            )
        case "cancelled":
            return Failed(
                ToolError(
                    kind="cancelled",
                    message="the session was cancelled while the command ran; it was killed",
                )
            )
        case "exited":
            stdout, stdout_truncated = _cut_stream(run.stdout, run.stdout_total, cap)
            stderr, stderr_truncated = _cut_stream(run.stderr, run.stderr_total, cap)
            return Completed(
                {
                    "exit_code": run.exit_code,
                    "stdout": stdout,
                    "stderr": stderr,
                    "stdout_truncated": stdout_truncated,
                    "stderr_truncated": stderr_truncated,
                },
                stdout_truncated or stderr_truncated,
            )


def _cut_stream(kept: bytes, total: int, cap: int) -> tuple[str, bool]:
    text, _ = cut_text(kept, cap)
    if total <= cap:
        return text, False
    return text + cut_marker(cap, total), True


def _timeout(request: SandboxExecutionRequested) -> float:
    requested = request.arguments.get("timeout_s")
    if isinstance(requested, int | float) and not isinstance(requested, bool) and requested > 0:
        return float(requested)
    return request.limits.timeout_s


async def _in_workspace(
    workspace: Path, tool: Callable[Concatenate[Path, P], R], *args: P.args, **kwargs: P.kwargs
) -> R:
    """Run a blocking file tool in a worker thread, on a workspace that exists."""

    def run() -> R:
        workspace.mkdir(parents=True, exist_ok=True)
        return tool(workspace, *args, **kwargs)

    return await asyncio.to_thread(run)


def _string(arguments: dict[str, JsonValue], name: str, default: str | None = None) -> str:
    value = arguments.get(name, default)
    if not isinstance(value, str):
        raise ToolRefused(
            ToolError(
                kind="validation",
                message=f"argument {name!r} must be a string"
                if name in arguments
                else f"argument {name!r} is required",
                field=f"/{name}",
            )
        )
    return value
