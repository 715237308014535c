"""Attacks from inside run_command, against each backend (real bubblewrap and cgroups; real
containers on a private dockerd): each must fail, or be stopped and reported as the limit it
hit. The commands use only what both a Debian host and a busybox image have."""

from __future__ import annotations

import asyncio
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from pydantic import JsonValue

from helmline.contracts import LimitHit, ResourceUsage, SandboxLimits
from helmline.sandbox import SandboxSettings, Tools
from helmline.sandbox._commands import MARKER_VARIABLE
from helmline.sandbox._containers import ContainerBackend
from helmline.sandbox._tools import Completed, Failed, Outcome
from helmline.sandbox.testing import call, processes_of


@pytest.fixture
def workspaces(tmp_path: Path) -> Path:
    return tmp_path / "workspaces"


async def run(
    tools: Tools,
    workspaces: Path,
    command: str,
    *,
    session_id: str = "s1",
    network: bool = False,
    heard: list[tuple[LimitHit, float]] | None = None,
    **limits: float,
) -> Outcome:
    """Run `command` as run_command; warnings of limits it comes near go into `heard`."""

    def warned(hit: LimitHit, used: float, usage: ResourceUsage) -> None:
        assert usage.wall_ms > 0
        if heard is not None:
            heard.append((hit, used))

    workspace = workspaces / TENANT / session_id
    return await call(
        tools,
        workspace,
        (TENANT, session_id),
        "run_command",
        {"command": command},
        limits=SandboxLimits(**limits),
        network=network,
        approached=warned,
    )


TENANT = f"t{uuid.uuid4().hex[:12]}"
"""This run's own tenant, so that its sessions' uids differ from those of runs beside it
(processes are looked for by uid)."""


def output_of(outcome: Outcome) -> dict[str, JsonValue]:
    assert isinstance(outcome, Completed), outcome
    assert isinstance(outcome.output, dict)
    return outcome.output


def on_host(path: str) -> bool:
    """Whether the host has `path` (not the sandbox's view of it)."""
    return os.path.exists(path)


@pytest.fixture
async def listener() -> AsyncIterator[int]:
    """A TCP listener on the host's loopback; its port."""
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    yield server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()


CONNECT = (
    "if command -v python3 >/dev/null; "
    "then python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), 2)\"; "
    "else nc -w 2 127.0.0.1 {port} </dev/null; fi"
)
"""Connects to a port on 127.0.0.1 with what the sandbox has: Python, or busybox's nc."""


async def test_the_host_loopback_is_unreachable_without_a_network(
    tools: Tools, workspaces: Path, listener: int
) -> None:
    refused = output_of(await run(tools, workspaces, CONNECT.format(port=listener)))
    assert refused["exit_code"] != 0
    assert "refused" in str(refused["stderr"]).lower()
    # The same command reaches the listener when policy grants a network.
    granted = output_of(await run(tools, workspaces, CONNECT.format(port=listener), network=True))
    assert granted["exit_code"] == 0, granted["stderr"]


async def test_nothing_outside_the_workspace_is_writable(
    tools: Tools, workspaces: Path, tmp_path: Path
) -> None:
    targets = ["/usr/pwned", "/etc/pwned", "/pwned", "/bin/pwned", str(tmp_path / "pwned")]
    script = "; ".join(
        f"(echo x > {target}) 2>/dev/null && echo WROTE {target}" for target in targets
    )
    result = output_of(await run(tools, workspaces, f"{script}; echo x > /tmp/mine && echo x > ok"))
    assert "WROTE" not in str(result["stdout"])
    assert result["exit_code"] == 0, result  # The private /tmp and the workspace are writable.
    assert (workspaces / TENANT / "s1" / "ok").read_text() == "x\n"
    assert not on_host("/tmp/mine")
    assert not any(on_host(target) for target in targets)


async def test_the_hosts_root_and_other_workspaces_cannot_be_read(
    tools: Tools, workspaces: Path
) -> None:
    assert isinstance(
        await run(tools, workspaces, "echo secret > secret", session_id="other"), Completed
    )
    other = workspaces / TENANT / "other" / "secret"
    assert other.read_text() == "secret\n"
    result = output_of(
        await run(tools, workspaces, f"cat {other}; cat ../other/secret; ls /root; cat /etc/shadow")
    )
    assert "secret" not in str(result["stdout"])
    assert result["exit_code"] != 0


