"""`helmline dlq`: the messages consumers gave up on, with why; retry or discard them."""

from __future__ import annotations

import json
from collections.abc import Awaitable
from typing import Annotated, TypeVar

import typer

from helmline.cli._options import DataDir, Json
from helmline.cli._running import nats_url, run_async

T = TypeVar("T")

app = typer.Typer(help="Dead letters: list, show, retry or discard them.", no_args_is_help=True)

LetterSeq = Annotated[int, typer.Argument(min=1, help="The letter's number, as `list` shows.")]


@app.command("list")
def list_letters(
    consumer: Annotated[
        str | None, typer.Option(help="Only this consumer's letters (e.g. helmline-planner).")
    ] = None,
    as_json: Json = False,
    data_dir: DataDir = None,
) -> None:
    """Every parked letter, oldest first: number, consumer, event subject and reason."""
    from helmline.cli._connection import connect
    from helmline.runtime import DeadLetterBox, ParkedLetter

    url = nats_url(data_dir)

    async def read() -> list[ParkedLetter]:
        async with connect(url) as log:
            return await DeadLetterBox(log.nc, log.js).letters(consumer)

    parked = run_async(read())
    if as_json:
        typer.echo(json.dumps([{"seq": p.seq, **p.letter.model_dump(mode="json")} for p in parked]))
        return
    if not parked:
        typer.echo("no dead letters")
    for item in parked:
        letter = item.letter
        typer.echo(f"{item.seq}\t{letter.consumer}\t{letter.subject}\t{letter.reason}")


@app.command()
def show(seq: LetterSeq, data_dir: DataDir = None) -> None:
    """One letter as JSON: what was parked, where it came from, why, and when."""
    from helmline.cli._connection import connect
    from helmline.runtime import DeadLetterBox, ParkedLetter

    url = nats_url(data_dir)

    async def read() -> ParkedLetter:
        async with connect(url) as log:
            return await _runtime_errors(DeadLetterBox(log.nc, log.js).letter(seq))

    item = run_async(read())
    typer.echo(json.dumps({"seq": item.seq, **item.letter.model_dump(mode="json")}, indent=2))


@app.command()
def retry(seq: LetterSeq, as_json: Json = False, data_dir: DataDir = None) -> None:
    """Ask the consumer that gave up to handle the message again (with the code it runs now).

    On success the letter is removed; otherwise it stays, with the new reason printed."""
    from helmline.cli._connection import connect
    from helmline.runtime import DeadLetterBox, RetryOutcome

    url = nats_url(data_dir)

    async def again() -> RetryOutcome:
        async with connect(url) as log:
            return await _runtime_errors(DeadLetterBox(log.nc, log.js).retry(seq))

    outcome = run_async(again())
    if as_json:
        typer.echo(json.dumps({"seq": seq, "handled": outcome.ok, "reason": outcome.reason}))
    elif not outcome.ok:
        typer.echo(f"error: letter {seq} failed again: {outcome.reason}", err=True)
    else:
        typer.echo(f"letter {seq} handled and removed")
    if not outcome.ok:
        raise typer.Exit(1)


@app.command()
def discard(seq: LetterSeq, as_json: Json = False, data_dir: DataDir = None) -> None:
    """Remove a letter for good (the event itself stays in the log)."""
    from helmline.cli._connection import connect
    from helmline.runtime import DeadLetterBox

    url = nats_url(data_dir)

    async def remove() -> None:
        async with connect(url) as log:
            await _runtime_errors(DeadLetterBox(log.nc, log.js).discard(seq))

    run_async(remove())
    typer.echo(
        json.dumps({"seq": seq, "discarded": True}) if as_json else f"letter {seq} discarded"
    )


async def _runtime_errors(work: Awaitable[T]) -> T:
    from helmline.cli._errors import CliError
    from helmline.runtime import HelmlineRuntimeError

    try:
        return await work
    except HelmlineRuntimeError as error:
        raise CliError(str(error)) from error
