"""Command-line options that several commands share, and how their values are read."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Annotated

import typer

from helmline.cli._errors import INVALID_INPUT, CliError
from helmline.cli._running import fail

DEFAULT_TENANT = "default"
"""The tenant a command acts for when `--tenant` is not given."""

DataDir = Annotated[
    Path | None,
    typer.Option(
        "--data-dir",
        help="The stack's data folder [env: HELMLINE_DATA_DIR; default: .helmline]",
        file_okay=False,
        show_default=False,
    ),
]

Tenant = Annotated[str, typer.Option("--tenant", "-t", help="The tenant the session belongs to.")]

SessionId = Annotated[str, typer.Argument(help="The session id (as `helmline run` printed it).")]

Json = Annotated[bool, typer.Option("--json", help="Print JSON.")]


def lasting(option: str, written: str) -> timedelta:
    """A positive duration given to `option` (`90s`, `15m`, `1h`...); else the command fails
    naming the option."""
    from helmline.approval import parse_duration

    try:
        duration = parse_duration(written)
    except ValueError as error:
        fail(CliError(f"{option}: {error}", exit_code=INVALID_INPUT))
    if duration <= timedelta(0):
        fail(CliError(f"{option} must be longer than zero", exit_code=INVALID_INPUT))
    return duration
