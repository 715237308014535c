"""Running `helmline` commands from tests, against the servers the test started."""

from __future__ import annotations

import asyncio

from typer.testing import CliRunner, Result

from helmline.cli._app import app


async def invoke(nats_url: str, *args: str, database_url: str | None = None) -> Result:
    """Run one command in a thread, so the test's event loop keeps serving meanwhile."""
    environment = {"HELMLINE_NATS_URL": nats_url}
    if database_url is not None:
        environment["HELMLINE_DATABASE_URL"] = database_url
    return await asyncio.to_thread(CliRunner().invoke, app, list(args), env=environment)
