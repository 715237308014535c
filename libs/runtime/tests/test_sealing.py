"""Sealing: raw outputs at rest open only with the key and under the name they were sealed
with, and every way they cannot be opened is told apart."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from helmline.runtime import (
    BrokenSeal,
    SealingError,
    SealingKey,
    WrongSealingKey,
    sealing_key,
)

SECRET = b'{"result": "AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"}'


def test_a_sealed_value_opens_with_its_key_and_name_and_shows_nothing_of_itself() -> None:
    key = SealingKey.generate()
    sealed = key.seal("t/s/c1", SECRET)

    assert b"wJalrXUtnFEMI" not in sealed
    assert key.seal("t/s/c1", SECRET) != sealed  # a fresh nonce each time
    assert key.open("t/s/c1", sealed) == SECRET


def test_another_key_is_told_apart_from_an_altered_value() -> None:
    key, other = SealingKey.generate(), SealingKey.generate()
    sealed = key.seal("t/s/c1", SECRET)

    with pytest.raises(WrongSealingKey, match=f"sealed with key {key.fingerprint}, not with"):
        other.open("t/s/c1", sealed)
    altered = sealed[:-1] + bytes([sealed[-1] ^ 1])
    with pytest.raises(BrokenSeal, match="altered, or stored under another name"):
        key.open("t/s/c1", altered)
    with pytest.raises(BrokenSeal, match="altered, or stored under another name"):
        key.open("t/s/c2", sealed)
    with pytest.raises(BrokenSeal, match="t/s/c1 is not a sealed value"):
        key.open("t/s/c1", SECRET)


def test_the_key_file_is_made_once_readable_by_its_owner_only(tmp_path: Path) -> None:
    path = tmp_path / "sealing.key"
    made = SealingKey.kept_in(path)

    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert SealingKey.kept_in(path) == made
    assert sealing_key(None, path) == made
    assert sealing_key(made.text(), None) == made
    assert sealing_key(None, None) is None
    assert made.text() not in repr(made)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("not base64!", "HELMLINE_SEALING_KEY is not base64"),
        ("c2hvcnQ=", "HELMLINE_SEALING_KEY holds 5 bytes; a sealing key holds 32"),
    ],
)
def test_a_key_that_cannot_be_used_says_why(text: str, problem: str) -> None:
    with pytest.raises(SealingError, match=problem):
        sealing_key(text, None)


def test_a_missing_key_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(SealingError, match=r"cannot read the sealing key .*nope\.key"):
        sealing_key(None, tmp_path / "nope.key")