async def test_setsid_and_nohup_children_are_gone_when_the_call_returns(
    tools: Tools, workspaces: Path
) -> None:
    result = output_of(
        await run(
            tools,
            workspaces,
            "nohup sleep 60 >/dev/null 2>&1 & setsid sleep 60 >/dev/null 2>&1 & echo started",
        )
    )
    assert result["stdout"] == "started\n"
    uid = (workspaces / TENANT / "s1").stat().st_uid
    assert uid >= SandboxSettings().sandbox_uid_base
    assert not processes_of(uid)


async def test_a_fork_bomb_is_stopped_by_the_process_limit(tools: Tools, workspaces: Path) -> None:
    began = time.monotonic()
    outcome = await run(tools, workspaces, "bomb() { bomb | bomb; }; bomb", max_processes=32)
    assert time.monotonic() - began < 20  # Well below its 30 s wall clock, on a busy host too.
    assert isinstance(outcome, Failed), outcome
    assert outcome.error.kind == "limit"
    assert outcome.limit is not None
    assert (outcome.limit.limit, outcome.limit.value) == ("processes", 32)
    assert not processes_of((workspaces / TENANT / "s1").stat().st_uid)


async def test_twice_the_memory_limit_is_killed_and_reported_as_memory(
    tools: Tools, workspaces: Path
) -> None:
    # tail keeps the last line whole: a line of 128 MiB holds 128 MiB.
    command = "head -c 128m /dev/zero | tail | wc -c"
    outcome = await run(tools, workspaces, command, memory_mb=64)
    assert isinstance(outcome, Failed), outcome
    assert outcome.error.kind == "limit"
    assert "64 MiB" in outcome.error.message
    assert outcome.limit is not None
    assert (outcome.limit.limit, outcome.limit.value, outcome.limit.command) == (
        "memory",
        64,
        command,
    )
    assert outcome.usage is not None
    assert outcome.usage.peak_memory_mb is not None
    assert outcome.usage.peak_memory_mb <= 65
    # Within the limit, the same kind of command runs.
    assert (
        output_of(await run(tools, workspaces, command.replace("128", "16"), memory_mb=64))[
            "stdout"
        ]
        == f"{16 << 20}\n"
    )


async def test_writing_past_the_file_size_limit_fails(tools: Tools, workspaces: Path) -> None:
    outcome = await run(tools, workspaces, "head -c 3000000 /dev/zero > big", max_file_mb=1)
    assert isinstance(outcome, Failed), outcome
    assert outcome.limit is not None
    assert (outcome.limit.limit, outcome.limit.value) == ("file_size", 1)
    assert (workspaces / TENANT / "s1" / "big").stat().st_size <= 1024 * 1024


async def test_output_beyond_the_cap_is_truncated_and_flagged(
    tools: Tools, workspaces: Path
) -> None:
    outcome = await run(tools, workspaces, "yes | head -c 100000", max_output_bytes=1000)
    assert isinstance(outcome, Completed)
    assert outcome.truncated
    output = output_of(outcome)
    assert output["stdout_truncated"] is True
    assert str(output["stdout"]).startswith("y\n" * 500 + "\n[output cut: 100000 bytes")


async def test_a_one_second_cpu_limit_stops_a_busy_loop(tools: Tools, workspaces: Path) -> None:
    began = time.monotonic()
    outcome = await run(tools, workspaces, "while :; do :; done", cpu_s=1)
    assert time.monotonic() - began < 20  # Stopped by the CPU limit, not the 30 s wall clock.
    assert isinstance(outcome, Failed), outcome
    assert outcome.limit is not None
    assert (outcome.limit.limit, outcome.limit.value) == ("cpu", 1)
    assert outcome.usage is not None
    assert outcome.usage.cpu_ms is not None
    # The kernel checks RLIMIT_CPU against tick-sampled time, which on a loaded host runs
    # ahead of the exact time the cgroup counts: measured, and near the limit.
    assert outcome.usage.cpu_ms >= 500


