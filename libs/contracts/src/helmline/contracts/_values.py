"""Value objects shared by events: identifiers, risk, actors, tool errors, sandbox limits."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    JsonValue,
    StringConstraints,
    field_validator,
    model_validator,
)

# Identifiers end up as NATS subject tokens, so they must never contain dots, wildcards
# or whitespace; the patterns below are the single definition of what is allowed.
TenantId = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9_-]{0,62}$")]
SessionId = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")]
StepId = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")]
ToolName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")]
Traceparent = Annotated[
    str, StringConstraints(pattern=r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")
]

_HOST_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$"
_HOST = re.compile(_HOST_PATTERN)


def _host_name(value: object) -> object:
    # Before the pattern is checked: its own error would not say what a host looks like.
    if not isinstance(value, str):
        return value
    host = value.strip().lower()
    if len(host) > 253 or _HOST.match(host) is None:
        raise ValueError(
            f"{value[:200]!r} is not a host name such as api.example.com "
            "(no scheme, port, path or wildcard)"
        )
    return host


Host = Annotated[
    str, BeforeValidator(_host_name), StringConstraints(max_length=253, pattern=_HOST_PATTERN)
]
"""A network host by name (`api.example.com`), as plans declare what a step reaches."""

Risk = Literal["low", "medium", "high", "critical"]
"""How much harm a tool call could do; policy decides what each level needs."""

Arguments = dict[str, JsonValue]
"""Tool arguments as JSON, validated by the tool gateway against the tool's JSON Schema."""


def one_or_many(value: object) -> object:
    """Read one item as a list of one: people write `tool: run_command` as often as
    `tool: [run_command, write_file]`, and mean the same kind of thing."""
    return [value] if isinstance(value, str) else value


Patterns = Annotated[tuple[str, ...], BeforeValidator(one_or_many), Field(min_length=1)]
"""One or more globs (or names), given as a string or a list."""


class Contract(BaseModel):
    """Base of every contract model: immutable, strict about unknown fields, documented."""

    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        use_attribute_docstrings=True,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
    )


class Actor(Contract):
    """Who caused an event: a person, a service, a policy rule or the system itself."""

    id: str = Field(min_length=1, max_length=256)
    """Stable identifier: a user name, a service name or a rule id."""
    kind: Literal["user", "service", "policy", "system"] = "user"
    """What sort of actor this is."""
    roles: tuple[str, ...] = ()
    """Roles the actor held when acting (for example `approver`, `sre`)."""


class ToolError(Contract):
    """A structured tool failure that a planner (or a model) can act on."""

    kind: Literal[
        "validation",
        "permission",
        "not_found",
        "timeout",
        "limit",
        "rate_limited",
        "unavailable",
        "execution",
        "cancelled",
        "internal",
        "unknown_outcome",
        "tool_changed",
    ]
    """Class of the failure; decides whether retrying can help. `tool_changed`: the tool's
    server lists it otherwise than pinned, and its calls are held until an operator accepts
    the change."""
    message: str
    """What went wrong, in words a person understands."""
    retryable: bool = False
    """Whether the same call may succeed if retried unchanged."""
    suggestion: str | None = None
    """A concrete hint for recovering (another path, smaller input, ask a person)."""
    field: str | None = None
    """The argument at fault, for validation errors (a JSON pointer such as `/path`)."""


class SandboxLimits(Contract):
    """Resource limits for one sandboxed call."""

    timeout_s: float = Field(default=30.0, gt=0, le=3600)
    """Wall-clock limit in seconds."""
    cpu_s: float | None = Field(default=None, gt=0)
    """CPU seconds the call may use."""
    memory_mb: int | None = Field(default=None, gt=0)
    """Resident memory in MiB."""
    max_processes: int | None = Field(default=None, gt=0)
    """How many processes the call may have at once."""
    max_file_mb: int | None = Field(default=None, gt=0)
    """Largest file the call may write, in MiB."""
    max_output_bytes: int = Field(default=65536, gt=0)
    """Bytes of stdout and stderr kept each; the rest is cut with a marker."""


