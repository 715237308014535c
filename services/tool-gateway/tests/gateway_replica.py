"""One tool gateway replica as its own process, consuming one test tenant's calls:
`python gateway_replica.py` with HELMLINE_* settings, TEST_TENANT and TEST_ACK_WAIT_S, and
TEST_SESSION to consume only that session's calls, on a consumer of its own."""

from __future__ import annotations

import os

from conftest import gateway_consumer  # This script's folder leads sys.path.
from helmline.runtime import run_service
from helmline.tool_gateway import load_servers
from helmline.tool_gateway.__main__ import setup_gateway
from helmline.tool_gateway._settings import GatewaySettings

if __name__ == "__main__":
    consumer = gateway_consumer(
        os.environ["TEST_TENANT"],
        float(os.environ["TEST_ACK_WAIT_S"]),
        os.environ.get("TEST_SESSION"),
    )
    settings = GatewaySettings()
    assert settings.mcp_servers is not None
    servers = load_servers(settings.mcp_servers)
    run_service("tool-gateway", settings, setup_gateway(settings, servers, consumer))
