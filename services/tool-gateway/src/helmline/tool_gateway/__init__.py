"""Helmline tool-gateway service: the one door to tools: validation, MCP federation,
resilience, rate limits and output safety."""

from helmline.tool_gateway._config import ServersFile, load_servers

__all__ = ["ServersFile", "load_servers"]
