"""The `helmline` Typer app: options in, settings built once, the work done elsewhere.

`helmline serve` runs a whole service inside this process, so the modules behind the
other commands (process management, rich, the schema exporter) are imported only by the
command that uses them, and a service does not carry them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from helmline.cli import _archive_commands as archive_commands
from helmline.cli import _dlq_commands as dlq_commands
from helmline.cli import _events_commands as events_commands
from helmline.cli import _key_commands as key_commands
from helmline.cli import _policy_commands as policy_commands
from helmline.cli import _projection_commands as projection_commands
from helmline.cli import _replay_commands as replay_commands
from helmline.cli import _rollback_commands as rollback_commands
from helmline.cli import _secret_commands as secret_commands
from helmline.cli import _session_commands as session_commands
from helmline.cli import _tool_commands as tool_commands
from helmline.cli import _workspace_commands as workspace_commands
from helmline.cli._catalogue import ServiceName
from helmline.cli._errors import CliError
from helmline.cli._options import DataDir
from helmline.cli._running import fail

if TYPE_CHECKING:
    from helmline.cli._settings import CliSettings

app = typer.Typer(
    name="helmline",
    help="Helmline: an event-sourced control plane for tool-using AI agents.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    # Help is read as Markdown: a docstring's paragraphs reflow to the terminal (Rich markup
    # keeps the source's line breaks) and "[env: ...]" stays text (Rich takes it for a tag).
    rich_markup_mode="markdown",
)
schema_app = typer.Typer(help="The event contracts' JSON Schemas.", no_args_is_help=True)
app.add_typer(schema_app, name="schema")
app.add_typer(dlq_commands.app, name="dlq")
app.add_typer(key_commands.app, name="keys")
app.add_typer(secret_commands.app, name="secrets")
app.add_typer(projection_commands.app, name="projections")
policy_app = typer.Typer(
    help="The approval policy: check a file, explain a decision.", no_args_is_help=True
)


# Exit status of `status` when the data folder has no stack (systemctl's "inactive").
NOT_RUNNING = 3


@app.command()
def up(
    data_dir: DataDir = None,
    api_port: Annotated[
        int | None, typer.Option(min=1, max=65535, help="[env: HELMLINE_API_PORT; default: free]")
    ] = None,
    nats_port: Annotated[
        int | None, typer.Option(min=1, max=65535, help="[env: HELMLINE_NATS_PORT; default: free]")
    ] = None,
    pg_port: Annotated[
        int | None, typer.Option(min=1, max=65535, help="[env: HELMLINE_PG_PORT; default: free]")
    ] = None,
    no_sample: Annotated[
        bool,
        typer.Option(
            "--no-sample", help="Do not start the sample session (examples/playbooks/hello.yaml)."
        ),
    ] = False,
    # A plain string that the settings check: the runtime's `Durability` type would import
    # the NATS client into every command.
    durability: Annotated[
        str | None,
        typer.Option(
            metavar="durable|relaxed",
            help="durable: every event is on disk before it is acknowledged; relaxed: faster, "
            "but a power loss, kernel crash or VM reset loses up to ~2 min of acknowledged "
            "events (throwaway work only). [env: HELMLINE_DURABILITY; default: durable]",
            show_default=False,
        ),
    ] = None,
    policy: policy_commands.PolicyFile = None,
    mcp_servers: tool_commands.McpServersFile = None,
    replicas: Annotated[
        int | None,
        typer.Option(
            min=1, max=8, help="Processes of every service. [env: HELMLINE_REPLICAS; default: 1]"
        ),
    ] = None,
    nats_cluster: Annotated[
        int | None,
        typer.Option(
            min=1,
            max=5,
            help="Embedded nats-servers in one JetStream cluster, streams at R3 from 3 on. "
            "[env: HELMLINE_NATS_CLUSTER; default: 1]",
        ),
    ] = None,
) -> None:
    """Start NATS, PostgreSQL and every service in the background, and wait until all are ready.

    A supervisor owns the service processes: one that exits is started again on the same
    ports (back-off from 0.25 s to 30 s while it keeps dying); `status` shows restarts and
    last exit codes. On a running stack, `up` starts again only what has stopped, on the
    ports it had, and refuses options that differ from how the stack runs.

    With HELMLINE_NATS_URL or HELMLINE_DATABASE_URL set, those servers are used instead of
    starting embedded ones. A newly started stack gets one sample session, which stops at
    an approval (unless --no-sample). With --policy (or HELMLINE_POLICY), the approval
    service decides by that policy file, checked before anything starts, and reloads it
    whenever it changes. With --mcp-servers (or HELMLINE_MCP_SERVERS), the tool gateway
    federates the MCP servers that file names (checked before anything starts).
    """
    from helmline.cli._display import StartupProgress, render_status, stderr, stdout
    from helmline.cli._settings import load_settings
    from helmline.cli._stack import up as start_stack

    environ = dict(os.environ)
    try:
        settings = load_settings(
            data_dir=data_dir,
            api_port=api_port,
            nats_port=nats_port,
            pg_port=pg_port,
            durability=durability,
            replicas=replicas,
            nats_cluster=nats_cluster,
        )
        if policy is not None:
            policy_commands.load_policy_file(policy)
            # Services run in the data folder, so a relative path would not reach the file.
            environ["HELMLINE_POLICY"] = str(policy.resolve())
        if mcp_servers is not None:
            tool_commands.check_servers_file(mcp_servers)
            environ["HELMLINE_MCP_SERVERS"] = str(mcp_servers.resolve())
        with StartupProgress(stderr()) as progress:
            result = start_stack(settings, environ, progress)
    except CliError as error:
        fail(error)
    if result.already_running:
        stdout().print(f"A stack is already running from {result.status.data_dir}.")
        render_status(stdout(), result.status, title="helmline (already running)")
        running = result.status.record.durability if result.status.record else None
        if running is not None and running != settings.durability:
            stderr().print(
                f"[yellow]it runs {running}, not {settings.durability}:[/] "
                "`helmline down`, then `helmline up` again to change that"
            )
        return
    render_status(stdout(), result.status, title=f"helmline is up ({result.seconds:.1f} s)")
    record = result.status.record
    if record is not None and record.api_url is not None:
        _show_console(record.nats_url, record.api_url, settings)
    if not no_sample and result.status.record is not None:
        _start_sample(result.status.record.nats_url, data_dir)


def _show_console(nats_url: str, api_url: str, settings: CliSettings) -> None:
    from helmline.cli._display import stdout
    from helmline.cli._key_commands import DEV_KEY_FILE, DEV_TENANT, ensure_dev_key

    data_dir = settings.resolved_data_dir()
    key = ensure_dev_key(nats_url, data_dir)
    stdout().print(
        f"\nWeb console: {api_url}/#key={key}\n"
        f"API key (admin of tenant {DEV_TENANT!r}, kept in {data_dir / DEV_KEY_FILE}):\n  {key}",
        highlight=False,
        soft_wrap=True,
    )


@app.command()
def console(data_dir: DataDir = None) -> None:
    """The web console's address, signed in with the data folder's development key."""
    from helmline.cli._key_commands import dev_key
    from helmline.cli._record import read_record
    from helmline.cli._settings import load_settings

    folder = load_settings(data_dir=data_dir).resolved_data_dir()
    record = read_record(folder)
    if record is None:
        fail(CliError(f"no stack is running from {folder}: start one with `helmline up`"))
    if record.api_url is None:
        fail(CliError(f"the stack in {folder} serves no API"))
    try:
        typer.echo(f"{record.api_url}/#key={dev_key(folder)}")
    except CliError as error:
        fail(error)


def _start_sample(nats_url: str, data_dir: Path | None) -> None:
    from helmline.cli._display import stderr, stdout
    from helmline.cli._sample import sample_playbook, start_sample

    playbook = sample_playbook()
    if playbook is None:
        stderr().print("[dim]no examples/playbooks/hello.yaml here: no sample session[/]")
        return
    try:
        session_id = start_sample(nats_url, playbook)
    except CliError as error:
        # The stack is up and usable; only the sample is missing.
        stderr().print(f"[yellow]the sample session was not started:[/] {error}")
        return
    if session_id is None:
        return  # Not the data folder's first stack: its sessions are there to look at.
    where = f" --data-dir {data_dir}" if data_dir is not None else ""
    stdout().print(
        f"\nSample session [bold]{session_id}[/] from {playbook.name} will stop at an approval.\n"
        f"  watch it:    helmline show {session_id}{where}\n"
        f"  approve it:  helmline approve {session_id}{where}",
        highlight=False,
    )


@app.command()
def down(data_dir: DataDir = None) -> None:
    """Stop every process the data folder's stack started."""
    from helmline.cli._display import stdout
    from helmline.cli._settings import load_settings
    from helmline.cli._stack import down as stop_stack

    settings = load_settings(data_dir=data_dir)
    try:
        record = stop_stack(settings)
    except CliError as error:
        fail(error)
    if record is None:
        stdout().print(f"Nothing is running from {settings.resolved_data_dir()}.")
    else:
        stopped = sum(1 for c in record.components if c.process is not None)
        stdout().print(f"Stopped {stopped} processes of the stack in {record.data_dir}.")


