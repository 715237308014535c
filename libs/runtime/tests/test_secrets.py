"""Secrets on a real nats-server: sealed in the bucket, listed without values, removed with
a record of who did it, followed by every process's output safety, resolved by reference."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from nats.js import JetStreamContext
from pydantic import JsonValue

from helmline.contracts import SECRETS_BUCKET, Actor
from helmline.runtime import (
    JsonFormatter,
    RegisteredSecrets,
    SealingKey,
    SecretsError,
    SecretsKeyError,
    SecretStore,
    UnknownSecret,
    has_references,
    load_secrets_key,
    make_safe,
    references_shown,
    register_secrets,
    resolved_arguments,
)
from helmline.runtime.testing import eventually

ALICE = Actor(id="alice")
VALUE = "ghp_0123456789abcdefghijklmnopqrstuvwxyz"


@pytest.fixture
async def secrets(js: JetStreamContext) -> SecretStore:
    return await SecretStore.open(js, SealingKey.generate())


@pytest.fixture
async def following(secrets: SecretStore) -> AsyncIterator[None]:
    loaded = asyncio.Event()
    task = asyncio.create_task(secrets.follow(loaded))
    await asyncio.wait_for(loaded.wait(), 10)
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    register_secrets(RegisteredSecrets(()))


async def test_a_value_is_sealed_in_the_bucket_and_read_back_with_the_key(
    js: JetStreamContext, secrets: SecretStore, tenant: str
) -> None:
    record = await secrets.set(tenant, "GH_TOKEN", VALUE, by=ALICE)
    stored = await (await js.key_value(SECRETS_BUCKET.bucket)).get(f"{tenant}.GH_TOKEN")
    assert stored.value is not None
    assert VALUE.encode() not in stored.value
    assert json.loads(stored.value)["by"]["id"] == "alice"
    assert await secrets.value(tenant, "GH_TOKEN") == VALUE
    assert record.revision == stored.revision
    assert VALUE not in json.dumps(record.shown())


async def test_list_shows_names_and_when_never_values_and_rm_keeps_who(
    js: JetStreamContext, secrets: SecretStore, tenant: str
) -> None:
    await secrets.set(tenant, "B_SECRET", "value-of-b-1", by=ALICE)
    await secrets.set(tenant, "A_SECRET", "value-of-a-1", by=ALICE)
    assert [r.name for r in await secrets.records(tenant)] == ["A_SECRET", "B_SECRET"]
    removed = await secrets.remove(tenant, "A_SECRET", by=Actor(id="bob"))
    assert removed.removed
    assert [r.name for r in await secrets.records(tenant)] == ["B_SECRET"]
    with pytest.raises(UnknownSecret, match="no secret named 'A_SECRET'"):
        await secrets.value(tenant, "A_SECRET")
    with pytest.raises(UnknownSecret):
        await secrets.remove(tenant, "A_SECRET", by=ALICE)
    # The bucket's history is the audit trail: who set it, then who removed it.
    history = await (await js.key_value(SECRETS_BUCKET.bucket)).history(f"{tenant}.A_SECRET")
    assert [json.loads(e.value or b"{}")["by"]["id"] for e in history] == ["alice", "bob"]


async def test_a_tenant_sees_only_its_own_secrets(secrets: SecretStore, tenant: str) -> None:
    await secrets.set(tenant, "MINE", "mine-value-1", by=ALICE)
    with pytest.raises(UnknownSecret):
        await secrets.value(f"{tenant}x", "MINE")
    assert await secrets.records(f"{tenant}x") == []


async def test_another_key_cannot_open_a_value_and_says_so(
    js: JetStreamContext, secrets: SecretStore, tenant: str
) -> None:
    await secrets.set(tenant, "SEALED", "sealed-value-1", by=ALICE)
    other = await SecretStore.open(js, SealingKey.generate())
    with pytest.raises(SecretsKeyError, match="set with another key") as raised:
        await other.value(tenant, "SEALED")
    assert "sealed-value-1" not in str(raised.value)


async def test_bad_names_values_and_keys_are_refused_clearly(
    secrets: SecretStore, tenant: str, tmp_path: Path
) -> None:
    with pytest.raises(SecretsError, match="not a secret name"):
        await secrets.set(tenant, "has.dot", "long-enough-1", by=ALICE)
    with pytest.raises(SecretsError, match="not a tenant id"):
        await secrets.set("a.b", "NAME", "long-enough-1", by=ALICE)
    with pytest.raises(SecretsError, match="has 3 characters"):
        await secrets.set(tenant, "SHORT", "abc", by=ALICE)
    with pytest.raises(SecretsKeyError, match="holds 5 bytes"):
        load_secrets_key("c2hvcnQ=", None)
    wrong = tmp_path / "wrong.key"
    wrong.write_text("not a key at all!\n")
    with pytest.raises(SecretsKeyError, match=str(wrong)):
        load_secrets_key(None, wrong)


@pytest.mark.usefixtures("following")
async def test_a_value_set_is_redacted_at_once_and_no_longer_once_removed(
    secrets: SecretStore, tenant: str
) -> None:
    await secrets.set(tenant, "LIVE_TOKEN", "live-token-value-42", by=ALICE)
    redacted = await eventually(
        lambda: make_safe("got live-token-value-42", max_bytes=1000).redactions,
        timeout_s=1.0,
        what="the new secret redacted",
    )
    assert redacted == 1
    assert make_safe("got live-token-value-42", max_bytes=1000).output == "got [secret:LIVE_TOKEN]"
    await secrets.remove(tenant, "LIVE_TOKEN", by=ALICE)
    await eventually(
        lambda: make_safe("live-token-value-42", max_bytes=1000).redactions == 0,
        timeout_s=1.0,
        what="the removed secret no longer redacted",
    )


async def test_references_are_shown_by_name_and_resolved_only_when_asked(
    secrets: SecretStore, tenant: str
) -> None:
    await secrets.set(tenant, "API", "api-value-123", by=ALICE)
    arguments: dict[str, JsonValue] = {
        "command": "echo $T",
        "env": {"T": {"secret": "API"}, "U": "plain"},
    }
    assert has_references(arguments)
    assert not has_references({"env": {"T": {"secret": "API", "other": 1}}})
    assert references_shown(arguments) == {
        "command": "echo $T",
        "env": {"T": "[secret:API]", "U": "plain"},
    }
    resolved = await resolved_arguments(secrets, tenant, arguments)
    assert resolved["env"] == {"T": "api-value-123", "U": "plain"}
    assert arguments["env"] == {"T": {"secret": "API"}, "U": "plain"}
    with pytest.raises(UnknownSecret) as unknown:
        await resolved_arguments(secrets, tenant, {"x": {"secret": "NOPE"}})
    error = unknown.value.tool_error()
    assert (error.kind, error.retryable) == ("not_found", False)
    assert "'NOPE'" in error.message


def test_a_log_line_never_holds_a_registered_value() -> None:
    register_secrets(RegisteredSecrets([("LOGGED", "logged-value-9")]))
    try:
        error = ValueError("server said logged-value-9")
        record = logging.LogRecord(
            "helmline.test", logging.WARNING, __file__, 1, "got %s", ("logged-value-9",), None
        )
        record.exc_info = (ValueError, error, None)
        line = json.loads(JsonFormatter("tool-gateway").format(record))
    finally:
        register_secrets(RegisteredSecrets(()))
    assert line["message"] == "got [secret:LOGGED]"
    assert "logged-value-9" not in line["exception"]


async def test_a_mounted_folder_of_values_is_resolved_and_redacted_as_it_changes(
    js: JetStreamContext, tenant: str, tmp_path: Path
) -> None:
    # As Kubernetes mounts a Secret: each key a link into a hidden folder it swaps.
    folder = tmp_path / "secrets"
    (folder / "..data").mkdir(parents=True)
    (folder / "..data" / f"{tenant}.MOUNTED").write_text("mounted-value-7")
    (folder / f"{tenant}.MOUNTED").symlink_to(f"..data/{tenant}.MOUNTED")
    (folder / "not-a-secret").write_text("whatever-it-holds")
    store = await SecretStore.open(js, None, folder)
    assert await store.value(tenant, "MOUNTED") == "mounted-value-7"
    with pytest.raises(UnknownSecret):
        await store.value(tenant, "ELSEWHERE")
    loaded = asyncio.Event()
    task = asyncio.create_task(store.follow(loaded))
    try:
        await asyncio.wait_for(loaded.wait(), 10)
        assert make_safe("x mounted-value-7", max_bytes=100).output == "x [secret:MOUNTED]"
        (folder / "..data" / f"{tenant}.MOUNTED").write_text("changed-value-8")
        await eventually(
            lambda: make_safe("changed-value-8", max_bytes=100).redactions == 1,
            timeout_s=2.0,
            what="the changed value redacted",
        )
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        register_secrets(RegisteredSecrets(()))
