"""Helmline sandbox service: built-in tools run in per-session workspaces.

Files are confined to the session's workspace folder; commands run under bubblewrap (no
network unless granted, read-only system, the workspace the only writable folder, an
unprivileged uid) with cgroup and rlimit limits, and are killed when their session is
cancelled. No call runs twice, whatever crashes.
"""

from helmline.sandbox._errors import SandboxUnavailable
from helmline.sandbox._handlers import SandboxHandler
from helmline.sandbox._manifests import Entry, Manifest
from helmline.sandbox._service import sandbox_setup, tools_for
from helmline.sandbox._settings import SandboxSettings
from helmline.sandbox._snapshots import SnapshotMissing, WorkspaceSnapshots
from helmline.sandbox._tools import Tools

__all__ = [
    "Entry",
    "Manifest",
    "SandboxHandler",
    "SandboxSettings",
    "SandboxUnavailable",
    "SnapshotMissing",
    "Tools",
    "WorkspaceSnapshots",
    "sandbox_setup",
    "tools_for",
]
