"""A real MCP server for the chaos suite that notes each real invocation of its tool in a
witness file the stack never reads: `python witness_mcp_server.py FILE` (stdio), or with a
port as second argument, Streamable HTTP on 127.0.0.1:PORT."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import uvicorn
from mcp.server.mcpserver import MCPServer


def main(witness: Path, port: int | None) -> None:
    server = MCPServer("witness")

    @server.tool()
    def record(token: str) -> str:
        """Note `token` once per invocation (an effect outside Helmline: never idempotent)."""
        # O_APPEND: the gateway replicas each run an instance, all writing to one file.
        descriptor = os.open(witness, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(descriptor, f"{token}\n".encode())
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
        return f"noted {token}"

    if port is None:
        server.run("stdio")
    else:
        uvicorn.run(server.streamable_http_app(), host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else None)
