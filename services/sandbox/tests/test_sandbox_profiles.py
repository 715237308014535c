"""Sandbox profiles: the profile a call was granted chooses its backend and default limits;
an unknown one is refused."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from pydantic import ValidationError

from helmline.sandbox import SandboxSettings, tools_for
from helmline.sandbox._profiles import SandboxProfile
from helmline.sandbox._tools import Completed, Failed, Outcome, Tools
from helmline.sandbox.testing import BUSYBOX_IMAGE, PrivateDockerd, call


async def run(tools: Tools, workspace: Path, command: str, profile: str | None) -> Outcome:
    session = (f"t{uuid.uuid4().hex[:12]}", "s1")
    return await call(
        tools, workspace, session, "run_command", {"command": command}, profile=profile
    )


WHERE = (
    "if [ -e /usr/bin/python3 ]; then echo host; else echo container; fi; "
    "grep 'Max processes' /proc/self/limits"
)
"""Says whether the command sees the host's /usr, and its process limit."""


@pytest.mark.container
async def test_a_granted_profile_chooses_the_backend_and_its_defaults(
    dockerd: PrivateDockerd, tmp_path: Path
) -> None:
    settings = SandboxSettings(
        docker_host=dockerd.host,
        sandbox_profiles={
            "busybox": SandboxProfile(backend="container", image=BUSYBOX_IMAGE),
            "strict": SandboxProfile(max_processes=7),
        },
    )
    tools = await tools_for(settings)
    try:
        workspace = tmp_path / "ws"
        plain = await run(tools, workspace, WHERE, None)
        contained = await run(tools, workspace, WHERE, "busybox")
        strict = await run(tools, workspace, WHERE, "strict")
    finally:
        await tools.close()
    assert isinstance(plain, Completed)
    assert isinstance(plain.output, dict)
    assert str(plain.output["stdout"]).startswith("host\n")
    assert isinstance(contained, Completed)
    assert isinstance(contained.output, dict)
    assert str(contained.output["stdout"]).startswith("container\n")
    assert isinstance(strict, Completed)
    assert isinstance(strict.output, dict)
    # The per-uid process rlimit is the profile's limit, with the pids cgroup's slack.
    assert str(strict.output["stdout"]).split()[:4] == ["host", "Max", "processes", "14"]


async def test_a_profile_that_is_not_configured_is_refused(tmp_path: Path) -> None:
    tools = await tools_for(SandboxSettings())
    outcome = await run(tools, tmp_path / "ws", "true", "gpu")
    assert isinstance(outcome, Failed)
    assert outcome.error.kind == "validation"
    assert "no profile 'gpu' (configured: none)" in outcome.error.message
    assert not (tmp_path / "ws").exists()


def test_a_profile_says_what_is_wrong_with_it() -> None:
    with pytest.raises(ValidationError, match="a container profile needs an image"):
        SandboxProfile(backend="container")
    with pytest.raises(ValidationError, match="container backend only"):
        SandboxProfile(image="debian:12")
    assert SandboxProfile(cpus=0.5).cpus == 0.5  # The process backend caps CPUs too.
    settings = SandboxSettings.model_validate(
        {"sandbox_profiles": {"c": {"backend": "container", "image": "x", "cpus": 0.5}}}
    )
    assert settings.sandbox_profiles["c"].cpus == 0.5
    with pytest.raises(ValidationError, match="apply to the process backend only"):
        SandboxProfile(backend="container", image="x", blocked_paths=(".env",))
    with pytest.raises(ValidationError, match="secrets: both read-only and blocked"):
        SandboxProfile(read_only_paths=("secrets",), blocked_paths=("./secrets",))
    with pytest.raises(ValidationError, match="outside the workspace"):
        SandboxProfile(read_only_paths=("../etc",))
    assert SandboxProfile(blocked_paths=("./keys/",)).blocked_paths == ("keys",)


BUSY_FOR_A_SECOND = "timeout 1 sh -c 'while :; do :; done'; true"


CPU_CAP_TRIES = 4
"""Pairs of runs before the free one must have shown what an uncapped command takes: on a
machine busy with other work it may get no more than the capped one's share."""


async def test_a_cpu_cap_holds_a_busy_command_to_its_share_of_a_cpu(tmp_path: Path) -> None:
    tools = await tools_for(SandboxSettings(sandbox_profiles={"fifth": SandboxProfile(cpus=0.2)}))
    tries: list[list[float]] = []
    try:
        for attempt in range(CPU_CAP_TRIES):
            shares = []
            for name, profile in (("capped", "fifth"), ("free", None)):
                outcome = await run(
                    tools, tmp_path / f"{name}-{attempt}", BUSY_FOR_A_SECOND, profile
                )
                assert isinstance(outcome, Completed), outcome
                assert outcome.usage is not None
                assert outcome.usage.cpu_ms is not None
                shares.append(outcome.usage.cpu_ms / outcome.usage.wall_ms)
            tries.append(shares)
            # Capped at a fifth of a CPU (with the scheduler's slack), however idle the
            # machine; free, it takes what the machine gives, about one CPU when idle.
            assert shares[0] < 0.35, tries
            if shares[1] > 2 * shares[0]:
                break
    finally:
        await tools.close()
    assert tries[-1][1] > 2 * tries[-1][0], f"the machine never let the free command run: {tries}"
