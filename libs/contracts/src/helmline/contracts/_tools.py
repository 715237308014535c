"""The built-in tools: what each takes, how risky it is, and who runs it.

The sandbox service implements them, the tool gateway validates calls against their
parameters, and the approval service decides on their risk; all three read this catalogue.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
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

    def resolve(self, arguments: Mapping[str, Any], result: Any) -> dict[str, Any]:
        """The inverse call's arguments for a call made with `arguments` that returned
        `result`; raises `LookupError` naming the pointer that finds nothing."""
        call = {"arguments": arguments, "result": result}
        return {name: _follow(call, pointer) for name, pointer in self.arguments.items()}


def _follow(document: Any, pointer: str) -> Any:
    """The value a JSON Pointer (RFC 6901) designates in `document`."""
    value = document
    for token in pointer.split("/")[1:]:
        token = token.replace("~1", "/").replace("~0", "~")
        if isinstance(value, Mapping) and token in value:
            value = value[token]
        elif isinstance(value, list) and token.isdigit() and int(token) < len(value):
            value = value[int(token)]
        else:
            raise LookupError(f"{pointer} designates nothing in the call")
    return value


ToolEffect = Literal["none", "workspace", "external"]
"""What a call of a tool changes: nothing, the session workspace (undone by restoring a
workspace snapshot), or something outside Helmline (undone only by the tool's inverse)."""


ToolAction = Literal["read", "write", "execute", "delete"]
"""What kind of thing a call of a tool does, for policies that grant by kind of action."""


Trust = Literal["trusted", "untrusted"]
"""Whether a tool's results may be taken as coming from the control plane's side
(`trusted`: the built-in workspace tools) or may carry outside content written by anyone
(`untrusted`: a fetched page, a mail, an issue), which taints the calls a model proposes
after reading them."""


BUILTIN_SERVER = "builtin"
"""The `server` of the tools Helmline itself provides."""

MCP_NAME_SEPARATOR = "__"
"""Between an MCP server's id and its tool's name in the registry: `git__git_status`."""


class ToolDefinition(Contract):
    """A tool as its MCP server lists it: what a model reads of it and what it claims to be.

    Its `digest` pins it: a server that later lists the tool otherwise (a new description,
    schema or annotations: a "rug pull") has it held until an operator accepts the change.
    """

    name: str = Field(min_length=1, max_length=128)
    """Its name on its server."""
    description: str = ""
    """What the server says it does (its title, or its name, when it gives no description)."""
    input_schema: dict[str, Any] = Field(default_factory=dict[str, Any])
    """The JSON Schema of its arguments, as listed."""
    annotations: dict[str, Any] = Field(default_factory=dict[str, Any])
    """Its MCP annotations as listed (`readOnlyHint`, `destructiveHint`, `idempotentHint`,
    `openWorldHint`, `title`); absent ones are left out."""

    @property
    def digest(self) -> str:
        """The SHA-256 of its canonical JSON (keys sorted, no spaces): equal for equal
        definitions, whatever order the server wrote their keys in."""
        document = self.model_dump(mode="json")
        canonical = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(canonical.encode()).hexdigest()

    def hints(self, annotation: str) -> bool:
        """Whether the server sets the boolean annotation (`readOnlyHint`, ...) to true."""
        return self.annotations.get(annotation) is True


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
    executor: Literal["gateway", "sandbox", "mcp"]
    """Who runs it: the tool gateway itself (pure tools), the sandbox (anything touching
    the workspace or running a process) or an MCP server through the gateway."""
    server: str = BUILTIN_SERVER
    """What serves it: `builtin`, or the id of the MCP server it is federated from."""
    remote_name: str | None = None
    """Its name on its MCP server (the registry calls it `<server>__<remote_name>`)."""
    required_permission: str | None = None
    """A permission, by name, as the server's configuration declares it, that the session's
    requester must hold as one of their roles: the approval service denies any other call
    of the tool before policy rules are tried (rules can match it with `permission:`).
    None when the tool asks for none."""
    timeout_s: float = Field(default=30.0, gt=0)
    """Default wall-clock limit of a call."""
    inverse: ToolInverse | None = None
    """How to undo a successful call, if it can be undone by another call; a tool with side
    effects outside the workspace and no inverse makes rollback past its calls partial."""
    idempotent: bool = False
    """Whether calling it twice with the same arguments has the effect of calling it once."""
    effect: ToolEffect = "external"
    """What its calls change; decides how rollback undoes them."""
    action: ToolAction | None = None
    """What kind of thing a call does (read, write, execute, delete), as the tool or its
    server's configuration declares it; None when nobody said. Policy rules match it."""
    pure: bool = False
    """Whether its result depends on its arguments only, and a call changes nothing: a
    session that calls it again with the same arguments gets the earlier call's result, and
    the tool is not called again."""
    trust: Trust = "untrusted"
    """Whether its results are trusted; untrusted unless declared (the built-in tools are
    trusted, an MCP server's tools only when its configuration says `trust: trusted`)."""
    definition_digest: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    """For an MCP tool, the SHA-256 of its definition as its server lists it
    (`ToolDefinition.digest`): approvals name it, so that a grant made for one definition
    never approves calls of a changed one. None for built-in tools."""


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
        effect="none",
        pure=True,
        action="read",
        trust="trusted",
    ),
    ToolSpec(
        name="read_file",
        description="Read a text file of the workspace.",
        parameters=_parameters({"path": _PATH}, ["path"]),
        risk="low",
        executor="sandbox",
        effect="none",
        action="read",
        trust="trusted",
    ),
    ToolSpec(
        name="list_files",
        description="List the files under a folder of the workspace (the whole workspace by "
        "default).",
        parameters=_parameters({"path": {**_PATH, "default": "."}}, []),
        risk="low",
        executor="sandbox",
        effect="none",
        action="read",
        trust="trusted",
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
        effect="workspace",
        action="write",
        trust="trusted",
    ),
    ToolSpec(
        name="delete_file",
        description="Delete a file of the workspace.",
        parameters=_parameters({"path": _PATH}, ["path"]),
        risk="medium",
        executor="sandbox",
        effect="workspace",
        action="delete",
        trust="trusted",
    ),
    ToolSpec(
        name="run_command",
        description="Run a shell command in the workspace; stdout and stderr are returned, "
        "each cut to the output cap.",
        parameters=_parameters(
            {
                "command": {"type": "string", "minLength": 1, "maxLength": 16384},
                "timeout_s": {"type": "number", "exclusiveMinimum": 0, "maximum": 3600},
                "env": {
                    "type": "object",
                    "description": "Environment variables the command gets besides PATH, "
                    'HOME, TMPDIR and LANG; a value may be a secret\'s reference, {"secret": '
                    '"NAME"}, resolved only in the sandbox.',
                    "propertyNames": {"pattern": "^[A-Za-z_][A-Za-z0-9_]{0,127}$"},
                    "additionalProperties": {"type": "string", "maxLength": 65536},
                    "maxProperties": 64,
                },
            },
            ["command"],
        ),
        risk="high",
        executor="sandbox",
        effect="workspace",
        timeout_s=60.0,
        action="execute",
        trust="trusted",
    ),
)
"""Every built-in tool."""

BUILTIN_TOOLS_BY_NAME: dict[str, ToolSpec] = {tool.name: tool for tool in BUILTIN_TOOLS}
