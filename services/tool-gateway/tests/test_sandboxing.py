"""Stdio MCP servers in their sandbox: what the probe server (sandbox_probe_server.py) may
read, write and connect to; egress only to the named destinations, refusals recorded; secrets
by reference resolved when a server starts and found in no event and no log line."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from nats.js import JetStreamContext

from helmline.contracts import Actor, ToolCallCompleted
from helmline.runtime import SealingKey, SecretStore, latest_tool_registry
from helmline.runtime.testing import eventually, free_port, stored_log
from helmline.tool_gateway import load_servers
from helmline.tool_gateway.testing import http_mcp_server
from helmline.yamlfile import YamlFileError

from .conftest import (  # type: ignore[import-not-found]
    Calls,
    federated,
    gateway_in_process,
)

pytestmark = pytest.mark.usefixtures("drop_consumer")

PROBE = Path(__file__).parent / "sandbox_probe_server.py"


def probe_servers(path: Path, server_id: str, **server: Any) -> Path:
    """A servers file federating the probe server over stdio as `server_id`."""
    entry = {"id": server_id, "stdio": {"command": sys.executable, "args": [str(PROBE)]}}
    path.write_text(yaml.safe_dump({"servers": [{**entry, "risk": "low", **server}]}))
    return path


async def probe(calls: Calls, server_id: str, tool: str, **arguments: Any) -> Any:
    """What the probe's tool answered."""
    outcome = await calls.outcome(await calls.authorise(f"{server_id}__{tool}", **arguments))
    assert isinstance(outcome, ToolCallCompleted), outcome
    assert isinstance(outcome.output, dict)
    return outcome.output.get("result", outcome.output)


@asynccontextmanager
async def echo_servers(count: int) -> AsyncIterator[list[int]]:
    """TCP servers on 127.0.0.1 that answer each line with `echo <port>: <line>`; their ports."""

    def answering(port: int) -> Any:
        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            line = await reader.readline()
            writer.write(f"echo {port}: {line.decode().strip()}\n".encode())
            await writer.drain()
            writer.close()

        return answer

    ports = [free_port() for _ in range(count)]
    servers = [await asyncio.start_server(answering(p), "127.0.0.1", p) for p in ports]
    try:
        yield ports
    finally:
        for server in servers:
            server.close()


async def test_a_sandboxed_server_reads_and_writes_only_what_it_is_given(
    nats_url: str, js: JetStreamContext, calls: Calls, tenant: str, server_id: str, tmp_path: Path
) -> None:
    readable, writable = tmp_path / "readable", tmp_path / "writable"
    for folder in (readable, writable):
        folder.mkdir()
    (readable / "notes.txt").write_text("given to read")
    (tmp_path / "not-given.txt").write_text("not given")
    sandbox = {"read": [str(readable)], "write": [str(writable)], "memory_mb": 256}
    servers = probe_servers(tmp_path / "servers.yaml", server_id, sandbox=sandbox)
    async with gateway_in_process(nats_url, servers, tenant):
        await federated(js, server_id)

        async def read(path: str) -> str:
            answer: str = await probe(calls, server_id, "read", path=path)
            return answer

        async def write(path: str) -> str:
            answer: str = await probe(calls, server_id, "write", path=path, text="probe")
            return answer

        assert await read("/etc/shadow") == "failed: FileNotFoundError: No such file or directory"
        assert (await read(str(tmp_path / "not-given.txt"))).startswith("failed: FileNotFound")
        assert await read(str(readable / "notes.txt")) == "read: given to read"
        read_only = "failed: OSError: Read-only file system"
        beside_the_server = PROBE.parent / "probe-written"
        for outside in (
            "/etc/passwd",
            "/usr/probe",
            "/probe",
            str(readable / "x"),
        ):
            assert await write(outside) == read_only, outside
        # Beside the server: refused, or, for a checkout under /tmp (CI's), written to the
        # sandbox's own /tmp, where the folders above the script exist only as mount points;
        # the host's folder stays as it was either way.
        assert await write(str(beside_the_server)) in (read_only, "written")
        assert not beside_the_server.exists()
        # Under /tmp it writes to a /tmp of its own: the host's folder stays as it was.
        await write(str(tmp_path / "x"))
        assert not (tmp_path / "x").exists()
        # Its own folder, its /tmp and what it may write.
        for inside in ("/home/mcp/x", "/tmp/x", str(writable / "x")):
            assert await write(inside) == "written", inside
        assert (writable / "x").read_text() == "probe"
        held = await probe(calls, server_id, "capabilities")
        assert (held["CapEff"], held["CapPrm"], held["CapAmb"]) == (0, 0, 0), held
        assert await probe(calls, server_id, "allocate", mb=16) == "allocated 16 MiB"
        assert await probe(calls, server_id, "allocate", mb=512) == "failed: MemoryError"


