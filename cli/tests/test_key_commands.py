"""`helmline keys` against a real JetStream: each change is in the bucket and an event on
the keys stream, and nothing printed after a key is made shows its secret."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta

from nats.js import JetStreamContext
from typer.testing import CliRunner, Result

from helmline.api import find_api_key, split_api_key
from helmline.cli import app


async def helmline(nats_url: str, *args: str) -> Result:
    """Run a command in a worker thread: it runs its own event loop, as from a terminal."""
    return await asyncio.to_thread(
        CliRunner().invoke, app, list(args), env={"HELMLINE_NATS_URL": nats_url}
    )


async def make(nats_url: str, tenant: str, *options: str) -> tuple[str, str]:
    made = await helmline(
        nats_url, "keys", "create", "-t", tenant, "-r", "viewer", "--json", *options
    )
    assert made.exit_code == 0, made.output
    shown = json.loads(made.stdout)
    return shown["key"], shown["key_id"]


async def test_keys_expire_in_90_days_unless_told_and_list_never_shows_a_secret(
    nats_url: str, js: JetStreamContext, tenant: str
) -> None:
    key, key_id = await make(nats_url, tenant, "--name", "ci")
    _, short = await make(nats_url, tenant, "--expires-in", "30d")
    _, forever = await make(nats_url, tenant, "--expires-in", "never")

    async def lasts(made: str) -> timedelta | None:
        record = await find_api_key(js, made)
        assert record is not None
        return record.expires_at - record.created_at if record.expires_at else None

    assert await lasts(key_id) == timedelta(days=90)
    assert await lasts(short) == timedelta(days=30)
    assert await lasts(forever) is None

    listed = await helmline(nats_url, "keys", "list", "-t", tenant, "--json")
    assert listed.exit_code == 0, listed.output
    assert [k["key_id"] for k in json.loads(listed.stdout)] == [key_id, short, forever]
    table = await helmline(nats_url, "keys", "list", "-t", tenant)
    assert key_id in table.stdout
    assert "active" in table.stdout
    parts = split_api_key(key)
    assert parts is not None
    assert parts[1] not in listed.stdout + table.stdout
    assert "secret_sha256" not in listed.stdout

    wrong = await helmline(
        nats_url, "keys", "create", "-t", tenant, "-r", "viewer", "--expires-in", "soon"
    )
    assert wrong.exit_code == 2
    assert "--expires-in" in wrong.output


async def test_rotate_prints_a_new_secret_once_and_revoke_is_for_good(
    nats_url: str, js: JetStreamContext, tenant: str
) -> None:
    key, key_id = await make(nats_url, tenant)
    rotated = await helmline(nats_url, "keys", "rotate", key_id)
    assert rotated.exit_code == 0, rotated.output
    new_key = rotated.stdout.strip()
    parts = split_api_key(new_key)
    assert parts is not None
    assert parts[0] == key_id
    assert new_key != key
    record = await find_api_key(js, key_id)
    assert record is not None
    assert record.refusal(parts[1], datetime.now(UTC)) is None
    old = split_api_key(key)
    assert old is not None
    assert record.refusal(old[1], datetime.now(UTC)) == "the API key is not known (or was mistyped)"

    revoked = await helmline(nats_url, "keys", "revoke", key_id, "--reason", "leaked")
    assert revoked.exit_code == 0, revoked.output
    assert new_key not in revoked.output
    table = await helmline(nats_url, "keys", "list", "-t", tenant)
    assert "revoked" in table.stdout
    again = await helmline(nats_url, "keys", "rotate", key_id)
    assert again.exit_code == 1
    assert "revoked" in again.output
    unknown = await helmline(nats_url, "keys", "revoke", "0123456789abcdef")
    assert unknown.exit_code == 1
    assert "no API key 0123456789abcdef" in unknown.output
