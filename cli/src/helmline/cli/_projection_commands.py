"""`helmline projections`: rebuild the PostgreSQL read model from the log."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from helmline.cli._options import DataDir, Json
from helmline.cli._running import fail, nats_url, run_async

app = typer.Typer(
    help="The read model's projections: rebuild them from the log.", no_args_is_help=True
)


@app.command()
def rebuild(
    name: Annotated[
        str | None, typer.Option("--name", help="Only this projection (today: sessions).")
    ] = None,
    as_json: Json = False,
    data_dir: DataDir = None,
) -> None:
    """Build the read model again from the whole log, aside, then switch to it at once.

    The old tables keep answering queries (and the state service keeps writing them) until
    the switch; the new ones take the same names and grants. Progress goes to stderr.
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    from helmline.cli._connection import connect, stack_database_url
    from helmline.cli._display import stderr
    from helmline.cli._errors import CliError
    from helmline.cli._settings import load_settings
    from helmline.state import PROJECTIONS, RebuildError, RebuildReport, rebuild_read_model

    if name is not None and name not in PROJECTIONS:
        fail(CliError(f"no projection named {name!r}; known: {', '.join(PROJECTIONS)}"))
    url = nats_url(data_dir)
    database_url = stack_database_url(load_settings(data_dir=data_dir))
    if not database_url:
        fail(
            CliError(
                "no read model database: set HELMLINE_DATABASE_URL"
                " or start a stack with `helmline up`"
            )
        )

    async def run(bar: Progress) -> RebuildReport:
        task = bar.add_task("folding the log", total=None)

        def advance(done: int, end: int) -> None:
            bar.update(task, completed=done, total=end)

        async with connect(url) as log:
            try:
                return await rebuild_read_model(log.store, database_url, progress=advance)
            except RebuildError as error:
                raise CliError(str(error)) from error

    columns = (
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=stderr(), transient=True) as bar:
        report = run_async(run(bar))
    if as_json:
        typer.echo(
            json.dumps(
                {
                    "projection": "sessions",
                    "events": report.events,
                    "sessions": report.sessions,
                    "last_seq": report.last_seq,
                    "seconds": round(report.seconds, 3),
                    "events_per_s": round(report.events_per_s),
                }
            )
        )
        return
    typer.echo(
        f"rebuilt the sessions projection: {report.events} events of {report.sessions} "
        f"sessions in {report.seconds:.1f} s ({report.events_per_s:,.0f} events/s), "
        f"up to sequence {report.last_seq}; switched"
    )
