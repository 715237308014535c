"""Command-line options that several commands share."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

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
