"""Helmline sandbox service: built-in tools run in per-session workspaces.

Files are confined to the session's workspace folder; commands run in their own process
group with a clean environment, a wall-clock limit and an output cap, and are killed when
their session is cancelled. No call runs twice, whatever crashes.
"""

from helmline.sandbox._handlers import SandboxHandler
from helmline.sandbox._service import sandbox_setup
from helmline.sandbox._settings import SandboxSettings

__all__ = ["SandboxHandler", "SandboxSettings", "sandbox_setup"]
