"""A profile's path rules in real sandboxes: the file tools refuse what the rules keep from
them, and a command under bubblewrap sees read-only parts mounted so and blocked parts
covered, links or not; without the profile the same calls reach everything."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from helmline.sandbox import SandboxSettings, tools_for
from helmline.sandbox._profiles import SandboxProfile
from helmline.sandbox._tools import Completed, Failed, Outcome, Tools
from helmline.sandbox.testing import call

GUARDED = SandboxProfile(read_only_paths=("config", "host-etc"), blocked_paths=("secrets", ".env"))


@pytest.fixture
async def tools() -> AsyncIterator[Tools]:
    started = await tools_for(SandboxSettings(sandbox_profiles={"guarded": GUARDED}))
    try:
        yield started
    finally:
        await started.close()


def filled_workspace(workspace: Path) -> Path:
    (workspace / "config").mkdir(parents=True)
    (workspace / "config" / "app.ini").write_text("mode=safe\n")
    (workspace / "secrets").mkdir()
    (workspace / "secrets" / "key").write_text("hunter2\n")
    (workspace / ".env").write_text("TOKEN=abc\n")
    (workspace / "notes.txt").write_text("hello\n")
    (workspace / "to-secrets").symlink_to("secrets")
    # A rule's path that is a link out of the workspace must not bring the host in.
    (workspace / "host-etc").symlink_to("/etc")
    return workspace


async def run(
    tools: Tools, workspace: Path, profile: str | None, tool: str, **arguments: Any
) -> Outcome:
    return await call(
        tools, workspace, ("t-rules", workspace.name), tool, arguments, profile=profile
    )


def unchanged(workspace: Path) -> bool:
    return (
        (workspace / "config" / "app.ini").read_text() == "mode=safe\n"
        and (workspace / "secrets" / "key").read_text() == "hunter2\n"
        and (workspace / ".env").read_text() == "TOKEN=abc\n"
        and not (workspace / "config" / "new.ini").exists()
    )


@pytest.mark.parametrize(
    ("tool", "arguments", "refused_for"),
    [
        ("read_file", {"path": "config/app.ini"}, None),
        ("write_file", {"path": "config/app.ini", "content": "mode=open"}, "'config'"),
        ("write_file", {"path": "config/new.ini", "content": "x"}, "read-only"),
        ("delete_file", {"path": "config/app.ini"}, "read-only"),
        ("read_file", {"path": "secrets/key"}, "'secrets', which this call's sandbox profile"),
        ("read_file", {"path": "to-secrets/key"}, "blocks"),
        ("read_file", {"path": ".env"}, "'.env'"),
        ("delete_file", {"path": ".env"}, "blocks"),
        ("list_files", {"path": "secrets"}, "blocks"),
        ("write_file", {"path": "notes.txt", "content": "changed"}, None),
    ],
)
async def test_the_file_tools_refuse_what_the_profile_keeps_from_them(
    tools: Tools, tmp_path: Path, tool: str, arguments: dict[str, Any], refused_for: str | None
) -> None:
    guarded = filled_workspace(tmp_path / f"g{uuid.uuid4().hex[:8]}")
    outcome = await run(tools, guarded, "guarded", tool, **arguments)
    if refused_for is None:
        assert isinstance(outcome, Completed), outcome
    else:
        assert isinstance(outcome, Failed), outcome
        assert outcome.error.kind == "permission"
        assert refused_for in outcome.error.message
        assert outcome.error.field == "/path"
    assert unchanged(guarded)
    # The same call without the profile reaches the path: the rules made the difference.
    open_workspace = filled_workspace(tmp_path / f"o{uuid.uuid4().hex[:8]}")
    assert isinstance(await run(tools, open_workspace, None, tool, **arguments), Completed)


async def test_a_listing_leaves_blocked_paths_out(tools: Tools, tmp_path: Path) -> None:
    workspace = filled_workspace(tmp_path / "ws")
    guarded = await run(tools, workspace, "guarded", "list_files", path=".")
    everything = await run(tools, workspace, None, "list_files", path=".")
    assert isinstance(guarded, Completed)
    assert isinstance(everything, Completed)
    assert guarded.output == {
        "files": ["config/app.ini", "host-etc", "notes.txt", "to-secrets"],
        "truncated": False,
    }
    assert isinstance(everything.output, dict)
    files = everything.output["files"]
    assert isinstance(files, list)
    assert {".env", "secrets/key"} <= set(files)


PROBE = (
    "cat config/app.ini; "
    "(echo changed > config/app.ini) 2>/dev/null || echo config-refused; "
    "rm -rf config 2>/dev/null || echo rm-refused; "
    'echo "secrets:$(ls -A secrets | wc -l)"; '
    'echo "through-link:$(ls -A to-secrets/ | wc -l)"; '
    'echo "env:$(wc -c < .env)"; '
    "(echo x > secrets/new) 2>/dev/null || echo blocked-refused; "
    "cat host-etc/hostname 2>/dev/null || echo no-host-etc; "
    "echo more >> notes.txt"
)


async def test_a_command_sees_read_only_parts_mounted_so_and_blocked_ones_covered(
    tools: Tools, tmp_path: Path
) -> None:
    workspace = filled_workspace(tmp_path / "guarded")
    outcome = await run(tools, workspace, "guarded", "run_command", command=PROBE)
    assert isinstance(outcome, Completed), outcome
    assert isinstance(outcome.output, dict)
    assert str(outcome.output["stdout"]).split() == [
        "mode=safe",
        "config-refused",
        "rm-refused",
        "secrets:0",
        "through-link:0",
        "env:0",
        "blocked-refused",
        "no-host-etc",
    ]
    assert unchanged(workspace)
    assert not (workspace / "secrets" / "new").exists()
    assert (workspace / "notes.txt").read_text() == "hello\nmore\n"

    bare = filled_workspace(tmp_path / "bare")
    outcome = await run(tools, bare, None, "run_command", command=PROBE)
    assert isinstance(outcome, Completed), outcome
    assert isinstance(outcome.output, dict)
    assert str(outcome.output["stdout"]).split() == [
        "mode=safe",
        "secrets:1",
        "through-link:1",
        "env:10",
        "no-host-etc",
    ]
    assert not (bare / "config").exists()
    assert (bare / "secrets" / "new").read_text() == "x\n"
