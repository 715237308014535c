"""A tiny real MCP server (stdio) for tests: it opens and closes tickets, sends notices and
writes files, and writes every call it serves to a ledger file, which the stack never reads,
so that tests count real invocations at the tool's side. `python tickets_mcp_server.py
LEDGER`."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from pydantic import BaseModel


class Ticket(BaseModel):
    id: int
    title: str


def main(ledger: Path) -> None:
    server = MCPServer("tickets")

    def record(call: str, **details: object) -> int:
        with ledger.open("a") as file:
            file.write(json.dumps({"call": call, **details}) + "\n")
            file.flush()
            os.fsync(file.fileno())
        return sum(1 for _ in ledger.open())

    @server.tool()
    def open_ticket(title: str) -> Ticket:
        """Open a ticket; undone by close_ticket."""
        return Ticket(id=record("open", title=title), title=title)

    @server.tool()
    def close_ticket(id: int) -> str:
        """Close a ticket."""
        record("close", id=id)
        return f"closed {id}"

    @server.tool()
    def notify(message: str) -> str:
        """Send a notice; nothing can take it back."""
        record("notify", message=message)
        return "sent"

    @server.tool()
    def write_file(name: str, content: str) -> str:
        """Write a file beside the ledger."""
        record("write_file", name=name)
        (ledger.parent / Path(name).name).write_text(content)
        return f"wrote {len(content)} characters"

    server.run("stdio")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
