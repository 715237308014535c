"""Built-in calls handed to the sandbox, and the resource limits they approach or hit."""

from __future__ import annotations

from typing import Self

from pydantic import Field

from helmline.contracts._payload import Payload
from helmline.contracts._services import SANDBOX, TOOL_GATEWAY
from helmline.contracts._values import (
    Arguments,
    LimitHit,
    ResourceUsage,
    SandboxLimits,
    StepId,
    ToolName,
)
from helmline.contracts.events._samples import CALL


class SandboxExecutionRequested(
    Payload, type="sandbox.execution.requested", published_by=(TOOL_GATEWAY,)
):
    """The tool gateway hands an authorised built-in call to the sandbox."""

    call_id: str = Field(min_length=1, max_length=128)
    """The call."""
    step_id: StepId
    """Its step."""
    tool: ToolName
    """The built-in tool."""
    arguments: Arguments = Field(default_factory=dict)
    """Validated arguments."""
    limits: SandboxLimits = Field(default_factory=SandboxLimits)
    """Resource limits for the call."""
    network: bool = False
    """Whether the sandbox gets a network."""
    profile: str | None = None
    """Sandbox profile (backend, image) to use."""

    @classmethod
    def example(cls) -> Self:
        return cls(**CALL, arguments={"command": "wc -c notes.txt"})


class SandboxLimitApproached(Payload, type="sandbox.limit_approached", published_by=(SANDBOX,)):
    """A running sandboxed call has used 90 % of a resource limit; it goes on running."""

    call_id: str = Field(min_length=1, max_length=128)
    """The call."""
    step_id: StepId
    """Its step."""
    limit: LimitHit
    """Which limit, its value and the command."""
    used: float = Field(ge=0)
    """How much of it the call had used when warned, in the limit's unit."""
    usage: ResourceUsage = Field(default_factory=ResourceUsage)
    """What the call had used so far."""

    @classmethod
    def example(cls) -> Self:
        return cls(
            **{k: v for k, v in CALL.items() if k != "tool"},
            limit=LimitHit(limit="memory", value=256, command="python big.py"),
            used=231,
            usage=ResourceUsage(wall_ms=600, peak_memory_mb=231),
        )


class SandboxLimitExceeded(Payload, type="sandbox.limit_exceeded", published_by=(SANDBOX,)):
    """A sandboxed call hit a resource limit and was stopped."""

    call_id: str = Field(min_length=1, max_length=128)
    """The call."""
    step_id: StepId
    """Its step."""
    hit: LimitHit
    """Which limit, its value and the command."""
    usage: ResourceUsage = Field(default_factory=ResourceUsage)
    """What the call had used when stopped."""

    @classmethod
    def example(cls) -> Self:
        return cls(
            **{k: v for k, v in CALL.items() if k != "tool"},
            hit=LimitHit(limit="memory", value=256, command="python big.py"),
            usage=ResourceUsage(wall_ms=850, peak_memory_mb=256),
        )
