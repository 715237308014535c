"""What a session's workspace may hold: `write_file` past the quota is refused before it
writes, a command that grows the workspace past it is killed (or fails once it exits), and a
workspace already past it may still be read and cleaned up."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from helmline.contracts import LimitHit, ResourceUsage, SandboxExecutionRequested
from helmline.sandbox import SandboxSettings, tools_for
from helmline.sandbox._commands import CommandControl, Reaper
from helmline.sandbox._profiles import SandboxProfile
from helmline.sandbox._tools import Completed, Failed, Outcome, Tools

MIB = 1024 * 1024


@pytest.fixture
async def tools() -> AsyncIterator[Tools]:
    started = await tools_for(
        SandboxSettings(sandbox_profiles={"small": SandboxProfile(disk_mb=2)})
    )
    try:
        yield started
    finally:
        await started.close()


async def call(
    tools: Tools,
    workspace: Path,
    tool: str,
    *,
    profile: str | None = "small",
    warned: list[tuple[LimitHit, float]] | None = None,
    **arguments: Any,
) -> Outcome:
    request = SandboxExecutionRequested(
        call_id=f"call-{uuid.uuid4().hex[:8]}",
        step_id="step-1",
        tool=tool,
        arguments=arguments,
        profile=profile,
    )

    def warn(hit: LimitHit, used: float, _: ResourceUsage) -> None:
        if warned is not None:
            warned.append((hit, used))

    control = CommandControl(uuid.uuid4().hex, asyncio.Event(), Reaper(), warn)
    return await tools.execute(request, workspace, ("t-disk", workspace.name), control)


def refused_for_disk(outcome: Outcome) -> Failed:
    assert isinstance(outcome, Failed), outcome
    assert outcome.error.kind == "limit"
    assert outcome.limit is not None
    assert (outcome.limit.limit, outcome.limit.value) == ("disk", 2)
    return outcome


async def test_a_write_past_the_quota_is_refused_before_it_writes(
    tools: Tools, tmp_path: Path
) -> None:
    workspace = tmp_path / "ws"
    megabyte_and_a_bit = "x" * (MIB + MIB // 4)
    first = await call(tools, workspace, "write_file", path="a.txt", content=megabyte_and_a_bit)
    assert isinstance(first, Completed), first
    second = refused_for_disk(
        await call(tools, workspace, "write_file", path="b.txt", content=megabyte_and_a_bit)
    )
    assert "would make the workspace hold 2.5 MiB, more than the 2 MiB" in second.error.message
    assert not (workspace / "b.txt").exists()
    # Replacing a file counts what it replaces.
    bigger = "y" * (MIB + MIB // 2)
    assert isinstance(
        await call(tools, workspace, "write_file", path="a.txt", content=bigger), Completed
    )
    # Without the profile, the service's default quota (2 GiB) lets it in.
    assert isinstance(
        await call(tools, workspace, "write_file", profile=None, path="b.txt", content=bigger),
        Completed,
    )


async def test_a_command_that_fills_the_workspace_and_exits_fails(
    tools: Tools, tmp_path: Path
) -> None:
    workspace = tmp_path / "ws"
    outcome = refused_for_disk(
        await call(tools, workspace, "run_command", command="head -c 3000000 /dev/zero > big")
    )
    assert "the command made the workspace take more than 2 MiB" in outcome.error.message
    assert "still there" in (outcome.error.suggestion or "")
    assert (workspace / "big").stat().st_size == 3_000_000


async def test_a_command_that_grows_the_workspace_past_its_quota_is_killed_warned_first(
    tools: Tools, tmp_path: Path
) -> None:
    workspace = tmp_path / "ws"
    warned: list[tuple[LimitHit, float]] = []
    # Near the quota (1.86 MiB) long enough to be seen there, then past it, then 20 s more.
    grow = (
        "head -c 1950000 /dev/zero > a; sleep 1.5; head -c 500000 /dev/zero > b; sleep 20; "
        "echo never"
    )
    outcome = refused_for_disk(
        await call(tools, workspace, "run_command", warned=warned, command=grow)
    )
    assert outcome.error.message.endswith("and was killed")
    assert outcome.usage is not None
    assert outcome.usage.wall_ms < 15_000
    assert [(hit.limit, hit.value) for hit, _ in warned] == [("disk", 2)]
    assert 1.8 <= warned[0][1] <= 2.0


async def test_a_workspace_already_past_its_quota_may_be_read_and_cleaned_up(
    tools: Tools, tmp_path: Path
) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "old").write_bytes(b"z" * 3 * MIB)  # Before the quota was lowered.
    listed = await call(tools, workspace, "run_command", command="ls; wc -c < old")
    assert isinstance(listed, Completed), listed
    refused_for_disk(await call(tools, workspace, "write_file", path="new", content="n"))
    shrunk = await call(tools, workspace, "run_command", command="head -c 1000000 old > part")
    refused_for_disk(shrunk)  # It grew the workspace, still past its quota.
    cleaned = await call(tools, workspace, "run_command", command="rm old part")
    assert isinstance(cleaned, Completed), cleaned
    assert isinstance(
        await call(tools, workspace, "write_file", path="new", content="n"), Completed
    )
