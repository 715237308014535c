"""What every command does around its work: find the running stack's NATS, run its async
work, and end with an exit status a shell can act on (a `CliError`'s, or 130 after Ctrl-C).

Imported by every command module, so it imports only Typer at load time; the NATS client
and the settings are loaded by the command that needs them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import typer

from helmline.cli._errors import INVALID_INPUT, CliError

INTERRUPTED = 130
"""Exit status after Ctrl-C, as a shell reports a command ended by SIGINT."""

T = TypeVar("T")


def nats_url(data_dir: Path | None) -> str:
    """The NATS of the stack the command talks to (HELMLINE_NATS_URL, else the data
    folder's running stack); fails the command when there is none."""
    from helmline.cli._connection import stack_nats_url
    from helmline.cli._settings import load_settings

    return attempt(lambda: stack_nats_url(load_settings(data_dir=data_dir)))


def attempt(work: Callable[[], T]) -> T:
    """`work()`'s result; a `CliError` it raises ends the command with its message."""
    try:
        return work()
    except CliError as error:
        fail(error)


def run_async(work: Coroutine[Any, Any, T], *, interrupted: str | None = None) -> T:
    """Run `work` to its end; a `CliError` or an event too large to append ends the command
    with its message, Ctrl-C with `interrupted` (if given) and status 130."""
    from helmline.runtime import EventTooLarge

    try:
        return asyncio.run(work)
    except CliError as error:
        fail(error)
    except EventTooLarge as error:
        fail(CliError(f"{error}: nothing was appended", exit_code=INVALID_INPUT))
    except KeyboardInterrupt:
        if interrupted:
            typer.echo(interrupted, err=True)
        raise typer.Exit(INTERRUPTED) from None


def fail(error: CliError) -> NoReturn:
    """End the command: the error's message on stderr, its exit status."""
    typer.echo(f"error: {error}", err=True)
    raise typer.Exit(error.exit_code)