async def test_nearing_the_memory_limit_is_warned_and_the_call_goes_on(
    tools: Tools, workspaces: Path
) -> None:
    heard: list[tuple[LimitHit, float]] = []
    # /tmp is memory, charged to the call: 58 MiB of a 64 MiB limit, held for a moment.
    command = "head -c 58m /dev/zero > /tmp/fill && sleep 0.5"
    outcome = await run(tools, workspaces, command, memory_mb=64, heard=heard)
    assert isinstance(outcome, Completed), outcome
    assert outcome.exit_code == 0
    assert outcome.usage is not None
    assert outcome.usage.peak_memory_mb is not None
    assert 57.6 <= outcome.usage.peak_memory_mb < 64
    memory = [(hit, used) for hit, used in heard if hit.limit == "memory"]
    assert len(memory) == 1
    hit, used = memory[0]
    assert (hit.value, hit.command) == (64, command)
    assert 57.6 <= used < 64


async def test_a_timeout_is_warned_before_it_is_hit(tools: Tools, workspaces: Path) -> None:
    heard: list[tuple[LimitHit, float]] = []
    outcome = await run(tools, workspaces, "sleep 10", timeout_s=1, heard=heard)
    assert isinstance(outcome, Failed), outcome
    assert outcome.limit is not None
    assert outcome.limit.limit == "timeout"
    assert [hit.limit for hit, _ in heard] == ["timeout"]
    assert 0.9 <= heard[0][1] < 1.5


async def test_a_busy_loop_split_over_processes_is_stopped_too(
    tools: Tools, workspaces: Path
) -> None:
    # RLIMIT_CPU counts each process alone; the call's cgroup counts them together.
    outcome = await run(
        tools, workspaces, "for i in 1 2 3 4; do (while :; do :; done) & done; wait", cpu_s=1
    )
    assert isinstance(outcome, Failed), outcome
    assert outcome.limit is not None
    assert outcome.limit.limit == "cpu"


def test_listening_socket_helper_is_loopback() -> None:
    # Guards the loopback test: the listener really is on the host's 127.0.0.1.
    with socket.create_server(("127.0.0.1", 0)) as server:
        assert server.getsockname()[0] == "127.0.0.1"


async def test_a_workspace_made_before_it_had_an_owner_becomes_the_sessions(
    tools: Tools, workspaces: Path
) -> None:
    old = workspaces / TENANT / "legacy"
    (old / "notes").mkdir(parents=True)
    (old / "notes" / "todo.txt").write_text("root's\n")
    result = output_of(
        await run(
            tools,
            workspaces,
            "echo mine >> notes/todo.txt; cat notes/todo.txt",
            session_id="legacy",
        )
    )
    assert result["stdout"] == "root's\nmine\n"
    usage = result["usage"]
    assert isinstance(usage, dict)
    assert set(usage) == {"wall_ms", "cpu_ms", "peak_memory_mb"}


async def test_a_command_gets_its_own_variables_and_nothing_else_of_any_process(
    tools: Tools, workspaces: Path
) -> None:
    workspace = workspaces / TENANT / "s-env"
    outcome = await call(
        tools,
        workspace,
        (TENANT, "s-env"),
        "run_command",
        {"command": "env", "env": {"TOKEN": "from-env-1", "PATH": "/nowhere"}},
    )
    printed = dict(
        line.split("=", 1) for line in str(output_of(outcome)["stdout"]).splitlines() if "=" in line
    )
    assert printed["TOKEN"] == "from-env-1"
    # What every command gets wins.
    assert printed["PATH"] == "/usr/local/bin:/usr/bin:/bin"
    own = {"TOKEN", "PATH", "HOME", "TMPDIR", "LANG", "PWD", "SHLVL", "_"}
    if isinstance(tools.backend, ContainerBackend):
        # The engine names every container's host, and an exec'd command is the call's only
        # process outside the container's own, so it carries the call's marker: a sandbox
        # restarted after a crash finds the call's processes by it. Bubblewrap carries the
        # marker outside the sandbox instead.
        own |= {"HOSTNAME", MARKER_VARIABLE}
    assert set(printed) - own == set()
