"""The container backend when its engine fails under a running command."""

from __future__ import annotations

import asyncio
import gc
import uuid
from pathlib import Path

import pytest

from helmline.contracts import SandboxExecutionRequested
from helmline.runtime.testing import eventually
from helmline.sandbox import SandboxSettings, tools_for
from helmline.sandbox._commands import CommandControl, Reaper
from helmline.sandbox._profiles import SandboxProfile
from helmline.sandbox._tools import Failed
from helmline.sandbox.testing import BUSYBOX_IMAGE, EngineUnavailable, PrivateDockerd


@pytest.mark.container
# The SDK leaks the socket of each request that the dead engine refuses.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_an_engine_lost_after_the_command_started_leaves_its_outcome_unknown(
    tmp_path: Path,
) -> None:
    # An engine of its own: the test kills it.
    try:
        engine = PrivateDockerd().__enter__()
    except EngineUnavailable as error:
        pytest.skip(f"no container engine: {error}")
    try:
        engine.import_busybox()
        settings = SandboxSettings(
            docker_host=engine.host,
            sandbox_profiles={"busybox": SandboxProfile(backend="container", image=BUSYBOX_IMAGE)},
        )
        tools = await tools_for(settings)
        workspace = tmp_path / "ws"
        request = SandboxExecutionRequested(
            call_id="call-1",
            step_id="step-1",
            tool="run_command",
            arguments={"command": "touch started; sleep 30"},
            profile="busybox",
        )
        control = CommandControl(uuid.uuid4().hex, asyncio.Event(), Reaper())
        running = asyncio.create_task(
            tools.execute(request, workspace, (f"t{uuid.uuid4().hex[:12]}", "s1"), control)
        )

        def started() -> bool:
            assert not running.done(), running.result()
            return (workspace / "started").exists()

        await eventually(started, timeout_s=30, what="the command to start")
        engine.kill()
        outcome = await asyncio.wait_for(running, timeout=60)
        await tools.close()
    finally:
        engine.__exit__(None, None, None)
    gc.collect()  # Those sockets are reported here, where the warning is expected.
    # It had started, so running it again could do its work twice.
    assert isinstance(outcome, Failed), outcome
    assert outcome.error.kind == "unknown_outcome"
    assert not outcome.error.retryable
    assert "may have run" in outcome.error.message
