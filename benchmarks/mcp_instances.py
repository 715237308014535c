"""What an MCP server isolated per session costs: the first call of a session, which starts
the session's instance (a process over stdio, a connection and an MCP session over HTTP) and
waits for it to list its tools, against a warm call of the same session, through the
gateway's handler. Over stdio with the gateway's stateful test server (Python) and with
server-everything (Node), over Streamable HTTP with server-everything. Instances are stopped
only after the last session, so that stopping one never runs inside another's call."""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import nats

from helmline.contracts import Event, Payload, ToolCallAuthorized, new_event
from helmline.runtime import Delivery, EventStore, ensure_topology
from helmline.runtime.testing import NatsServer
from helmline.tool_gateway._config import ServerConfig
from helmline.tool_gateway._federation import Federation
from helmline.tool_gateway._handlers import GatewayHandler
from helmline.tool_gateway._instances import Instances
from helmline.tool_gateway.testing import EVERYTHING_SCRIPT, NODE, server_everything

SESSIONS = 12
WARM_CALLS = 10
ROOT = Path(__file__).resolve().parents[1]
STATEFUL_SERVER = ROOT / "services/tool-gateway/tests/stateful_mcp_server.py"


def _figure(name: str, samples: list[float], **extra: Any) -> dict[str, Any]:
    ordered = sorted(samples)
    return {
        "figure": name,
        "calls": len(samples),
        "value": round(statistics.median(samples), 3),
        "p99": round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 3),
        "target": "reported",
        **extra,
    }


async def _handled(handler: GatewayHandler, session: str, data: Payload) -> float:
    """Milliseconds the handler took over one event of `session`."""
    event: Event = new_event(data, tenant="bench", session_id=session, source="bench")
    began = time.perf_counter()
    await handler(Delivery(event, 0, 1))
    return (time.perf_counter() - began) * 1000


async def _measure(handler: GatewayHandler, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    first: list[float] = []
    warm: list[float] = []
    for _ in range(SESSIONS):
        session = uuid.uuid4().hex
        for i in range(1 + WARM_CALLS):
            call = ToolCallAuthorized(
                call_id=f"c{i}", step_id="s", tool=tool, arguments=arguments, risk="low"
            )
            (warm if i else first).append(await _handled(handler, session, call))
    return {"first": first, "warm": warm}


async def run() -> list[dict[str, Any]]:
    script = ROOT / EVERYTHING_SCRIPT
    figures: list[dict[str, Any]] = []
    with (
        tempfile.TemporaryDirectory() as folder,
        NatsServer(Path(folder)) as nats_server,
        server_everything(script, Path(folder)) as url,
    ):
        connection = await nats.connect(nats_server.url)
        js = connection.jetstream()
        await ensure_topology(js)
        isolated = {"isolation": "session", "pool": {"max_instances": SESSIONS}}
        configs = [
            ServerConfig.model_validate(
                {
                    "id": "python",
                    "stdio": {"command": sys.executable, "args": [str(STATEFUL_SERVER)]},
                    **isolated,
                }
            ),
            ServerConfig.model_validate(
                {
                    "id": "node",
                    "stdio": {"command": NODE, "args": [str(script), "stdio"]},
                    # In its sandbox, as every stdio server: it reads its packages.
                    "sandbox": {"read": [str(ROOT / "tests/mcp-servers")]},
                }
                | isolated
            ),
            ServerConfig.model_validate({"id": "http", "http": {"url": url}} | isolated),
        ]
        store = EventStore(js)
        federation = Federation(store, configs)
        await federation.start()
        # With the connection calls are handed over on, as a gateway has: a session's first
        # call looks for an instance another gateway process runs before it starts one.
        instances = Instances(
            store, federation.servers, source="bench", gateway=federation.gateway, nc=connection
        )
        handler = GatewayHandler(store, federation, instances=instances)
        calls = {
            "python": ("python__remember", {"note": "n"}),
            "node": ("node__echo", {"message": "m"}),
            "http": ("http__echo", {"message": "m"}),
        }
        try:
            for server_id, (tool, arguments) in calls.items():
                assert await federation.servers[server_id].wait_connected(30)
                measured = await _measure(handler, tool, arguments)
                transport = "http" if server_id == "http" else f"stdio_{server_id}"
                figures += [
                    _figure(
                        f"mcp_session_instance_first_call_{transport}_ms",
                        measured["first"],
                        includes="the session's instance started and its tools listed, then "
                        "the call, through the gateway's handler",
                    ),
                    _figure(
                        f"mcp_session_instance_warm_call_{transport}_ms",
                        measured["warm"],
                        includes="a later call of the same session, through the handler",
                    ),
                ]
        finally:
            await instances.stop()
            await federation.stop()
            await connection.close()
    return figures
