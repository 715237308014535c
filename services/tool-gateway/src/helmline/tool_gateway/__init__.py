"""Helmline tool-gateway service: the one door to tools: validation, MCP federation,
resilience, rate limits, output safety and pinned tool definitions."""

from helmline.tool_gateway._config import ServersFile, load_servers
from helmline.tool_gateway._raw_outputs import RawOutputs, raw_output_name

__all__ = [
    "RawOutputs",
    "ServersFile",
    "load_servers",
    "raw_output_name",
]
