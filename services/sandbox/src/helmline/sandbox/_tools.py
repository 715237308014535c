"""Carrying out one sandboxed call: the built-in tools, and how each one ended."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Concatenate, ParamSpec, TypeVar

from pydantic import JsonValue

from helmline.confinement import Destination
from helmline.contracts import LimitHit, ResourceUsage, SandboxExecutionRequested, ToolError
from helmline.runtime import has_references
from helmline.sandbox._backends import CommandBackend, CommandJob, CommandResult, prepare_workspace
from helmline.sandbox._commands import CommandControl, Output
from helmline.sandbox._errors import LimitReached, ToolRefused
from helmline.sandbox._files import (
    delete_file,
    list_files,
    read_file,
    workspace_bytes,
    write_file,
)
from helmline.sandbox._limits import MIB, Defaults, LimitName, Limits, effective_limits
from helmline.sandbox._output import cut_marker, cut_text
from helmline.sandbox._paths import NO_RULES, PathRules


@dataclass(frozen=True, slots=True)
class Completed:
    """The call did its work."""

    output: JsonValue
    """What it returns, as JSON."""
    truncated: bool = False
    """Whether part of the output was cut to the cap."""
    exit_code: int | None = None
    """A command's exit status."""
    usage: ResourceUsage | None = None
    """What a command used."""
    egress_refused: tuple[str, ...] = ()
    """Connections the command was refused (`host:port`)."""


@dataclass(frozen=True, slots=True)
class Failed:
    """The call could not do its work."""

    error: ToolError
    """Why, for the planner and for people."""
    limit: LimitHit | None = None
    """The resource limit that stopped it, if one did."""
    usage: ResourceUsage | None = None
    """What it had used, where measured."""
    egress_refused: tuple[str, ...] = ()
    """Connections a command was refused (`host:port`) before it failed."""


Outcome = Completed | Failed

P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class Sandboxed:
    """Where a call's command runs, and the limits of a call that sets none."""

    backend: CommandBackend
    defaults: Defaults
    rules: PathRules = NO_RULES
    """The parts of the workspace kept from the calls."""
    egress: tuple[Destination, ...] = ()
    """Where commands of calls granted a network may connect; none named: anywhere."""


@dataclass(frozen=True, slots=True)
class Tools:
    """The built-in tools, with commands run by `backend` under limits (defaults filling in
    what a request leaves unset), or by the sandbox profile the call was granted."""

    backend: CommandBackend
    defaults: Defaults
    profiles: Mapping[str, Sandboxed] = field(default_factory=dict)
    """The configured profiles by name."""

    def describe(self) -> dict[str, str]:
        """How each backend confines commands: the default's and each profile's."""
        return {
            "sandbox": self.backend.describe(),
            **{
                f"sandbox profile {name}": profile.backend.describe()
                for name, profile in self.profiles.items()
            },
        }

    async def close(self) -> None:
        """Release what the backends hold between calls (warm containers)."""
        await self.backend.close()
        for profile in self.profiles.values():
            await profile.backend.close()

    def _sandboxed(self, profile: str | None) -> Sandboxed:
        if profile is None:
            return Sandboxed(self.backend, self.defaults)
        chosen = self.profiles.get(profile)
        if chosen is None:
            known = ", ".join(sorted(self.profiles)) or "none"
            raise ToolRefused(
                ToolError(
                    kind="validation",
                    message=f"the sandbox has no profile {profile!r} (configured: {known})",
                    suggestion="define it in HELMLINE_SANDBOX_PROFILES, or grant a defined one",
                )
            )
        return chosen

    async def execute(
        self,
        request: SandboxExecutionRequested,
        workspace: Path,
        session: tuple[str, str],
        control: CommandControl,
        arguments: dict[str, JsonValue] | None = None,
    ) -> Outcome:
        """Run one built-in tool in a session's (tenant, session id) workspace, creating the
        workspace if needed; with `arguments` (the request's, its secrets resolved) if given.

        A cancel kills a running command; file tools are too short to interrupt.
        """
        if arguments is None:
            arguments = request.arguments
        try:
            sandboxed = self._sandboxed(request.profile)
        except ToolRefused as refused:
            return Failed(refused.error)
        if request.tool == "run_command":
            try:
                return await _run_command(
                    sandboxed, request, arguments, workspace, session, control
                )
            except ToolRefused as refused:
                return Failed(refused.error)
        return await _file_tool(request, arguments, workspace, session, sandboxed)


