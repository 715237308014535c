"""`helmline raw-output`: a call's output as the tool gave it, read back from the object
store for whoever holds the sealing key; every other case says what is missing."""

from __future__ import annotations

import json
from pathlib import Path

from nats.js import JetStreamContext
from pydantic import JsonValue

from helmline.cli.testing import invoke
from helmline.runtime import SEALING_KEY_FILE, SealingKey
from helmline.tool_gateway import RawOutputs, raw_output_name

RAW: dict[str, JsonValue] = {"result": "token ghp_" + "Zx9" * 12 + " and more"}


def _data_folder(path: Path) -> SealingKey:
    """A data folder with its key, as `helmline up` leaves it."""
    path.mkdir()
    return SealingKey.kept_in(path / SEALING_KEY_FILE)


async def _kept(js: JetStreamContext, tenant: str, data_dir: Path) -> SealingKey:
    key = _data_folder(data_dir)
    await (await RawOutputs.open(js, key)).keep(raw_output_name(tenant, "s1", "c1"), RAW)
    return key


async def test_the_raw_output_opens_with_the_data_folders_key(
    nats_url: str, js: JetStreamContext, tenant: str, tmp_path: Path
) -> None:
    await _kept(js, tenant, tmp_path / "data")

    result = await invoke(
        nats_url, "raw-output", "s1", "c1", "-t", tenant, "--data-dir", str(tmp_path / "data")
    )

    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == RAW


async def test_another_key_a_missing_key_and_a_missing_output_are_told_apart(
    nats_url: str, js: JetStreamContext, tenant: str, tmp_path: Path
) -> None:
    key = await _kept(js, tenant, tmp_path / "data")
    other = tmp_path / "other"
    _data_folder(other)
    empty = tmp_path / "empty"

    wrong = await invoke(nats_url, "raw-output", "s1", "c1", "-t", tenant, "--data-dir", str(other))
    assert wrong.exit_code == 1
    assert f"cannot open the raw output: {tenant}/s1/c1 was sealed with key {key.fingerprint}" in (
        wrong.stderr
    )
    assert "ghp_" not in wrong.output

    missing = await invoke(
        nats_url, "raw-output", "s1", "c1", "-t", tenant, "--data-dir", str(empty)
    )
    assert missing.exit_code == 1
    assert "no sealing key: " in missing.stderr
    assert "HELMLINE_SEALING_KEY" in missing.stderr

    none = await invoke(
        nats_url, "raw-output", "s1", "c2", "-t", tenant, "--data-dir", str(tmp_path / "data")
    )
    assert none.exit_code == 1
    assert "no raw output of call c2 in session s1" in none.stderr
