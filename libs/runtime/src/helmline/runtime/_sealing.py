"""Sealing: what must be kept at rest but never shared (a tool's raw output, before output
safety) is encrypted with AES-256-GCM under a key that no event, export or log line holds.

A sealed value names the key it was sealed with by a fingerprint (eight bytes of a keyed
hash, which tells nothing of the key), so that opening it with another key says so rather
than "corrupt"; the value's name (its object's name) is authenticated with it, so a value
moved under another name does not open either.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from helmline.runtime._errors import HelmlineRuntimeError

MAGIC = b"HLS1"
"""How a sealed value begins (format version 1)."""
_FINGERPRINT_BYTES = 8
_NONCE_BYTES = 12
KEY_BYTES = 32
SEALING_KEY_FILE = "sealing.key"
"""The key's file in a stack's data folder (`helmline up` makes it, readable by its owner
only)."""


class SealingError(HelmlineRuntimeError):
    """A sealed value that cannot be opened, or a key that cannot be used; the message says
    which and what to do."""


class NoSealingKey(SealingError):
    """No key was configured where one is needed."""


class WrongSealingKey(SealingError):
    """The value was sealed with another key than the one given."""


class BrokenSeal(SealingError):
    """The value is not sealed, was altered, or was stored under another name."""


@dataclass(frozen=True, slots=True)
class SealingKey:
    """A 256-bit key; its text form (for a setting or a Kubernetes Secret) is base64."""

    secret: bytes = field(repr=False)

    def __post_init__(self) -> None:
        if len(self.secret) != KEY_BYTES:
            raise SealingError(f"a sealing key has {KEY_BYTES} bytes, not {len(self.secret)}")

    @classmethod
    def generate(cls) -> SealingKey:
        return cls(secrets.token_bytes(KEY_BYTES))

    @classmethod
    def from_text(cls, text: str, *, source: str = "the sealing key") -> SealingKey:
        """The key written as base64 (what `text` gives)."""
        try:
            secret = base64.b64decode(text.strip(), validate=True)
        except binascii.Error as error:
            raise SealingError(f"{source} is not base64: {error}") from None
        if len(secret) != KEY_BYTES:
            raise SealingError(
                f"{source} holds {len(secret)} bytes; a sealing key holds {KEY_BYTES} "
                "(make one with `head -c 32 /dev/urandom | base64`)"
            )
        return cls(secret)

    @classmethod
    def read(cls, path: Path) -> SealingKey:
        """The key in a file (base64)."""
        try:
            text = path.read_text(encoding="ascii")
        except (OSError, UnicodeDecodeError) as error:
            raise SealingError(f"cannot read the sealing key {path}: {error}") from None
        return cls.from_text(text, source=str(path))

    @classmethod
    def kept_in(cls, path: Path) -> SealingKey:
        """The key in `path`, made there first (readable by its owner only) if missing."""
        if not path.exists():
            try:
                descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                return cls.read(path)  # Made meanwhile by another process.
            with os.fdopen(descriptor, "w", encoding="ascii") as file:
                file.write(cls.generate().text() + "\n")
        return cls.read(path)

    def text(self) -> str:
        """The key as base64, for a file or a Secret."""
        return base64.b64encode(self.secret).decode("ascii")

    @property
    def fingerprint(self) -> str:
        """Names the key in sealed values and errors without telling anything of it."""
        digest = hashlib.blake2b(self.secret, key=b"helmline sealing key", digest_size=8)
        return digest.hexdigest()

    def seal(self, name: str, value: bytes) -> bytes:
        """`value` encrypted and authenticated, bound to `name`."""
        nonce = secrets.token_bytes(_NONCE_BYTES)
        sealed = AESGCM(self.secret).encrypt(nonce, value, name.encode())
        return MAGIC + bytes.fromhex(self.fingerprint) + nonce + sealed

    def open(self, name: str, sealed: bytes) -> bytes:
        """The value `seal(name, value)` sealed; `SealingError` saying why it cannot be."""
        header = len(MAGIC) + _FINGERPRINT_BYTES
        if not sealed.startswith(MAGIC) or len(sealed) < header + _NONCE_BYTES:
            raise BrokenSeal(f"{name} is not a sealed value")
        used = sealed[len(MAGIC) : header].hex()
        if used != self.fingerprint:
            raise WrongSealingKey(
                f"{name} was sealed with key {used}, not with the key given ({self.fingerprint})"
            )
        nonce, body = sealed[header : header + _NONCE_BYTES], sealed[header + _NONCE_BYTES :]
        try:
            return AESGCM(self.secret).decrypt(nonce, body, name.encode())
        except InvalidTag:
            raise BrokenSeal(
                f"{name} does not open with its key: it was altered, or stored under another name"
            ) from None


def sealing_key(
    text: str | None, path: Path | None, *, setting: str = "HELMLINE_SEALING_KEY"
) -> SealingKey | None:
    """The key a setting (named `setting` in errors) gives: as base64 text (a Kubernetes
    Secret's variable) first, then as a file; None when neither is set."""
    if text:
        return SealingKey.from_text(text, source=setting)
    if path is not None:
        return SealingKey.read(path)
    return None
