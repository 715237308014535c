"""One tool gateway replica as its own process, consuming one test tenant's calls:
`python gateway_replica.py` with HELMLINE_* settings, TEST_TENANT and TEST_ACK_WAIT_S."""

from __future__ import annotations

import os

from helmline.contracts import TOOL_GATEWAY_CONSUMER, ToolCallAuthorized, event_type_filter
from helmline.runtime import run_service
from helmline.tool_gateway import load_servers
from helmline.tool_gateway.__main__ import setup_gateway
from helmline.tool_gateway._settings import GatewaySettings

if __name__ == "__main__":
    tenant = os.environ["TEST_TENANT"]
    consumer = TOOL_GATEWAY_CONSUMER.model_copy(
        update={
            "durable": f"gateway-{tenant}",
            "filter_subjects": (event_type_filter(ToolCallAuthorized.TYPE, tenant),),
            "ack_wait_s": float(os.environ["TEST_ACK_WAIT_S"]),
        }
    )
    settings = GatewaySettings()
    assert settings.mcp_servers is not None
    servers = load_servers(settings.mcp_servers)
    run_service("tool-gateway", settings, setup_gateway(settings, servers, consumer))
