"""`helmline tools`: the federated tool registry, as the running stack's gateway published it;
`helmline tools diff` and `accept`: the MCP tools held because their definition changed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from helmline.cli._errors import CliError
from helmline.cli._options import DEFAULT_TENANT, DataDir, Json, SessionId, Tenant
from helmline.cli._running import attempt, fail, nats_url, run_async
from helmline.contracts import (
    BUILTIN_TOOLS_BY_NAME,
    ToolRegistryPublished,
)

app = typer.Typer(
    help="The tools sessions may call; the MCP tools held because their definition changed.",
    invoke_without_command=True,
)

ToolArg = Annotated[str, typer.Argument(help="The tool, as the registry names it: SERVER__TOOL.")]

McpServersFile = Annotated[
    Path | None,
    typer.Option(
        "--mcp-servers",
        envvar="HELMLINE_MCP_SERVERS",
        help="MCP servers for the tool gateway to federate (YAML) [env: HELMLINE_MCP_SERVERS]",
        dir_okay=False,
        show_default=False,
    ),
]


def check_servers_file(path: Path) -> None:
    """Refuse an MCP servers file with problems, naming each by line and field."""
    from helmline.tool_gateway import load_servers
    from helmline.yamlfile import YamlFileError

    try:
        load_servers(path)
    except YamlFileError as error:
        raise CliError(str(error), exit_code=2) from error


def raw_output(
    session: SessionId,
    call: Annotated[str, typer.Argument(help="The call's id (`helmline show --json` has it).")],
    tenant: Tenant = DEFAULT_TENANT,
    data_dir: DataDir = None,
) -> None:
    """A call's output as the tool gave it, before output safety cut, redacted or neutralised
    it (the event's `raw_output`), as JSON. It is kept sealed: this needs the key the gateway
    sealed it with (the data folder's `sealing.key`, or HELMLINE_SEALING_KEY[_FILE])."""
    from helmline.cli._connection import connect
    from helmline.cli._intents import check_identifiers
    from helmline.cli._settings import load_settings
    from helmline.runtime import SEALING_KEY_FILE, SealingError, SealingKey, sealing_key
    from helmline.tool_gateway import RawOutputs, raw_output_name

    attempt(lambda: check_identifiers(tenant, session))
    settings = attempt(lambda: load_settings(data_dir=data_dir))

    def key() -> SealingKey:
        secret = settings.sealing_key.get_secret_value() if settings.sealing_key else None
        kept = settings.resolved_data_dir() / SEALING_KEY_FILE
        path = settings.sealing_key_file or (kept if kept.exists() else None)
        try:
            found = sealing_key(secret, path)
        except SealingError as error:
            raise CliError(str(error)) from error
        if found is None:
            raise CliError(
                f"no sealing key: {kept} does not exist; set HELMLINE_SEALING_KEY or "
                "HELMLINE_SEALING_KEY_FILE to the key the tool gateway seals outputs with"
            )
        return found

    sealing = attempt(key)
    url = nats_url(data_dir)
    name = raw_output_name(tenant, session, call)

    async def read() -> object:
        async with connect(url) as log:
            try:
                return await (await RawOutputs.open(log.js, sealing)).read(name)
            except SealingError as error:
                raise CliError(f"cannot open the raw output: {error}") from error

    raw = run_async(read())
    if raw is None:
        fail(
            CliError(
                f"no raw output of call {call} in session {session}: output safety left its "
                "output unchanged (the event has it whole), or its session is gone"
            )
        )
    typer.echo(json.dumps(raw, ensure_ascii=False, indent=2))


@app.callback()
def tools(ctx: typer.Context, as_json: Json = False, data_dir: DataDir = None) -> None:
    """List the tools sessions may call: each one's source, risk and argument schema.

    MCP tools are named `<server>__<tool>`; servers that are down are listed as unavailable.
    Each server's resources (read as context with its `<server>__read_resource` tool) and
    prompts are listed under it.
    """
    if ctx.invoked_subcommand is not None:
        return
    from helmline.cli._display import stdout

    url = nats_url(data_dir)
    registry, held = run_async(_registry_and_held(url))
    if registry is None:
        registry = ToolRegistryPublished(tools=tuple(BUILTIN_TOOLS_BY_NAME.values()))
    if as_json:
        typer.echo(registry.model_dump_json(indent=2))
        return
    from rich.table import Table

    table = Table("tool", "source", "risk", "arguments", "description", box=None)
    for tool in registry.tools:
        table.add_row(
            tool.name,
            tool.server,
            tool.risk,
            ", ".join(tool.parameters.get("properties", {})),
            tool.description.splitlines()[0] if tool.description else "",
        )
    console = stdout()
    console.print(table)
    for server in registry.servers:
        state = "available" if server.available else f"unavailable: {server.error}"
        console.print(
            f"server {server.server} ({server.transport}): {state}; {server.tools} tools; "
            f"circuit {server.circuit}; {server.health}",
            highlight=False,
        )
        # A server's own words: printed as they are, never read as markup.
        for resource in server.resources:
            console.print(
                f"  resource {resource.uri}: {resource.name}"
                + (f" ({resource.description})" if resource.description else ""),
                highlight=False,
                markup=False,
            )
        for prompt in server.prompts:
            arguments = ", ".join(
                argument.name + ("" if argument.required else "?") for argument in prompt.arguments
            )
            console.print(
                f"  prompt {prompt.name}({arguments})"
                + (f": {prompt.description}" if prompt.description else ""),
                highlight=False,
                markup=False,
            )
    for name in held:
        console.print(
            f"held: {name}: its server lists it otherwise than pinned; its calls are refused "
            f"until accepted (`helmline tools diff {name}`, `helmline tools accept {name}`)",
            highlight=False,
            markup=False,
        )


@app.command()
def diff(tool: ToolArg, as_json: Json = False, data_dir: DataDir = None) -> None:
    """How an MCP tool's definition, as its server lists it now, differs from the one pinned
    (first seen, or last accepted): the parts that changed, each as a unified diff. While it
    differs, the tool's calls are refused (`tool_changed`) until `helmline tools accept`."""
    from helmline.cli._connection import connect
    from helmline.runtime import Pin, definition_diff, read_pin

    async def read() -> Pin | None:
        async with connect(nats_url(data_dir)) as log:
            return await read_pin(log.js, tool)

    pin = run_async(read())
    if pin is None:
        fail(CliError(f"no definition of {tool} is pinned: no gateway has listed it"))
    if as_json:
        typer.echo(pin.change.model_dump_json(indent=2) if pin.change else "null")
    elif pin.change is None:
        typer.echo(f"{tool} is pinned at {pin.digest}: no change waits for acceptance")
    else:
        typer.echo(definition_diff(pin.change))


@app.command()
def accept(
    tool: ToolArg,
    reason: Annotated[str, typer.Option(help="Why, for the record.")] = "",
    data_dir: DataDir = None,
) -> None:
    """Accept the changed definition of an MCP tool (review it with `helmline tools diff`
    first): it is pinned in place of the one before (`tool.definition.accepted`, naming
    you), and the tool's calls run again."""
    from helmline.cli._connection import connect
    from helmline.cli._intents import SOURCE, current_actor
    from helmline.contracts import ToolDefinitionAccepted
    from helmline.runtime import DefinitionError, accept_definition

    by = attempt(current_actor)

    async def accepted() -> ToolDefinitionAccepted:
        async with connect(nats_url(data_dir)) as log:
            try:
                return await accept_definition(log.store, tool, by=by, source=SOURCE, reason=reason)
            except DefinitionError as error:
                raise CliError(str(error)) from error

    done = run_async(accepted())
    typer.echo(f"accepted {tool} at {done.digest} in place of {done.previous_digest} (by {by.id})")


async def _registry_and_held(url: str) -> tuple[ToolRegistryPublished | None, list[str]]:
    """The registry, and the names of its tools that their server lists otherwise than
    pinned (held until an operator accepts the change)."""
    from helmline.cli._connection import connect
    from helmline.runtime import latest_tool_registry, read_pins

    async with connect(url) as log:
        registry = await latest_tool_registry(log.js)
        pins = await read_pins(log.js)
    held = [
        tool.name
        for tool in (registry.tools if registry is not None else ())
        if tool.definition_digest is not None
        and tool.name in pins
        and pins[tool.name].holds(tool.definition_digest)
    ]
    return registry, held
