"""`helmline keys`: API keys for the HTTP API and the web console.

A key is shown once, when it is made; the stack keeps only its hash (helmline.api). The
embedded stack makes an admin key for development at `up` and keeps it in the data folder,
where `helmline console` finds it.
"""

from __future__ import annotations

import json
import os
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from helmline.cli._errors import CliError
from helmline.cli._options import DataDir, Json
from helmline.cli._session_commands import _fail, _nats_url, _run_async

if TYPE_CHECKING:
    from helmline.api import ApiKeyRecord

DEV_KEY_FILE = "api-key"
"""The development admin key, in the data folder (readable by its owner only)."""
DEV_TENANT = "default"

app = typer.Typer(help="API keys for the HTTP API and the web console.", no_args_is_help=True)


class RoleName(StrEnum):
    VIEWER = "viewer"
    OPERATOR = "operator"
    APPROVER = "approver"
    ADMIN = "admin"


@app.command()
def create(
    tenant: Annotated[str, typer.Option("--tenant", "-t", help="The tenant the key acts in.")],
    role: Annotated[list[RoleName], typer.Option("--role", "-r", help="Repeat for several.")],
    name: Annotated[str, typer.Option(help="Who or what holds it, for the record.")] = "",
    permission: Annotated[
        list[str] | None,
        typer.Option(
            "--permission",
            "-p",
            help="A permission a tool may require (required_permission in the MCP servers "
            "file), held by the sessions the key starts. Repeat for several.",
        ),
    ] = None,
    as_json: Json = False,
    data_dir: DataDir = None,
) -> None:
    """Make an API key and print it; it is not shown again (only its hash is kept)."""
    from pydantic import ValidationError

    from helmline.api import new_api_key

    try:
        key, record = new_api_key(
            tenant, tuple(r.value for r in role), name=name, permissions=permission or ()
        )
    except ValidationError as error:
        problems = "; ".join(f"{e['loc'][0]}: {e['msg']}" for e in error.errors())
        _fail(CliError(f"invalid key: {problems}", exit_code=2))
    _run_async(_store(_nats_url(data_dir), record))
    if as_json:
        shown = record.model_dump(mode="json", exclude={"secret_sha256"})
        typer.echo(json.dumps({"key": key, **shown}))
    else:
        typer.echo(key)


def ensure_dev_key(nats_url: str, data_dir: Path) -> str:
    """The data folder's admin key for tenant `default`, made (and stored) if it has none."""
    path = data_dir / DEV_KEY_FILE

    async def ensure() -> str:
        from helmline.api import find_api_key, new_api_key, split_api_key, store_api_key
        from helmline.cli._connection import connect

        async with connect(nats_url) as log:
            kept = split_api_key(path.read_text().strip()) if path.is_file() else None
            if kept is not None and await find_api_key(log.js, kept[0]) is not None:
                return path.read_text().strip()
            key, record = new_api_key(DEV_TENANT, ("admin",), name="development")
            await store_api_key(log.js, record)
        # Created readable by the owner only, before anything is written to it.
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as file:
            file.write(key + "\n")
        return key

    return _run_async(ensure())


def dev_key(data_dir: Path) -> str:
    """The key `up` made for this data folder."""
    path = data_dir / DEV_KEY_FILE
    if not path.is_file():
        raise CliError(f"no development API key in {data_dir}: `helmline up` makes one")
    return path.read_text().strip()


async def _store(url: str, record: ApiKeyRecord) -> None:
    from helmline.api import store_api_key
    from helmline.cli._connection import connect

    async with connect(url) as log:
        await store_api_key(log.js, record)