async def test_a_sandboxed_server_reaches_only_the_destinations_named(
    nats_url: str,
    js: JetStreamContext,
    calls: Calls,
    tenant: str,
    server_id: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with echo_servers(3) as (allowed, named, not_allowed):
        network = [f"127.0.0.1:{allowed}", f"localhost:{named}"]
        servers = probe_servers(tmp_path / "servers.yaml", server_id, sandbox={"network": network})
        async with gateway_in_process(nats_url, servers, tenant):
            await federated(js, server_id)

            async def connect(host: str, port: int) -> str:
                answer: str = await probe(
                    calls, server_id, "connect", host=host, port=port, message="hi"
                )
                return answer

            assert await connect("127.0.0.1", allowed) == f"answered: echo {allowed}: hi"
            assert await connect("localhost", named) == f"answered: echo {named}: hi"
            # Open on the host, but not named: nothing in the sandbox leads there.
            refused = "failed: ConnectionRefusedError: Connection refused"
            caplog.set_level(logging.WARNING)
            assert await connect("127.0.0.1", not_allowed) == refused
            assert await connect("127.0.0.1", named) == refused
            # Recorded on the call it was refused during: the forwarder tells the proxy of an
            # attempt as the kernel refuses it, well before the server's answer has made its
            # way back through the MCP session (a refusal told later would be missed: see
            # `EgressRefusals`).
            outcome = await calls.outcome(
                await calls.authorise(
                    f"{server_id}__connect", host="127.0.0.1", port=not_allowed, message="hi"
                )
            )
            assert isinstance(outcome, ToolCallCompleted), outcome
            assert outcome.egress_refused == (f"127.0.0.1:{not_allowed}",)
            # Refused in the sandbox, and recorded in the gateway's log all the same.
            for unrouted in (not_allowed, named):
                message = f"connection to 127.0.0.1:{unrouted} refused (not an allowed"
                await eventually(lambda m=message: m in caplog.text, what=message)  # type: ignore[misc]
            # The forwarder watches with capabilities the server never holds.
            held = await probe(calls, server_id, "capabilities")
            assert set(held.values()) == {0}, held
            # Asked of the proxy itself, it refuses, and says so too.
            asked = await probe(
                calls,
                server_id,
                "ask_proxy",
                path="/run/helmline/egress.sock",
                destination=f"127.0.0.1:{not_allowed}",
            )
            assert asked == "refused"
            assert (
                f"connection to 127.0.0.1:{not_allowed} refused (not an allowed destination)"
                in caplog.text
            )


async def test_a_sandboxed_server_without_destinations_has_no_network(
    nats_url: str, js: JetStreamContext, calls: Calls, tenant: str, server_id: str, tmp_path: Path
) -> None:
    async with echo_servers(1) as (port,):
        servers = probe_servers(tmp_path / "servers.yaml", server_id)
        async with gateway_in_process(nats_url, servers, tenant):
            await federated(js, server_id)
            answer = await probe(
                calls, server_id, "connect", host="127.0.0.1", port=port, message="hi"
            )
            assert answer == "failed: ConnectionRefusedError: Connection refused"


async def test_secrets_by_reference_are_resolved_at_start_and_never_recorded(
    nats_url: str,
    js: JetStreamContext,
    calls: Calls,
    tenant: str,
    server_id: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    key = SealingKey.generate()
    value = f"probe-token-{server_id}"
    await (await SecretStore.open(js, key)).set(tenant, "PROBE_TOKEN", value, by=Actor(id="t"))
    digest = hashlib.sha256(value.encode()).hexdigest()
    port = free_port()
    with http_mcp_server(
        [sys.executable, str(PROBE), str(port)], port, tmp_path / "probe-http.log"
    ) as url:
        env = {"PROBE_TOKEN": {"secret": "PROBE_TOKEN"}, "PLAIN": "plain"}
        stdio = {"command": sys.executable, "args": [str(PROBE)], "env": env}
        servers = tmp_path / "servers.yaml"
        http_id = f"{server_id}-h"
        token = {"secret": "PROBE_TOKEN"}
        servers.write_text(
            yaml.safe_dump(
                {
                    "servers": [
                        {"id": server_id, "stdio": stdio, "risk": "low"},
                        {
                            "id": http_id,
                            "http": {"url": url, "headers": {"X-Token": token}},
                            "risk": "low",
                        },
                    ]
                }
            )
        )
        settings = {"secrets_key": key.text(), "mcp_secrets_tenant": tenant}
        async with gateway_in_process(nats_url, servers, tenant, **settings):
            await federated(js, server_id)
            await federated(js, http_id)
            environment = await probe(calls, server_id, "environment")
            # Only what the file names, over the sandbox's own few (bubblewrap sets PWD).
            own = {"PATH", "HOME", "TMPDIR", "LANG", "PWD"}
            assert set(environment) == {"PROBE_TOKEN", "PLAIN", *own}
            assert environment["PROBE_TOKEN"] == digest
            header = await probe(calls, http_id, "header", name="X-Token")
            assert header == digest
        assert value.encode() not in await stored_log(js)
        registry = await latest_tool_registry(js)
        assert registry is not None
        assert value not in registry.model_dump_json()
        assert value not in caplog.text


@pytest.mark.parametrize(
    ("server", "problem"),
    [
        ({"sandbox": {"network": ["10.0.0.1:80"]}}, "an address must be a loopback IPv4 one"),
        ({"sandbox": {"network": ["example.com"]}}, "'example.com' is not host:port"),
        ({"sandbox": {"read": ["srv/data"]}}, "read: 'srv/data' is not an absolute path"),
        ({"sandbox": {"write": ["/usr/lib"]}}, "write: '/usr/lib' would let the server change"),
        ({"sandbox": {"memory_mb": 1}}, "greater than or equal to 16"),
        ({"sandbox": {"cpus": 1}}, "cpus"),
        ({"stdio": {"command": "x", "env": {"A": {"secret": "no such"}}}}, "is not a secret name"),
        ({"http": {"url": "http://h/mcp"}, "sandbox": {}}, "`sandbox` is for stdio servers"),
    ],
)
def test_the_sandbox_and_secret_references_are_checked_at_load(
    tmp_path: Path, server: dict[str, Any], problem: str
) -> None:
    entry = {"id": "probe", "stdio": {"command": sys.executable}, **server}
    if "http" in server:
        del entry["stdio"]
    path = tmp_path / "servers.yaml"
    path.write_text(yaml.safe_dump({"servers": [entry]}))
    with pytest.raises(YamlFileError) as error:
        load_servers(path)
    assert problem in str(error.value)
