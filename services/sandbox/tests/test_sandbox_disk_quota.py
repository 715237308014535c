"""What a session's workspace may hold: `write_file` past the quota is refused before it
writes, a command that grows the workspace past it is killed (or fails once it exits), and a
workspace already past it may still be read and cleaned up."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from helmline.contracts import LimitHit, ResourceUsage
from helmline.sandbox import SandboxSettings, tools_for
from helmline.sandbox._profiles import SandboxProfile
from helmline.sandbox._tools import Completed, Failed, Outcome, Tools
from helmline.sandbox.testing import call

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


async def run(
    tools: Tools,
    workspace: Path,
    tool: str,
    *,
    profile: str | None = "small",
    heard: Callable[[LimitHit, float], None] | None = None,
    **arguments: Any,
) -> Outcome:
    def warn(hit: LimitHit, used: float, _: ResourceUsage) -> None:
        if heard is not None:
            heard(hit, used)

    session = ("t-disk", workspace.name)
    return await call(tools, workspace, session, tool, arguments, profile=profile, approached=warn)


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
    first = await run(tools, workspace, "write_file", path="a.txt", content=megabyte_and_a_bit)
    assert isinstance(first, Completed), first
    second = refused_for_disk(
        await run(tools, workspace, "write_file", path="b.txt", content=megabyte_and_a_bit)
    )
    assert "would make the workspace hold 2.5 MiB, more than the 2 MiB" in second.error.message
    assert not (workspace / "b.txt").exists()
    # Replacing a file counts what it replaces.
    bigger = "y" * (MIB + MIB // 2)
    assert isinstance(
        await run(tools, workspace, "write_file", path="a.txt", content=bigger), Completed
    )
    # Without the profile, the service's default quota (2 GiB) lets it in.
    assert isinstance(
        await run(tools, workspace, "write_file", profile=None, path="b.txt", content=bigger),
        Completed,
    )


async def test_a_command_that_fills_the_workspace_and_exits_fails(
    tools: Tools, tmp_path: Path
) -> None:
    workspace = tmp_path / "ws"
    outcome = refused_for_disk(
        await run(tools, workspace, "run_command", command="head -c 3000000 /dev/zero > big")
    )
    assert "the command made the workspace take more than 2 MiB" in outcome.error.message
    assert "still there" in (outcome.error.suggestion or "")
    assert (workspace / "big").stat().st_size == 3_000_000


async def test_a_command_that_grows_the_workspace_past_its_quota_is_killed_warned_first(
    tools: Tools, tmp_path: Path
) -> None:
    workspace = tmp_path / "ws"
    warned: list[tuple[LimitHit, float]] = []
    # Near the quota (1.86 MiB) until the warning is heard, then past it, then 20 s more.
    grow = (
        "head -c 1950000 /dev/zero > a; "
        "i=0; while [ ! -e heard ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done; "
        "head -c 500000 /dev/zero > b; sleep 20; echo never"
    )

    def heard(hit: LimitHit, used: float) -> None:
        warned.append((hit, used))
        (workspace / "heard").touch()

    outcome = refused_for_disk(
        await run(tools, workspace, "run_command", heard=heard, command=grow)
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
    listed = await run(tools, workspace, "run_command", command="ls; wc -c < old")
    assert isinstance(listed, Completed), listed
    refused_for_disk(await run(tools, workspace, "write_file", path="new", content="n"))
    shrunk = await run(tools, workspace, "run_command", command="head -c 1000000 old > part")
    refused_for_disk(shrunk)  # It grew the workspace, still past its quota.
    cleaned = await run(tools, workspace, "run_command", command="rm old part")
    assert isinstance(cleaned, Completed), cleaned
    assert isinstance(await run(tools, workspace, "write_file", path="new", content="n"), Completed)
