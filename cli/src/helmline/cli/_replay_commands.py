"""`helmline replay`: rebuild a session's state from the log and check the read model."""

from __future__ import annotations

from typing import Annotated

import typer

from helmline.cli._options import DataDir, Json, SessionId, Tenant
from helmline.cli._session_commands import DEFAULT_TENANT, _attempt, _nats_url, _run_async


def replay(
    session: SessionId,
    tenant: Tenant = DEFAULT_TENANT,
    to_seq: Annotated[
        int | None, typer.Option("--to-seq", min=1, help="Stop after this stream sequence.")
    ] = None,
    as_json: Json = False,
    data_dir: DataDir = None,
) -> None:
    """Fold the session's log and print the state; without --to-seq, also compare it with
    the read model and list every difference (exit 1 when there is one)."""
    from helmline.cli._connection import connect, stack_database_url
    from helmline.cli._display import stdout
    from helmline.cli._intents import check_identifiers
    from helmline.cli._session_view import render_session, state_json
    from helmline.cli._sessions import load_session
    from helmline.cli._settings import load_settings
    from helmline.runtime import SessionSnapshot
    from helmline.state import read_model_differences

    _attempt(lambda: check_identifiers(tenant, session))
    url = _nats_url(data_dir)
    database_url = stack_database_url(load_settings(data_dir=data_dir))

    async def rebuild() -> tuple[SessionSnapshot, list[str] | None]:
        async with connect(url) as log:
            snapshot = await load_session(log, tenant, session, up_to_seq=to_seq)
        if to_seq is not None or not database_url:
            return snapshot, None
        return snapshot, await read_model_differences(database_url, snapshot.state)

    snapshot, differences = _run_async(rebuild())
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
