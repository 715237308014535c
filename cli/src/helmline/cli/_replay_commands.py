"""`helmline replay`: rebuild a session's state from the log and check the read model, or
re-run a goal session in a shadow session and report where the planner now differs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from helmline.cli._errors import CliError
from helmline.cli._options import DEFAULT_TENANT, DataDir, Json, SessionId, Tenant
from helmline.cli._running import attempt, nats_url, run_async


def replay(
    session: SessionId,
    tenant: Tenant = DEFAULT_TENANT,
    to_seq: Annotated[
        int | None, typer.Option("--to-seq", min=1, help="Stop after this stream sequence.")
    ] = None,
    shadow: Annotated[
        bool,
        typer.Option(
            "--shadow",
            help="Re-run a goal session through today's planner in a new shadow session: model "
            "calls answered from the recording, tool calls from recorded results, nothing run "
            "or appended; report the first divergence (exit 1 when there is one).",
        ),
    ] = False,
    as_json: Json = False,
    data_dir: DataDir = None,
) -> None:
    """Fold the session's log and print the state; without --to-seq, also compare it with
    the read model and list every difference (exit 1 when there is one)."""
    if shadow:
        _shadow(session, tenant, as_json=as_json, data_dir=data_dir)
        return
    from helmline.cli._connection import connect, stack_database_url
    from helmline.cli._display import stdout
    from helmline.cli._intents import check_identifiers
    from helmline.cli._session_view import render_session, state_json
    from helmline.cli._sessions import load_session
    from helmline.cli._settings import load_settings
    from helmline.runtime import SessionSnapshot
    from helmline.state import read_model_differences

    attempt(lambda: check_identifiers(tenant, session))
    url = nats_url(data_dir)
    database_url = stack_database_url(load_settings(data_dir=data_dir))

    async def rebuild() -> tuple[SessionSnapshot, list[str] | None]:
        async with connect(url) as log:
            snapshot = await load_session(log, tenant, session, up_to_seq=to_seq)
        if to_seq is not None or not database_url:
            return snapshot, None
        return snapshot, await read_model_differences(database_url, snapshot.state)

    snapshot, differences = run_async(rebuild())
    if as_json:
        typer.echo(state_json(snapshot.state))
    else:
        render_session(stdout(), snapshot.state)
    if differences is None:
        typer.echo("not compared with a read model (none configured, or --to-seq given)", err=True)
        return
    for difference in differences:
        typer.echo(f"difference: {difference}", err=True)
    if differences:
        raise typer.Exit(1)
    typer.echo(f"the read model agrees with the log (up to sequence {snapshot.last_seq})", err=True)


def _shadow(session: str, tenant: str, *, as_json: bool, data_dir: Path | None) -> None:
    from helmline.cli._connection import connect
    from helmline.cli._intents import check_identifiers
    from helmline.cli._tool_registry import known_tools
    from helmline.contracts import Event, SessionStarted
    from helmline.planner import PlannerSettings, ShadowReport, shadow_replay

    attempt(lambda: check_identifiers(tenant, session))
    url = nats_url(data_dir)
    registry = tuple(known_tools(data_dir).values())

    async def rerun() -> ShadowReport:
        async with connect(url) as log:
            stored = await log.store.read_all(tenant, session)
        recording: list[Event] = [item.event for item in stored]
        if not recording:
            raise CliError(f"no session {session} in tenant {tenant!r}")
        started = recording[0].data
        if not isinstance(started, SessionStarted) or started.mode == "playbook":
            raise CliError(
                f"session {session} ran a playbook; only goal sessions have a model to replay",
                exit_code=2,
            )
        return await shadow_replay(recording, PlannerSettings(), registry)

    report = run_async(rerun())
    if as_json:
        typer.echo(json.dumps(report.as_dict(), indent=2))
    else:
        typer.echo(
            f"shadow session {report.shadow_session_id} of {report.session_id}: "
            f"{report.model_calls} model calls and {report.steps} steps answered from the "
            f"recording, {report.side_effects} side effects; recorded {report.recorded_status}, "
            f"shadow {report.shadow_status}"
        )
        for divergence in report.divergences:
            step = f" (step {divergence.step})" if divergence.step else ""
            typer.echo(f"first divergence at {divergence.where}{step}:")
            typer.echo(f"  recorded: {divergence.recorded}")
            typer.echo(f"  now:      {divergence.shadow}")
        if not report.divergences:
            typer.echo("no divergence: the planner behaves as recorded")
    if report.divergences:
        raise typer.Exit(1)
