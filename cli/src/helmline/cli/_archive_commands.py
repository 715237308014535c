"""`helmline export` and `helmline import`: sessions as NDJSON CloudEvents, for archives,
investigations and moving sessions between clusters."""

from __future__ import annotations

import dataclasses
import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer

from helmline.cli._errors import CliError
from helmline.cli._options import DEFAULT_TENANT, DataDir, Json, Tenant
from helmline.cli._running import attempt, fail, nats_url, run_async


def export(
    session: Annotated[
        str | None, typer.Argument(help="The session to export; omit with --all.")
    ] = None,
    tenant: Tenant = DEFAULT_TENANT,
    every_session: Annotated[
        bool, typer.Option("--all", help="Every session of the tenant.")
    ] = False,
    since: Annotated[
        datetime | None,
        typer.Option(help="With --all: only sessions started since then (ISO 8601)."),
    ] = None,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write here instead of stdout.")
    ] = None,
    data_dir: DataDir = None,
) -> None:
    """Write sessions' events as NDJSON CloudEvents, one event per line, oldest first."""
    from helmline.cli._archive import export_session, export_tenant
    from helmline.cli._connection import connect
    from helmline.cli._intents import check_identifiers

    attempt(lambda: _one_selection(session, every_session))
    if since is not None and since.tzinfo is None:
        since = since.replace(tzinfo=UTC)  # A time without a zone is read as UTC.
    attempt(lambda: check_identifiers(tenant, session or "any"))
    url = nats_url(data_dir)

    async def write() -> int:
        out = output.open("w") if output else sys.stdout
        try:
            async with connect(url) as log:
                if session is not None:
                    return await export_session(log, tenant, session, out)
                return await export_tenant(log, tenant, out, since)
        finally:
            if output:
                out.close()

    count = run_async(write())
    typer.echo(f"exported {count} events", err=True)


IMPORT_MAX_BYTES = 256 * 1024 * 1024
"""The largest export `helmline import` reads unless told otherwise (`--max-bytes`): it holds
every event in memory before appending any."""


def import_(
    file: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="An export.")],
    max_bytes: Annotated[
        int,
        typer.Option("--max-bytes", min=1, help="The largest export read (256 MiB)."),
    ] = IMPORT_MAX_BYTES,
    as_json: Json = False,
    data_dir: DataDir = None,
) -> None:
    """Append an export's events to the log; events already there are skipped, so importing
    twice stores everything once. A bad line, a line longer than any event (2 MiB) or an
    export past --max-bytes stops the import (exit 2) before anything is written."""
    from helmline.cli._archive import ImportResult, import_events, read_export
    from helmline.cli._connection import connect

    with file.open("rb") as export:
        events = attempt(lambda: read_export(export, str(file), max_bytes=max_bytes))
    url = nats_url(data_dir)

    async def append() -> ImportResult:
        async with connect(url) as log:
            return await import_events(log, events)

    result = run_async(append())
    if as_json:
        typer.echo(json.dumps(dataclasses.asdict(result)))
    else:
        typer.echo(
            f"imported {result.appended} events of {result.sessions} sessions "
            f"({result.already_present} were already there)"
        )
    if result.not_stored:
        ids = ", ".join(result.not_stored[:3]) + (", ..." if len(result.not_stored) > 3 else "")
        fail(
            CliError(
                f"{len(result.not_stored)} events were not stored: the log holds events with "
                f"their ids in other sessions ({ids}); ids are unique across the log, so to "
                "copy a session fork it, or import it into another cluster"
            )
        )


def _one_selection(session: str | None, every_session: bool) -> None:
    if (session is None) != every_session:
        raise CliError("name one SESSION, or give --all (not both)")
