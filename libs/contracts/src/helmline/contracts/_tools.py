"""The built-in tools: what each takes, how risky it is, and who runs it.

The sandbox service implements them, the tool gateway validates calls against their
parameters, and the approval service decides on their risk; all three read this catalogue.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, StringConstraints

from helmline.contracts._values import Contract, Risk, ToolName

CallPointer = Annotated[
    str, StringConstraints(pattern=r"^/(arguments|result)(/([^~/]|~[01])*)*$", max_length=1024)
]
"""A JSON Pointer (RFC 6901) into `{"arguments": ..., "result": ...}` of a finished call."""


class ToolInverse(Contract):
    """The call that undoes a successful call of a tool (create → delete by the new id).

    Rollback calls it through the tool gateway like any other call, so policy and approval
    apply to it too.
    """

    tool: ToolName
    """The tool that undoes the effect."""
    arguments: dict[str, CallPointer] = Field(default_factory=dict)
    """Each argument of the inverse call, as a JSON Pointer into `{"arguments": ...,
    "result": ...}` of the original call: `{"id": "/result/id"}` passes the id the original
    call returned."""


class ToolSpec(Contract):
    """A tool as the control plane knows it."""

    name: ToolName
    """The name plans call it by."""
    description: str
    """What it does, for people and models."""
    parameters: dict[str, Any]
    """JSON Schema (draft 2020-12) of its arguments."""
    risk: Risk
    """Risk of a call unless a plan or policy says otherwise."""
    executor: Literal["gateway", "sandbox"]
    """Who runs it: the tool gateway itself (pure tools) or the sandbox (anything touching
    the workspace or running a process)."""
    timeout_s: float = Field(default=30.0, gt=0)
    """Default wall-clock limit of a call."""
    inverse: ToolInverse | None = None
    """How to undo a successful call, if it can be undone by another call; a tool with side
    effects outside the workspace and no inverse makes rollback past its calls partial."""
    idempotent: bool = False
    """Whether calling it twice with the same arguments has the effect of calling it once."""


_PATH = {
    "type": "string",
    "minLength": 1,
    "maxLength": 4096,
    "description": "A path relative to the session workspace.",
}


def _parameters(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


BUILTIN_TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        name="echo",
        description="Return the message unchanged; has no side effect (tests and benchmarks).",
        parameters=_parameters({"message": {"type": "string", "maxLength": 65536}}, ["message"]),
        risk="low",
        executor="gateway",
    ),
    ToolSpec(
        name="read_file",
        description="Read a text file of the workspace.",
        parameters=_parameters({"path": _PATH}, ["path"]),
        risk="low",
        executor="sandbox",
    ),
    ToolSpec(
        name="list_files",
        description="List the files under a folder of the workspace (the whole workspace by "
        "default).",
        parameters=_parameters({"path": {**_PATH, "default": "."}}, []),
        risk="low",
        executor="sandbox",
    ),
    ToolSpec(
        name="write_file",
        description="Create or replace a text file of the workspace, making folders as needed.",
        parameters=_parameters(
            {"path": _PATH, "content": {"type": "string", "maxLength": 1048576}},
            ["path", "content"],
        ),
        risk="medium",
        executor="sandbox",
    ),
    ToolSpec(
        name="delete_file",
        description="Delete a file of the workspace.",
        parameters=_parameters({"path": _PATH}, ["path"]),
        risk="medium",
        executor="sandbox",
    ),
    ToolSpec(
        name="run_command",
        description="Run a shell command in the workspace; stdout and stderr are returned, "
        "each cut to the output cap.",
        parameters=_parameters(
            {
                "command": {"type": "string", "minLength": 1, "maxLength": 16384},
                "timeout_s": {"type": "number", "exclusiveMinimum": 0, "maximum": 3600},
            },
            ["command"],
        ),
        risk="high",
        executor="sandbox",
        timeout_s=60.0,
    ),
)
"""Every built-in tool."""

BUILTIN_TOOLS_BY_NAME: dict[str, ToolSpec] = {tool.name: tool for tool in BUILTIN_TOOLS}
