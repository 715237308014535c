"""`helmline keys`: API keys for the HTTP API and the web console.

A key is shown once, when it is made; the stack keeps only its hash (helmline.api). The
embedded stack makes an admin key for development at `up` and keeps it in the data folder,
where `helmline console` finds it.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from helmline.cli._errors import CliError
from helmline.cli._options import DataDir, Json, lasting
from helmline.cli._running import fail, nats_url, run_async

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


EXPIRES_IN_HELP = (
    "How long the key works: 30d, 12h, 90m... (90d unless said); `never` for a key that "
    "does not expire."
)


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
    expires_in: Annotated[str, typer.Option(help=EXPIRES_IN_HELP)] = "90d",
    as_json: Json = False,
    data_dir: DataDir = None,
) -> None:
    """Make an API key and print it; it is not shown again (only its hash is kept).
    Making it is an event (`api.key.created`) on the keys stream."""
    from pydantic import ValidationError

    from helmline.api import new_api_key

    try:
        key, record = new_api_key(
            tenant,
            tuple(r.value for r in role),
            name=name,
            permissions=permission or (),
            expires_in=_expiry(expires_in),
        )
    except ValidationError as error:
        problems = "; ".join(f"{e['loc'][0]}: {e['msg']}" for e in error.errors())
        fail(CliError(f"invalid key: {problems}", exit_code=2))
    run_async(_store(nats_url(data_dir), record))
    _show_made(key, record, as_json)


@app.command("list")
def list_keys(
    tenant: Annotated[
        str | None, typer.Option("--tenant", "-t", help="Only this tenant's keys.")
    ] = None,
    as_json: Json = False,
    data_dir: DataDir = None,
) -> None:
    """Every API key, oldest first: id, tenant, roles, when made, when it expires, when last
    used (to the minute) and whether it is revoked. Never a secret."""
    from helmline.api import list_api_keys

    async def listed() -> list[ApiKeyRecord]:
        from helmline.cli._connection import connect

        async with connect(nats_url(data_dir)) as log:
            return await list_api_keys(log.js, tenant)

    records = run_async(listed())
    if as_json:
        typer.echo(json.dumps([r.shown().model_dump(mode="json") for r in records], indent=2))
        return
    if not records:
        typer.echo("no API keys")
        return
    now = datetime.now(UTC)
    rows = [("ID", "TENANT", "ROLES", "NAME", "CREATED", "EXPIRES", "LAST USED", "STATE")]
    for r in records:
        rows.append(
            (
                r.key_id,
                r.tenant,
                ",".join((*r.roles, *r.permissions)),
                r.name or "-",
                _when(r.created_at),
                _when(r.expires_at, "never"),
                _when(r.last_used_at, "never"),
                _state(r, now),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        typer.echo(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        )


@app.command()
def revoke(
    key_id: Annotated[str, typer.Argument(help="The key's id (`helmline keys list`).")],
    reason: Annotated[str, typer.Option(help="Why, for the record.")] = "",
    data_dir: DataDir = None,
) -> None:
    """Revoke a key for good (`api.key.revoked`): every API replica refuses it within a
    second."""
    from helmline.api import ApiKeyError, revoke_api_key
    from helmline.cli._intents import current_actor

    async def revoked() -> ApiKeyRecord:
        from helmline.cli._connection import connect

        async with connect(nats_url(data_dir)) as log:
            try:
                return await revoke_api_key(log.js, key_id, by=current_actor(), reason=reason)
            except ApiKeyError as error:
                raise CliError(str(error)) from error

    record = run_async(revoked())
    typer.echo(
        f"revoked {record.key_id} ({record.tenant}{', ' + record.name if record.name else ''})"
    )


@app.command()
def rotate(
    key_id: Annotated[str, typer.Argument(help="The key's id (`helmline keys list`).")],
    expires_in: Annotated[str, typer.Option(help=EXPIRES_IN_HELP)] = "90d",
    as_json: Json = False,
    data_dir: DataDir = None,
) -> None:
    """Give a key a new secret and print the new key once (`api.key.rotated`); the old
    secret is refused from now on. The key keeps its id, tenant and roles."""
    from helmline.api import ApiKeyError, rotate_api_key
    from helmline.cli._intents import current_actor

    expiry = _expiry(expires_in)

    async def rotated() -> tuple[str, ApiKeyRecord]:
        from helmline.cli._connection import connect

        async with connect(nats_url(data_dir)) as log:
            try:
                return await rotate_api_key(log.js, key_id, by=current_actor(), expires_in=expiry)
            except ApiKeyError as error:
                raise CliError(str(error)) from error

    key, record = run_async(rotated())
    _show_made(key, record, as_json)


def _expiry(written: str) -> timedelta | None:
    return None if written == "never" else lasting("--expires-in", written)


def _show_made(key: str, record: ApiKeyRecord, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps({"key": key, **record.shown().model_dump(mode="json")}))
    else:
        typer.echo(key)


def _when(at: datetime | None, otherwise: str = "-") -> str:
    return at.astimezone().strftime("%Y-%m-%d %H:%M") if at is not None else otherwise


def _state(record: ApiKeyRecord, now: datetime) -> str:
    if record.revoked_at is not None:
        return "revoked"
    if record.expires_at is not None and record.expires_at <= now:
        return "expired"
    return "active"


def ensure_dev_key(nats_url: str, data_dir: Path) -> str:
    """The data folder's admin key for tenant `default`, made (and stored) if it has none."""
    path = data_dir / DEV_KEY_FILE

    async def ensure() -> str:
        from helmline.api import find_api_key, new_api_key, split_api_key, store_api_key
        from helmline.cli._connection import connect
        from helmline.cli._intents import current_actor

        async with connect(nats_url) as log:
            kept = split_api_key(path.read_text().strip()) if path.is_file() else None
            found = await find_api_key(log.js, kept[0]) if kept is not None else None
            if (
                kept is not None
                and found is not None
                and found.refusal(kept[1], datetime.now(UTC)) is None
            ):
                return path.read_text().strip()
            # The development key lasts as long as the data folder; one revoked or expired
            # is replaced.
            key, record = new_api_key(DEV_TENANT, ("admin",), name="development", expires_in=None)
            await store_api_key(log.js, record, by=current_actor())
        # Created readable by the owner only, before anything is written to it.
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as file:
            file.write(key + "\n")
        return key

    return run_async(ensure())


def dev_key(data_dir: Path) -> str:
    """The key `up` made for this data folder."""
    path = data_dir / DEV_KEY_FILE
    if not path.is_file():
        raise CliError(f"no development API key in {data_dir}: `helmline up` makes one")
    return path.read_text().strip()


async def _store(url: str, record: ApiKeyRecord) -> None:
    from helmline.api import store_api_key
    from helmline.cli._connection import connect
    from helmline.cli._intents import current_actor

    async with connect(url) as log:
        await store_api_key(log.js, record, by=current_actor())
