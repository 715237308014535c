"""The tools the running stack offers, as its tool gateway last published them."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path

from helmline.cli._errors import CliError
from helmline.contracts import BUILTIN_TOOLS_BY_NAME, ToolRegistryPublished, ToolSpec


def known_tools(data_dir: Path | None) -> Mapping[str, ToolSpec]:
    """The tools a playbook may name: the running stack's registry, or the built-in tools
    when no stack can be reached (its MCP tools are then unknown)."""
    from helmline.cli._connection import stack_nats_url
    from helmline.cli._settings import load_settings
    from helmline.runtime import tools_of

    try:
        url = stack_nats_url(load_settings(data_dir=data_dir))
        return tools_of(asyncio.run(published_registry(url)))
    except CliError:
        return BUILTIN_TOOLS_BY_NAME


async def published_registry(url: str) -> ToolRegistryPublished | None:
    """The registry the gateway of the stack at `url` published last; None before its first."""
    from helmline.cli._connection import connect
    from helmline.runtime import latest_tool_registry

    async with connect(url) as log:
        return await latest_tool_registry(log.js)