class ResourceUsage(Contract):
    """What a sandboxed call used."""

    wall_ms: float = 0.0
    """Elapsed wall-clock time in milliseconds."""
    cpu_ms: float | None = None
    """CPU time in milliseconds, where measured."""
    peak_memory_mb: float | None = None
    """Peak resident memory in MiB, where measured."""


class ClassifierVerdict(Contract):
    """What the configured injection classifier (`HELMLINE_INJECTION_CLASSIFIER_URL`) said of
    a tool's output, after output safety's patterns: a second opinion, asked over HTTP.
    An `injection` flags the result as a pattern hit does; an `error` or a `timeout` leaves
    the patterns' verdict standing, and the call ends as it would have without one."""

    endpoint: str = Field(min_length=1, max_length=261)
    """Where it was asked: the URL's host and port only, never its path, query or
    credentials."""
    verdict: Literal["injection", "clean", "error", "timeout"]
    """`injection` or `clean` as the classifier answered; `error` when it could not be asked
    or its answer could not be read; `timeout` when it did not answer in time."""
    score: float | None = None
    """How sure it was, where its protocol gives a score (0 to 1)."""
    elapsed_ms: float = Field(default=0.0, ge=0)
    """How long the round trip took."""
    detail: str | None = Field(default=None, max_length=200)
    """Why an `error` (an HTTP status, an unreadable answer), in Helmline's words: never the
    classifier's own text nor anything of the request."""
    text_cut: bool = False
    """Whether the text sent was only the first part of the output (the classifier's size
    cap): an injection further on was not seen by it."""


class FileChanges(Contract):
    """What a call changed in the workspace, path by path (folders end in `/`)."""

    created: tuple[str, ...] = ()
    """Paths that are new, or changed kind (a file became a folder)."""
    modified: tuple[str, ...] = ()
    """Paths whose content, mode or link target changed."""
    deleted: tuple[str, ...] = ()
    """Paths that are gone, or changed kind."""
    unlisted: int = Field(default=0, ge=0)
    """Changed paths left out of the lists, which hold the first ones of each, by path."""

    @property
    def total(self) -> int:
        """How many paths changed."""
        return len(self.created) + len(self.modified) + len(self.deleted) + self.unlisted


class LimitHit(Contract):
    """A resource limit that stopped a sandboxed call."""

    limit: Literal["timeout", "cpu", "memory", "processes", "file_size", "output", "disk"]
    """Which limit was reached (`disk`: what the session's workspace may hold)."""
    value: float
    """The configured value of that limit (seconds, MiB, count or bytes)."""
    command: str | None = None
    """The command that hit it, for run_command."""


class ArgumentCondition(Contract):
    """A condition on one argument of a tool call; every test given must hold, and a call
    without the argument does not meet it. Policy rules and "approve similar" grants use it."""

    glob: Patterns | None = None
    """Path globs, any of which the (normalised) string value must match: `*` stays within
    one folder, `**` crosses folders, `?` is one character."""
    regex: str | None = None
    """A regular expression the string value must contain a match of (Python `re.search`)."""
    min: float | None = None
    """Smallest allowed number (inclusive)."""
    max: float | None = None
    """Largest allowed number (inclusive)."""

    @field_validator("regex")
    @classmethod
    def _compiles(cls, pattern: str | None) -> str | None:
        if pattern is not None:
            try:
                re.compile(pattern)
            except re.error as error:
                raise ValueError(f"invalid regular expression: {error}") from error
        return pattern

    @model_validator(mode="after")
    def _says_something(self) -> ArgumentCondition:
        if self.glob is None and self.regex is None and self.min is None and self.max is None:
            raise ValueError("an argument condition needs glob, regex, min or max")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min ({self.min}) is above max ({self.max})")
        return self
