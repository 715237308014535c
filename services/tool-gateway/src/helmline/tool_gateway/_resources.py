"""MCP resources and prompts: what a server offers besides tools, and how a resource is read.

A server that lists resources gets one more tool in the registry, `<server>__read_resource`:
reading a resource is then a call like any other, so it is judged by policy, recorded in the
session's log, and its content goes through the same output safety and size cap as a tool's
output before a model sees it. A planner's model reads a resource as context by calling that
tool; a playbook step does the same (`tool: docs__read_resource, arguments: {uri: ...}`).
Its `uri` argument is an enum of the listed URIs: a model cannot make it read anything the
server did not offer. A server with a tool of its own named `read_resource` keeps it, and its
resources are then listed but not readable.

Prompts are listed (in the registry, `helmline tools`, the console) for people and playbook
authors; the gateway does not fill them in.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, TypeVar

from mcp import Client
from mcp.types import (
    BlobResourceContents,
    CallToolResult,
    ReadResourceResult,
    TextContent,
)
from pydantic import JsonValue

from helmline.contracts import McpPrompt, McpPromptArgument, McpResource, ToolDefinition
from helmline.runtime import make_text_safe
from helmline.tool_gateway._registry import Listed

T = TypeVar("T")

RESOURCE_READER = "read_resource"
"""The tool (`<server>__read_resource`) that reads one of a server's resources."""

MOST_LISTED = 100
"""Resources, and prompts, listed per server: the rest are left out (and the reader's
`uri` enum, the registry event and the model's tool list stay small)."""

_DESCRIBED_IN_READER = 20
"""Resources named in the reader's description; the enum holds every listed one."""


async def list_resources(client: Client) -> tuple[McpResource, ...]:
    """The server's resources, the first `MOST_LISTED` of them; none if it offers none."""
    if client.server_capabilities.resources is None:
        return ()

    async def page(cursor: str | None) -> tuple[list[McpResource], str | None]:
        listed = await client.list_resources(cursor=cursor, cache_mode="refresh")
        resources = [
            McpResource(
                uri=resource.uri,
                name=_said(resource.title or resource.name, 256),
                description=_said(resource.description or "", 1024),
                mime_type=_cut(resource.mime_type, 256) if resource.mime_type else None,
            )
            for resource in listed.resources
            if 0 < len(resource.uri) <= 2048
        ]
        return resources, listed.next_cursor

    return await _first_pages(page)


async def list_prompts(client: Client) -> tuple[McpPrompt, ...]:
    """The server's prompts, the first `MOST_LISTED` of them; none if it offers none."""
    if client.server_capabilities.prompts is None:
        return ()

    async def page(cursor: str | None) -> tuple[list[McpPrompt], str | None]:
        listed = await client.list_prompts(cursor=cursor, cache_mode="refresh")
        prompts = [
            McpPrompt(
                name=_said(prompt.name, 256),
                description=_said(prompt.description or "", 1024),
                arguments=tuple(
                    McpPromptArgument(
                        name=_said(argument.name, 256),
                        description=_said(argument.description or "", 1024),
                        required=bool(argument.required),
                    )
                    for argument in prompt.arguments or ()
                ),
            )
            for prompt in listed.prompts
            if prompt.name
        ]
        return prompts, listed.next_cursor

    return await _first_pages(page)


async def _first_pages(
    page: Callable[[str | None], Awaitable[tuple[list[T], str | None]]],
) -> tuple[T, ...]:
    """The items of a paginated listing, page after page until `MOST_LISTED` are read."""
    listed: list[T] = []
    cursor: str | None = None
    while len(listed) < MOST_LISTED:
        items, cursor = await page(cursor)
        listed.extend(items)
        if cursor is None:
            break
    return tuple(listed[:MOST_LISTED])


def with_reader(
    server: str, tools: Sequence[ToolDefinition], resources: Sequence[McpResource]
) -> list[ToolDefinition]:
    """A server's tools, and the reader of its resources if it lists some and has no tool
    of that name itself."""
    if not resources or any(tool.name == RESOURCE_READER for tool in tools):
        return list(tools)
    return [*tools, reader_definition(server, resources)]


def reader_definition(server: str, resources: Sequence[McpResource]) -> ToolDefinition:
    """The reader of a server's resources, as if the server listed it: read-only and
    idempotent, so it locks no rollback and may be sent again."""
    named = "\n".join(_line(resource) for resource in resources[:_DESCRIBED_IN_READER])
    more = len(resources) - _DESCRIBED_IN_READER
    if more > 0:
        named += f"\n(and {more} more: see the uri's allowed values)"
    return ToolDefinition(
        name=RESOURCE_READER,
        description=f"Read one of MCP server {server}'s resources as context: its content, "
        f"made safe and cut to size like any tool's output. Resources:\n{named}",
        input_schema={
            "type": "object",
            "properties": {
                "uri": {
                    "type": "string",
                    "enum": [resource.uri for resource in resources],
                    "description": "The resource's URI, one the server lists.",
                }
            },
            "required": ["uri"],
            "additionalProperties": False,
        },
        annotations={"readOnlyHint": True, "idempotentHint": True},
    )


def reads_resource(remote_name: str, listed: Iterable[Listed]) -> bool:
    """Whether a call of `remote_name` is the gateway's reader rather than a tool of the
    server's own (`listed`: the tools the server lists itself)."""
    return remote_name == RESOURCE_READER and all(
        tool.definition.name != RESOURCE_READER for tool in listed
    )


async def read_resource(client: Client, arguments: dict[str, Any], meta: Any) -> CallToolResult:
    """Read the resource the call names, as the result of a tool call: its text contents as
    structured content (`uri`, `mime_type`, `text`), binary ones described, not inlined."""
    result: ReadResourceResult = await client.read_resource(
        str(arguments["uri"]), meta=meta, cache_mode="refresh"
    )
    contents = [_content(item) for item in result.contents]
    structured: dict[str, JsonValue] = (
        contents[0] if len(contents) == 1 else {"contents": list[JsonValue](contents)}
    )
    text = json.dumps(structured, ensure_ascii=False)
    return CallToolResult(
        content=[TextContent(type="text", text=text)], structured_content=structured
    )


def _content(item: Any) -> dict[str, JsonValue]:
    if isinstance(item, BlobResourceContents):
        return {
            "uri": item.uri,
            "mime_type": item.mime_type,
            "blob_base64_chars": len(item.blob),
            "omitted": True,
        }
    return {"uri": item.uri, "mime_type": item.mime_type, "text": item.text}


def _line(resource: McpResource) -> str:
    # The URI and a short name only: a server's descriptions are not pinned as its tools'
    # are, so they are left out of what a model is told the tool is for.
    return f"- {resource.uri}: {_cut(resource.name, 80)}"


def _said(text: str, most: int) -> str:
    """A server's words about a resource or a prompt, as the registry keeps them: through
    output safety (they reach people, and a model in the reader's description), cut to
    `most` characters."""
    return _cut(make_text_safe(_cut(text, most), max_bytes=4 * most)[0], most)


def _cut(text: str, most: int) -> str:
    return text if len(text) <= most else text[: most - 1] + "…"
