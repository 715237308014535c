"""Egress by host for commands (real bubblewrap): a profile naming destinations lets a call
granted a network reach those and nothing else, each refused connection named on the
call's result; a call granted none still has no network at all."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path

import pytest
from pydantic import ValidationError

from helmline.contracts import SandboxExecutionRequested, ToolCallCompleted, new_event
from helmline.runtime.testing import free_port
from helmline.sandbox import SandboxSettings, tools_for
from helmline.sandbox._backends import session_owner
from helmline.sandbox._calls import results
from helmline.sandbox._profiles import SandboxProfile
from helmline.sandbox._tools import Completed
from helmline.sandbox.testing import call

CONNECT = """
import socket, sys
for port in sys.argv[1:]:
    try:
        with socket.create_connection(("127.0.0.1", int(port)), timeout=5) as c:
            c.sendall(b"hi\\n")
            print(port, c.makefile().readline().strip())
    except OSError as error:
        print(port, type(error).__name__)
"""
"""Connects to each port named on 127.0.0.1 and prints what answered, or the error."""


@asynccontextmanager
async def echo_server() -> AsyncIterator[int]:
    """A TCP server on 127.0.0.1 that answers a line with `echo <line>`; its port."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        line = await reader.readline()
        writer.write(b"echo " + line)
        await writer.drain()
        writer.close()

    port = free_port()
    server = await asyncio.start_server(answer, "127.0.0.1", port)
    try:
        yield port
    finally:
        server.close()


async def connect(
    tmp_path: Path, profile: str, network: bool, *ports: int
) -> tuple[Completed, ToolCallCompleted]:
    """Run CONNECT in a call of `profile`; its outcome and its result event."""
    settings = SandboxSettings(
        sandbox_profiles={"egress": SandboxProfile(egress=(f"127.0.0.1:{ports[0]}",))}
    )
    tools = await tools_for(settings)
    try:
        (tmp_path / "ws").mkdir(exist_ok=True)
        (tmp_path / "ws" / "connect.py").write_text(CONNECT)
        # Then who the command is: the session's uid, holding no capability (the forwarder
        # before it, root in the sandbox, held some).
        who = "id -u; grep -E '^Cap(Inh|Prm|Eff|Amb)' /proc/self/status"
        command = f"python3 connect.py {' '.join(map(str, ports))}; {who}"
        tenant = f"t{uuid.uuid4().hex[:12]}"
        outcome = await call(
            tools,
            tmp_path / "ws",
            (tenant, "s1"),
            "run_command",
            {"command": command},
            profile=profile,
            network=network,
        )
    finally:
        await tools.close()
    assert isinstance(outcome, Completed), outcome
    assert isinstance(outcome.output, dict)
    stdout = str(outcome.output["stdout"]).splitlines()
    uid = session_owner(settings, tenant, "s1")
    assert stdout[len(ports)] == str(uid if uid is not None else os.getuid())
    held = [line.split()[1] for line in stdout[len(ports) + 1 :]]
    assert held == ["0000000000000000"] * 4, stdout
    connected = "".join(f"{line}\n" for line in stdout[: len(ports)])
    outcome = replace(outcome, output={**outcome.output, "stdout": connected})
    request = SandboxExecutionRequested(
        call_id="call-1", step_id="step-1", tool="run_command", network=network, profile=profile
    )
    cause = new_event(request, tenant="t", session_id="s1", source="test/tool-gateway")
    (event,) = results(cause, request, outcome, 1.0)
    assert isinstance(event.data, ToolCallCompleted)
    return outcome, event.data


async def test_a_call_reaches_only_its_profiles_destinations_and_names_the_refused(
    tmp_path: Path,
) -> None:
    async with echo_server() as allowed, echo_server() as other:
        outcome, completed = await connect(tmp_path, "egress", True, allowed, other)
    assert isinstance(outcome.output, dict)
    # The other server is open on the host, but nothing in the sandbox leads there.
    assert outcome.output["stdout"] == (f"{allowed} echo hi\n{other} ConnectionRefusedError\n"), (
        outcome.output
    )
    assert completed.egress_refused == (f"127.0.0.1:{other}",)


async def test_a_call_granted_no_network_has_none_under_an_egress_profile(tmp_path: Path) -> None:
    async with echo_server() as allowed:
        outcome, completed = await connect(tmp_path, "egress", False, allowed)
    assert isinstance(outcome.output, dict)
    assert outcome.output["stdout"] == f"{allowed} ConnectionRefusedError\n", outcome.output
    # Not let out at all: no proxy was there to refuse anything.
    assert completed.egress_refused == ()


def test_egress_destinations_are_checked() -> None:
    with pytest.raises(ValidationError, match="an address must be a loopback IPv4 one"):
        SandboxProfile(egress=("10.0.0.1:80",))
    with pytest.raises(ValidationError, match="egress applies to the process backend only"):
        SandboxProfile(backend="container", image="busybox", egress=("example.com:443",))
