"""`helmline secrets`: the values tools may use by reference, never shown.

A secret belongs to a tenant. Its value is sealed with the stack's secrets key (the
embedded stack's is `secrets.key` in its data folder; or HELMLINE_SECRETS_KEY /
HELMLINE_SECRETS_KEY_FILE) and kept in the secrets bucket, with who set it and when. A tool's
argument `{"secret": "NAME"}` is resolved only where the call runs, and every service redacts
the value, as `[secret:NAME]`, from whatever it records.
"""

from __future__ import annotations

import getpass
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from helmline.cli._errors import INVALID_INPUT, CliError
from helmline.cli._options import DataDir, Json
from helmline.cli._running import fail, nats_url, run_async

if TYPE_CHECKING:
    from helmline.runtime import SealingKey, SecretRecord

app = typer.Typer(
    help="Secrets that tools use by reference; values are never shown.", no_args_is_help=True
)

SecretTenant = Annotated[
    str, typer.Option("--tenant", "-t", help="The tenant the secret belongs to.")
]
SecretName = Annotated[str, typer.Argument(help="The secret's name, as arguments refer to it.")]


@app.command("set")
def set_secret(
    name: SecretName,
    tenant: SecretTenant = "default",
    from_file: Annotated[
        Path | None,
        typer.Option(
            "--from-file",
            help="Read the value from this file (one final newline is dropped). Without it "
            "the value is read from standard input, or asked for, unechoed, at a terminal.",
            dir_okay=False,
        ),
    ] = None,
    data_dir: DataDir = None,
) -> None:
    """Set a secret (or replace its value). Tools refer to it as {"secret": "NAME"}; every
    service redacts its value from what it records within a second."""
    from helmline.runtime import SecretsError, SecretStore, check_name

    try:
        check_name(name)
    except SecretsError as error:
        fail(CliError(str(error), exit_code=INVALID_INPUT))
    value = _value(name, from_file)
    key = _key(data_dir)

    async def stored() -> SecretRecord:
        from helmline.cli._connection import connect
        from helmline.cli._intents import current_actor

        async with connect(nats_url(data_dir)) as log:
            store = await SecretStore.open(log.js, key)
            try:
                return await store.set(tenant, name, value, by=current_actor())
            except SecretsError as error:
                raise CliError(str(error), exit_code=INVALID_INPUT) from error

    record = run_async(stored())
    typer.echo(f"set secret {record.name} of tenant {record.tenant} (revision {record.revision})")


@app.command("list")
def list_secrets(
    tenant: Annotated[
        str | None, typer.Option("--tenant", "-t", help="Only this tenant's secrets.")
    ] = None,
    as_json: Json = False,
    data_dir: DataDir = None,
) -> None:
    """The secrets set now: tenant, name, when set and by whom. Never a value."""
    from helmline.runtime import SecretStore

    async def listed() -> list[SecretRecord]:
        from helmline.cli._connection import connect

        async with connect(nats_url(data_dir)) as log:
            return await (await SecretStore.open(log.js, None)).records(tenant)

    records = run_async(listed())
    if as_json:
        typer.echo(json.dumps([record.shown() for record in records], indent=2))
        return
    if not records:
        typer.echo("no secrets")
        return
    rows = [("TENANT", "NAME", "SET", "BY")]
    rows += [
        (r.tenant, r.name, r.at.astimezone().strftime("%Y-%m-%d %H:%M:%S"), r.by.id)
        for r in records
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        typer.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


@app.command("rm")
def remove_secret(
    name: SecretName, tenant: SecretTenant = "default", data_dir: DataDir = None
) -> None:
    """Remove a secret: calls that refer to it fail from now on, and its value is no longer
    redacted. The bucket keeps who removed it and when."""
    from helmline.runtime import SecretsError, SecretStore

    async def removed() -> SecretRecord:
        from helmline.cli._connection import connect
        from helmline.cli._intents import current_actor

        async with connect(nats_url(data_dir)) as log:
            store = await SecretStore.open(log.js, None)
            try:
                return await store.remove(tenant, name, by=current_actor())
            except SecretsError as error:
                raise CliError(str(error)) from error

    record = run_async(removed())
    typer.echo(f"removed secret {record.name} of tenant {record.tenant}")


@app.command("new-key")
def new_key() -> None:
    """Print a new secrets key (for HELMLINE_SECRETS_KEY, or the Kubernetes Secret the chart's
    secretsKey names); it is not stored anywhere. Secrets sealed with another key cannot be
    opened with it."""
    from helmline.runtime import SealingKey

    typer.echo(SealingKey.generate().text())


def _value(name: str, from_file: Path | None) -> str:
    if from_file is not None:
        try:
            text = from_file.read_text()
        except (OSError, UnicodeDecodeError) as error:
            fail(CliError(f"--from-file {from_file}: {error}", exit_code=INVALID_INPUT))
    elif sys.stdin.isatty():
        text = getpass.getpass(f"value of {name}: ")
    else:
        text = sys.stdin.read()
    return text.removesuffix("\n").removesuffix("\r")


def _key(data_dir: Path | None) -> SealingKey:
    from helmline.cli._settings import load_settings
    from helmline.runtime import SECRETS_KEY_FILE, SecretsKeyError, load_secrets_key

    settings = load_settings(data_dir=data_dir)
    key_file = settings.secrets_key_file or settings.resolved_data_dir() / SECRETS_KEY_FILE
    given = settings.secrets_key.get_secret_value() if settings.secrets_key else None
    if given is None and not key_file.is_file():
        fail(
            CliError(
                f"no secrets key: {key_file} does not exist (`helmline up` makes it) and "
                "HELMLINE_SECRETS_KEY is not set"
            )
        )
    try:
        key = load_secrets_key(given, key_file)
    except SecretsKeyError as error:
        fail(CliError(str(error)))
    assert key is not None
    return key
