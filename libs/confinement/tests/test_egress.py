"""Egress by host, outside any sandbox: which destinations may be named, where the forwarder
listens for each, and what the proxy admits (against a real TCP server on 127.0.0.1)."""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
from pathlib import Path

import pytest

from helmline.confinement import (
    FORWARDER_SCRIPT,
    Destination,
    EgressError,
    EgressPlan,
    EgressProxy,
)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("10.0.0.1:80", "an address must be a loopback IPv4 one"),
        ("::1:80", "an address must be a loopback IPv4 one"),
        ("example.com", "is not host:port"),
        ("example.com:0", "is not host:port"),
        ("example.com:65536", "is not host:port"),
        ("exa mple.com:80", "is not a host name"),
        ("-example.com:80", "is not a host name"),
    ],
)
def test_a_destination_is_a_host_name_or_a_loopback_address_and_a_port(
    text: str, problem: str
) -> None:
    with pytest.raises(EgressError, match=problem):
        Destination.parse(text)


def test_named_hosts_get_loopback_addresses_of_their_own_in_the_sandboxs_hosts_file() -> None:
    plan = EgressPlan.of(
        Destination.parse(text)
        for text in ("API.example.com:443", "api.example.com:80", "127.0.0.1:5432", "db:5432")
    )
    assert [(r.listen, str(r.destination)) for r in plan.routes] == [
        ("127.0.0.1:5432", "127.0.0.1:5432"),
        ("127.100.0.1:80", "api.example.com:80"),
        ("127.100.0.1:443", "api.example.com:443"),
        ("127.100.0.2:5432", "db:5432"),
    ]
    assert plan.hosts_file == "127.100.0.1 api.example.com\n127.100.0.2 db\n127.0.0.1 localhost\n"
    assert plan.forwarder_argv("/usr/bin/python3", "/f.py", "/s.sock") == [
        *("/usr/bin/python3", "-I", "-S", "/f.py", "/s.sock"),
        "127.0.0.1:5432=127.0.0.1:5432",
        "127.100.0.1:80=api.example.com:80",
        "127.100.0.1:443=api.example.com:443",
        "127.100.0.2:5432=db:5432",
        "--",
    ]


async def _ask(socket_path: Path, destination: str, message: bytes) -> bytes:
    reader, writer = await asyncio.open_unix_connection(str(socket_path))
    writer.write(destination.encode() + b"\n")
    answer = await reader.readline()
    if answer == b"ok\n":
        writer.write(message)
        await writer.drain()
        answer += await reader.readline()
    writer.close()
    return answer


async def test_the_proxy_admits_the_allowed_destinations_only_and_tells_of_each_refusal(
    tmp_path: Path,
) -> None:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"echo " + await reader.readline())
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    refused: list[tuple[str, str]] = []
    proxy = EgressProxy([Destination("127.0.0.1", port)], lambda *r: refused.append(r))
    await proxy.start(tmp_path / "egress.sock")
    try:
        assert await _ask(tmp_path / "egress.sock", f"127.0.0.1:{port}", b"hi\n") == (
            b"ok\necho hi\n"
        )
        other = port + 1 if port < 65535 else port - 1
        assert await _ask(tmp_path / "egress.sock", f"127.0.0.1:{other}", b"") == b"refused\n"
        assert await _ask(tmp_path / "egress.sock", "nonsense", b"") == b"refused\n"
        # What the forwarder saw refused inside the sandbox is recorded, and answered nothing.
        assert await _ask(tmp_path / "egress.sock", f"unrouted 127.0.0.1:{other}", b"") == b""
        assert refused == [
            (f"127.0.0.1:{other}", "not an allowed destination"),
            ("nonsense", "'nonsense' is not host:port (a port from 1 to 65535)"),
            (f"127.0.0.1:{other}", "not an allowed destination; refused in the sandbox"),
        ]
        assert proxy.refusals == 3
    finally:
        await proxy.close()
        server.close()


WHILE_RUNNING = """
import socket, sys
try:
    socket.create_connection(("127.0.0.1", 5999), timeout=5)
except OSError as error:
    print(type(error).__name__, flush=True)
sys.stdin.readline()
"""
"""Tries a port nothing in its namespace listens on, says how it ended, and runs on."""


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="the forwarder watches only as root; the test makes a network namespace",
)
async def test_the_proxy_catches_up_with_what_the_forwarder_saw_refused(tmp_path: Path) -> None:
    refused: list[str] = []
    proxy = EgressProxy([], lambda asked, _reason: refused.append(asked))
    await proxy.start(tmp_path / "egress.sock")
    # A network namespace of its own, loopback up: as a sandbox's, with nothing allowed
    # (and a pid namespace, so that killing unshare ends everything in it).
    socket_path = str(tmp_path / "egress.sock")
    forwarder = EgressPlan.of([]).forwarder_argv(sys.executable, str(FORWARDER_SCRIPT), socket_path)
    process = await asyncio.create_subprocess_exec(
        "unshare", "--net", "--pid", "--fork", "--kill-child", "--",
        "sh", "-c", 'ip link set lo up 2>/dev/null; exec "$@"', "-",
        *forwarder,
        sys.executable, "-c", WHILE_RUNNING,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert process.stdin is not None
    assert process.stdout is not None
    try:
        async with asyncio.timeout(10):
            assert await process.stdout.readline() == b"ConnectionRefusedError\n"
            # Refused a moment ago, inside; the command runs on. Once caught up, the proxy
            # knows of it, with no waiting beyond that.
            await proxy.caught_up()
            assert refused == ["127.0.0.1:5999"]
            process.stdin.write(b"\n")
            assert await process.wait() == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        await proxy.close()