async def _run_command(
    sandboxed: Sandboxed,
    request: SandboxExecutionRequested,
    arguments: dict[str, JsonValue],
    workspace: Path,
    session: tuple[str, str],
    control: CommandControl,
) -> Outcome:
    if has_references(request.arguments.get("command")):
        # Events quote the command (a limit it hit): a secret goes in through `env`.
        raise ToolRefused(
            ToolError(
                kind="validation",
                message="run_command's command cannot be a secret's reference",
                field="/command",
                suggestion='pass the secret in env, {"NAME": {"secret": "SECRET"}}, and use '
                "$NAME in the command",
            )
        )
    command = _string(arguments, "command")
    limits = effective_limits(request.limits, _timeout(request), sandboxed.defaults)
    # A workspace already past its quota (the quota was lowered) may be read and cleaned up,
    # not grown.
    allowed = None
    if limits.disk_mb is not None:
        held = await asyncio.to_thread(workspace_bytes, workspace)
        allowed = max(limits.disk_mb * MIB, held)
    job = CommandJob(
        command,
        workspace,
        *session,
        limits=limits,
        network=request.network,
        # Only a call granted a network is let out at all, and then only to these.
        egress=sandboxed.egress if request.network else (),
        rules=sandboxed.rules,
        disk_allowed=allowed,
        env=_environment(arguments),
    )
    result = await sandboxed.backend.run(job, control)
    outcome = await _command_outcome(result, limits, command, workspace, allowed)
    if result.egress_refused:
        return replace(outcome, egress_refused=result.egress_refused)
    return outcome


async def _command_outcome(
    result: CommandResult, limits: Limits, command: str, workspace: Path, allowed: int | None
) -> Outcome:
    run, usage = result.run, result.usage
    if result.limit is not None:
        return _limit_failure(result.limit, limits, command, usage)
    # Between two looks of the watch, a command may fill the disk and exit.
    if (
        allowed is not None
        and run.ended == "exited"
        and await asyncio.to_thread(workspace_bytes, workspace) > allowed
    ):
        return _limit_failure("disk", limits, command, usage, killed=False)
    match run.ended:
        case "timeout":
            return _limit_failure("timeout", limits, command, usage)
        case "cancelled":
            return Failed(
                ToolError(
                    kind="cancelled",
                    message="the session was cancelled while the command ran; it was killed",
                ),
                usage=usage,
            )
        case "exited" | "limit":
            cap = limits.max_output_bytes
            stdout, stdout_truncated = _cut_stream(run.output, 1, cap)
            stderr, stderr_truncated = _cut_stream(run.output, 2, cap)
            return Completed(
                {
                    "exit_code": run.exit_code,
                    "stdout": stdout,
                    "stderr": stderr,
                    "stdout_truncated": stdout_truncated,
                    "stderr_truncated": stderr_truncated,
                    "usage": usage.model_dump(mode="json"),
                },
                stdout_truncated or stderr_truncated,
                exit_code=run.exit_code,
                usage=usage,
            )