@app.command()
def status(
    data_dir: DataDir = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Each component's state: healthy, unhealthy or stopped.

    Exits 1 when anything is unhealthy or stopped, 3 when no stack is running.
    """
    from helmline.cli._display import render_status, status_json, stdout
    from helmline.cli._settings import load_settings
    from helmline.cli._stack import stack_status

    settings = load_settings(data_dir=data_dir)
    try:
        current = stack_status(settings)
    except CliError as error:
        fail(error)
    if as_json:
        typer.echo(status_json(current))
    elif not current.running:
        stdout().print(f"Nothing is running from {current.data_dir}.")
    else:
        render_status(stdout(), current, title="helmline")
    if not current.running:
        raise typer.Exit(NOT_RUNNING)
    if not current.healthy:
        raise typer.Exit(1)


@app.command(hidden=True)
def supervise() -> None:
    """Run the supervisor of a stack (started by `up`, which hands it the plan on stdin)."""
    from helmline.cli._supervisor import main as run_supervisor

    raise typer.Exit(run_supervisor())


@app.command()
def serve(service: Annotated[ServiceName, typer.Argument(help="The service to run.")]) -> None:
    """Run one service in the foreground (what `up` starts, and what a container runs)."""
    from helmline.cli._serve import serve as run_service

    try:
        code = run_service(service)
    except CliError as error:
        fail(error)
    raise typer.Exit(code)


@app.command()
def provision(
    nats_url: Annotated[
        str, typer.Option(envvar="HELMLINE_NATS_URL", help="NATS with JetStream, as an admin.")
    ] = "nats://127.0.0.1:4222",
    replicas: Annotated[
        int,
        typer.Option(
            envvar="HELMLINE_STREAM_REPLICAS",
            min=1,
            max=5,
            help="Servers each stream and bucket is kept on (3 on a production cluster).",
        ),
    ] = 1,
    monitor_urls: Annotated[
        str,
        typer.Option(
            envvar="HELMLINE_NATS_MONITOR_URLS",
            help="Monitoring endpoints (http://host:8222) of every NATS server, comma "
            "separated: each server's fsync policy is checked there.",
        ),
    ] = "",
    accept_relaxed_fsync: Annotated[
        bool,
        typer.Option(
            envvar="HELMLINE_ACCEPT_RELAXED_FSYNC",
            help="Go on though a server acknowledges appends before it fsyncs them.",
        ),
    ] = False,
    accept_single_replica: Annotated[
        bool,
        typer.Option(
            envvar="HELMLINE_ACCEPT_SINGLE_REPLICA",
            help="Go on though streams of one replica live on a NATS cluster.",
        ),
    ] = False,
) -> None:
    """Create or update the streams, buckets and object stores the contracts define
    (the Helm chart's job runs this at every install and upgrade), then check that the
    servers keep an acknowledged event safe: streams of one replica on a cluster, and
    servers that acknowledge before they fsync (where their monitoring endpoints are given),
    are refused unless accepted by name (exit 1). docs/durability.md says why."""
    import asyncio

    from helmline.runtime import DurabilityRefused
    from helmline.runtime import provision as provision_topology

    try:
        findings = asyncio.run(
            provision_topology(
                nats_url,
                replicas=replicas,
                monitor_urls=[url.strip() for url in monitor_urls.split(",") if url.strip()],
                accept_relaxed=accept_relaxed_fsync,
                accept_single_replica=accept_single_replica,
            )
        )
    except DurabilityRefused as error:
        fail(CliError(f"refused: {error}"))
    except Exception as error:  # Whatever it was, the person needs the reason, not a trace.
        fail(CliError(f"could not provision JetStream: {error!r}"))
    typer.echo(f"Streams, buckets and object stores are provisioned ({replicas} replicas).")
    if findings.lazy_fsync_servers:
        typer.echo(
            f"warning (accepted): servers that acknowledge before fsync: "
            f"{', '.join(findings.lazy_fsync_servers)}",
            err=True,
        )
    if findings.single_replica_on_cluster:
        typer.echo(
            f"warning (accepted): streams of one replica on a cluster: "
            f"{', '.join(findings.single_replica_on_cluster)}",
            err=True,
        )
    if findings.unchecked:
        typer.echo(f"note: {findings.unchecked} (HELMLINE_NATS_MONITOR_URLS)", err=True)


@schema_app.command("export")
def schema_export(
    out: Annotated[
        Path | None,
        typer.Option(
            help="Folder to write to [default: libs/contracts/schema]", show_default=False
        ),
    ] = None,
) -> None:
    """Write every event's JSON Schema, removing stale schema files there (and, in a source
    checkout, the Helm chart's per-service NATS permissions)."""
    from helmline.cli._display import stdout
    from helmline.cli._schema import default_schema_dir, export_chart_permissions, export_schemas

    try:
        target = out if out is not None else default_schema_dir()
        count = export_schemas(target)
        chart = export_chart_permissions(target) if out is None else None
    except CliError as error:
        fail(error)
    stdout().print(f"Wrote {count} schemas to {target}.")
    if chart is not None:
        stdout().print(f"Wrote the services' NATS permissions to {chart}.")


# The session commands live in their own module; registered here, after the stack's commands,
# so `helmline --help` lists them in that order.
app.command()(session_commands.run)
app.command()(session_commands.sessions)
app.command()(session_commands.show)
app.add_typer(events_commands.app, name="events")
app.command()(session_commands.approvals)
app.command()(session_commands.approve)
app.command()(session_commands.deny)
app.command()(session_commands.pause)
app.command()(session_commands.resume)
app.command()(session_commands.cancel)
app.command()(rollback_commands.checkpoints)
app.command()(rollback_commands.rollback)
app.command()(rollback_commands.fork)
app.add_typer(policy_app, name="policy")
policy_app.command("check")(policy_commands.check)
policy_app.command("explain")(policy_commands.explain)
app.command()(archive_commands.export)
app.command("import")(archive_commands.import_)
app.command()(replay_commands.replay)
app.add_typer(workspace_commands.app, name="workspace")
app.add_typer(tool_commands.app, name="tools")
app.command("raw-output")(tool_commands.raw_output)
