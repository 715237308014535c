"""The whole stack the secrets, authority and API parts attack: every service as its own
process (the API too, so that its log is a file like the others'), a real nats-server and
PostgreSQL, the planted MCP server federated by the gateway, a scripted model, spans
exported over OTLP to a receiver that keeps them as sent. The default policy decides."""

from __future__ import annotations

import sys
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
import yaml
from nats.aio.client import Client as NATS
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from helmline.api import Role, new_api_key, store_api_key
from helmline.contracts import Actor
from helmline.planner.testing import ScriptedModel
from helmline.runtime import EventStore, connect_nats, ensure_topology
from helmline.runtime.testing import NatsServer, ServiceProcesses, free_port
from tests.e2e.mcp_servers import until_federated
from tests.e2e.otlp import otlp_endpoint

ROOT = Path(__file__).resolve().parents[2]
PLANTED_SERVER = ROOT / "tests" / "mcp-servers" / "planted_mcp_server.py"
SERVICES = ("planner", "approval", "tool_gateway", "state", "sandbox", "api")


class SpanSink(trace_service_pb2_grpc.TraceServiceServicer):
    """An OTLP trace endpoint keeping each export exactly as it was sent (bytes), so that a
    value is found in it wherever in a span it is."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._exports: list[bytes] = []

    def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: grpc.ServicerContext
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        with self._lock:
            self._exports.append(request.SerializeToString())
        return trace_service_pb2.ExportTraceServiceResponse()

    def received(self) -> bytes:
        with self._lock:
            return b"".join(self._exports)


@dataclass(frozen=True)
class Stack:
    services: ServiceProcesses
    nats_url: str
    database_url: str
    api_url: str
    model: ScriptedModel
    spans: SpanSink
    planted: Path
    """The planted MCP server's folder (`secrets.txt`, `sealed.txt`, `inbox.json`,
    `pages.json`, `issues.json`, and the ledger it writes, `ledger.jsonl`)."""
    connection: NATS
    store: EventStore

    @property
    def logs(self) -> list[Path]:
        """Every service's log file."""
        return sorted(self.services.data_dir.glob("*.log"))

    async def key(self, tenant: str, *roles: Role) -> dict[str, str]:
        """Headers carrying a new API key of `tenant` with `roles`."""
        key, record = new_api_key(tenant, roles, name=f"{tenant}-{'-'.join(roles)}")
        await store_api_key(self.connection.jetstream(), record, by=Actor(id="safety"))
        return {"Authorization": f"Bearer {key}"}


@asynccontextmanager
async def running_stack(folder: Path, database_url: str) -> AsyncIterator[Stack]:
    planted = folder / "planted"
    planted.mkdir()
    (planted / "secrets.txt").write_text("")
    (planted / "sealed.txt").write_text("")
    for held in ("inbox.json", "pages.json", "issues.json"):
        (planted / held).write_text("{}")
    mcp = folder / "mcp-servers.yaml"
    mcp.write_text(
        yaml.safe_dump(
            {
                "servers": [
                    {
                        "id": "planted",
                        "stdio": {
                            "command": sys.executable,
                            "args": [str(PLANTED_SERVER), str(planted)],
                        },
                        # Its ledger of what was performed: the one folder it may write.
                        "sandbox": {"write": [str(planted)]},
                        # As an MCP server's results are unless declared: anyone's words.
                        "trust": "untrusted",
                        # Reading runs unattended; `perform` keeps the default: high risk.
                        # Sending a mail and opening a ticket are medium: they run unless a
                        # taint rule asks for a person (had the content been trusted, none).
                        "tools": {
                            "vault": {"risk": "low"},
                            "vault_check": {"risk": "low"},
                            "inbox": {"risk": "low"},
                            "page": {"risk": "low", "effect": "none", "action": "read"},
                            "issue": {"risk": "low", "effect": "none", "action": "read"},
                            "send_mail": {"risk": "medium", "action": "write"},
                            "create_ticket": {"risk": "medium", "action": "write"},
                        },
                    }
                ]
            }
        )
    )
    spans = SpanSink()
    (folder / "nats").mkdir()
    api_port = free_port()
    with (
        otlp_endpoint(spans) as otlp_port,
        NatsServer(folder / "nats") as server,
        ScriptedModel() as model,
    ):
        connection = await connect_nats(server.url)
        await ensure_topology(connection.jetstream())
        env = {
            "HELMLINE_DATABASE_URL": database_url,
            "HELMLINE_MCP_SERVERS": str(mcp),
            "HELMLINE_API_PORT": str(api_port),
            "HELMLINE_LLM_BASE_URL": model.openai_url,
            "HELMLINE_LLM_API_KEY": "sk-scripted",
            "HELMLINE_LLM_MODEL": "scripted-1",
            # Debug: the most a service ever writes to its log, all searched.
            "HELMLINE_LOG_LEVEL": "DEBUG",
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{otlp_port}",
            "OTEL_EXPORTER_OTLP_INSECURE": "true",
            "OTEL_BSP_SCHEDULE_DELAY": "100",
        }
        services = ServiceProcesses(server.url, folder, env)
        try:
            for name in SERVICES:
                services.start(name)
            await until_federated(connection.jetstream(), "planted")
            yield Stack(
                services,
                server.url,
                database_url,
                f"http://127.0.0.1:{api_port}",
                model,
                spans,
                planted,
                connection,
                EventStore(connection.jetstream()),
            )
        finally:
            services.stop_all()
            await connection.close()
