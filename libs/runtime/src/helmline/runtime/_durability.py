"""What an acknowledged append means: JetStream's fsync policy, and checks of a server's.

JetStream acknowledges an append once the message is in the server's page cache, and by
default flushes to disk every two minutes: a kill -9 loses nothing (the page cache
survives it), a power cut, kernel crash or VM reset loses whatever was not flushed yet.
With `sync_interval: always` it fsyncs before it acknowledges (docs/durability.md).
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from nats.js import JetStreamContext

from helmline.contracts import STREAMS

Durability = Literal["durable", "relaxed"]
"""`durable`: the server fsyncs every append before acknowledging it; `relaxed`: JetStream's
default, acknowledged at once and flushed to disk every two minutes."""

RELAXED_RISK = (
    "acknowledged events of up to the last ~2 minutes are lost on a power loss, kernel crash "
    "or VM reset (approvals given, tool calls completed whose side effects did happen)"
)
"""What relaxed durability risks, in the words `up`, `status` and the provision job use."""


def jetstream_config(store_dir: Path, durability: Durability) -> dict[str, Any]:
    """The `jetstream` block of a nats-server configuration storing under `store_dir`."""
    block: dict[str, Any] = {"store_dir": str(store_dir)}
    if durability == "durable":
        block["sync_interval"] = "always"
    return block


class DurabilityRefused(Exception):
    """The NATS servers acknowledge appends before the data is safe, and the deployment did
    not accept that by name; the message says what was found and how to accept it."""


@dataclass(frozen=True)
class DurabilityFindings:
    """What the provision job could see of the servers' durability."""

    single_replica_on_cluster: tuple[str, ...] = ()
    """Streams of one replica on a clustered server: a lost node loses their acknowledged
    appends."""
    lazy_fsync_servers: tuple[str, ...] = ()
    """Servers (by monitoring URL and name) that acknowledge before they fsync."""
    unchecked: str | None = None
    """Why the servers' fsync policy could not be checked (no monitoring endpoint given)."""


async def durability_findings(
    js: JetStreamContext, monitor_urls: Sequence[str], *, timeout_s: float = 5.0
) -> DurabilityFindings:
    """Look at the provisioned streams' replicas and, where monitoring endpoints are given
    (`http://host:8222`, one per server), each server's `sync_interval`."""
    single: list[str] = []
    for spec in STREAMS:
        info = await js.stream_info(spec.name)
        clustered = info.cluster is not None and info.cluster.name is not None
        if clustered and (info.config.num_replicas or 1) < 2:
            single.append(spec.name)
    lazy: list[str] = []
    for url in monitor_urls:
        varz = await asyncio.to_thread(_varz, url, timeout_s)
        config = varz.get("jetstream", {}).get("config", {})
        if not config.get("sync_always", False):
            lazy.append(f"{varz.get('server_name', '?')} ({url})")
    return DurabilityFindings(
        single_replica_on_cluster=tuple(single),
        lazy_fsync_servers=tuple(lazy),
        unchecked=None
        if monitor_urls
        else "no monitoring endpoint given, the servers' fsync policy was not checked",
    )


def refuse_unaccepted(
    findings: DurabilityFindings, *, accept_relaxed: bool, accept_single_replica: bool
) -> None:
    """Raise `DurabilityRefused` for what the findings show and the deployment did not accept."""
    problems: list[str] = []
    if findings.lazy_fsync_servers and not accept_relaxed:
        problems.append(
            f"NATS servers acknowledge appends before fsync: "
            f"{', '.join(findings.lazy_fsync_servers)}; {RELAXED_RISK}. Configure every "
            "server with `jetstream { sync_interval: always }`, or accept the risk with "
            "HELMLINE_ACCEPT_RELAXED_FSYNC=true (chart: nats.durability.acceptRelaxed)"
        )
    if findings.single_replica_on_cluster and not accept_single_replica:
        problems.append(
            f"streams of one replica on a NATS cluster: "
            f"{', '.join(findings.single_replica_on_cluster)}; losing that node's disk loses "
            "their acknowledged events. Set HELMLINE_STREAM_REPLICAS=3 (chart: "
            "nats.streamReplicas), or accept the risk with HELMLINE_ACCEPT_SINGLE_REPLICA=true "
            "(chart: nats.durability.acceptSingleReplica)"
        )
    if problems:
        raise DurabilityRefused("; and ".join(problems))


def _varz(url: str, timeout_s: float) -> dict[str, Any]:
    with urllib.request.urlopen(f"{url.rstrip('/')}/varz", timeout=timeout_s) as response:
        found: dict[str, Any] = json.load(response)
    return found
