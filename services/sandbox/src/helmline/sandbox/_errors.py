"""The sandbox's errors."""

from __future__ import annotations

from helmline.contracts import LimitHit, ToolError


class SandboxError(Exception):
    """Root of every error raised by `helmline.sandbox`."""


class SandboxUnavailable(SandboxError):
    """The configured backend cannot run on this host; the service must not start."""


class ToolRefused(SandboxError):
    """A call cannot be carried out as asked; `error` says why, for the call's failure event."""

    def __init__(self, error: ToolError) -> None:
        super().__init__(error.message)
        self.error = error


class LimitReached(ToolRefused):
    """A call refused because it would pass a resource limit; `hit` names the limit."""

    def __init__(self, error: ToolError, hit: LimitHit) -> None:
        super().__init__(error)
        self.hit = hit
