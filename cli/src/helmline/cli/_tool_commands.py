"""`helmline tools`: the federated tool registry, as the running stack's gateway published it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from helmline.cli._errors import CliError
from helmline.cli._options import DEFAULT_TENANT, DataDir, Json, SessionId, Tenant
from helmline.cli._running import attempt, fail, nats_url, run_async
from helmline.cli._tool_registry import published_registry
from helmline.contracts import BUILTIN_TOOLS_BY_NAME, ToolRegistryPublished

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


def tools(as_json: Json = False, data_dir: DataDir = None) -> None:
    """List the tools sessions may call: each one's source, risk and argument schema.

    MCP tools are named `<server>__<tool>`; servers that are down are listed as unavailable.
    """
    from helmline.cli._display import stdout

    url = nats_url(data_dir)
    registry = run_async(published_registry(url))
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