_LIMIT_WORDS: dict[LimitName, tuple[str, str]] = {
    "timeout": (
        "ran longer than {value:g} s",
        "raise timeout_s, or make the command finish sooner",
    ),
    "cpu": ("used more than {value:g} s of CPU", "raise cpu_s, or do less work per call"),
    "memory": ("used more than {value:g} MiB of memory", "raise memory_mb, or use less memory"),
    "processes": (
        "tried to run more than {value:g} processes at once",
        "raise max_processes, or start fewer processes",
    ),
    "file_size": (
        "tried to write a file larger than {value:g} MiB",
        "raise max_file_mb, or write smaller files",
    ),
    "output": ("wrote more than {value:g} bytes of output", "raise max_output_bytes"),
    "disk": (
        "made the workspace take more than {value:g} MiB",
        "delete files the session no longer needs (what the command wrote is still there), "
        "or raise disk_mb",
    ),
}


def _limit_failure(
    limit: LimitName, limits: Limits, command: str, usage: ResourceUsage, *, killed: bool = True
) -> Failed:
    value = limits.value_of(limit)
    what, suggestion = _LIMIT_WORDS[limit]
    ending = " and was killed" if killed else ""
    return Failed(
        ToolError(
            kind="timeout" if limit == "timeout" else "limit",
            message=f"the command {what.format(value=value)}{ending}",
            suggestion=suggestion,
        ),
        LimitHit(limit=limit, value=value, command=command),
        usage,
    )


async def _file_tool(
    request: SandboxExecutionRequested,
    arguments: dict[str, JsonValue],
    workspace: Path,
    session: tuple[str, str],
    sandboxed: Sandboxed,
) -> Outcome:
    owner = sandboxed.backend.workspace_owner(*session)
    rules = sandboxed.rules
    cap = request.limits.max_output_bytes
    try:
        match request.tool:
            case "read_file":
                path = _string(arguments, "path")
                output, truncated = await _in_workspace(
                    workspace, owner, rules, read_file, path, cap
                )
                return Completed(output, truncated)
            case "write_file":
                path, content = _string(arguments, "path"), _string(arguments, "content")
                return Completed(
                    await _in_workspace(
                        workspace,
                        owner,
                        rules,
                        write_file,
                        path,
                        content,
                        owner,
                        sandboxed.defaults.disk_mb,
                    )
                )
            case "list_files":
                path = _string(arguments, "path", default=".")
                output, truncated = await _in_workspace(
                    workspace, owner, rules, list_files, path, cap
                )
                return Completed(output, truncated)
            case "delete_file":
                path = _string(arguments, "path")
                return Completed(await _in_workspace(workspace, owner, rules, delete_file, path))
            case other:
                raise ToolRefused(
                    ToolError(
                        kind="validation",
                        message=f"the sandbox does not run the tool {other!r}",
                        suggestion="use read_file, write_file, list_files, delete_file or "
                        "run_command",
                    )
                )
    except LimitReached as reached:
        return Failed(reached.error, reached.hit)
    except ToolRefused as refused:
        return Failed(refused.error)


def _cut_stream(output: Output, fd: int, cap: int) -> tuple[str, bool]:
    total = output.totals[fd]
    text, _ = cut_text(bytes(output.kept[fd]), cap)
    if total <= cap:
        return text, False
    return text + cut_marker(cap, total), True


def _environment(arguments: dict[str, JsonValue]) -> dict[str, str]:
    given = arguments.get("env")
    if not isinstance(given, dict):
        return {}
    return {name: value for name, value in given.items() if isinstance(value, str)}


def _timeout(request: SandboxExecutionRequested) -> float:
    requested = request.arguments.get("timeout_s")
    if isinstance(requested, int | float) and not isinstance(requested, bool) and requested > 0:
        return float(requested)
    return request.limits.timeout_s


async def _in_workspace(
    workspace: Path,
    owner: int | None,
    rules: PathRules,
    tool: Callable[Concatenate[Path, PathRules, P], R],
    *args: P.args,
    **kwargs: P.kwargs,
) -> R:
    """Run a blocking file tool in a worker thread, on a workspace that exists."""

    def run() -> R:
        prepare_workspace(workspace, owner)
        return tool(workspace, rules, *args, **kwargs)

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
