"""Secrets by value and by reference.

A secret belongs to a tenant and has a name; its value is kept in the secrets bucket sealed
(AES-256-GCM, the tenant and name bound to it) with a key that is never in NATS: a file
beside the embedded stack's data, or `HELMLINE_SECRETS_KEY`. Each revision also says who set
or removed the secret and when (never the value): the bucket's history is the audit trail.

A tool's argument `{"secret": "NAME"}` is a reference: it is what the log, policy and
argument checks see, and it is resolved to the value only where the call runs (the sandbox,
the gateway). Every service that follows the bucket redacts the values from whatever it
makes safe for the log.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import re
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from pathlib import Path

from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError
from nats.js.kv import KV_DEL, KV_PURGE, KeyValue
from pydantic import BaseModel, ConfigDict, JsonValue, TypeAdapter, ValidationError

from helmline.contracts import SECRETS_BUCKET, Actor, TenantId, ToolError
from helmline.runtime._errors import HelmlineRuntimeError
from helmline.runtime._output_safety import RegisteredSecrets, register_secrets
from helmline.runtime._sealing import SealingError, SealingKey, sealing_key

logger = logging.getLogger(__name__)

SECRET_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,127}")
"""What a secret may be called (it is part of a bucket key and of `[secret:NAME]`)."""
SHORTEST_VALUE = 8
"""Characters a value has at least: a shorter one would be found in much text that holds
no secret, and redacting it there would garble that text."""
LONGEST_VALUE = 65536
"""Characters a value has at most."""
SECRETS_KEY_FILE = "secrets.key"
"""The embedded stack's secrets key, in its data folder (readable by its owner only)."""


class SecretsError(HelmlineRuntimeError):
    """Root of the secrets' errors; the message never holds a value."""

    def tool_error(self) -> ToolError:
        """The failure of a call whose secrets could not be resolved."""
        return ToolError(
            kind="internal",
            message=f"a secret the call refers to could not be resolved: {self}",
            suggestion="an operator must give the service that runs the call the secrets key "
            "the secrets were set with",
        )


class SecretsKeyError(SecretsError):
    """No key, a malformed key, or not the key the secrets were sealed with."""


class UnknownSecret(SecretsError):
    """The tenant has no secret of that name."""

    def __init__(self, tenant: str, name: str) -> None:
        super().__init__(f"no secret named {name!r} in tenant {tenant!r}")
        self.tenant = tenant
        self.name = name

    def tool_error(self) -> ToolError:
        """The failure of a call that refers to the secret."""
        return ToolError(
            kind="not_found",
            message=f"the call refers to the secret {self.name!r}, which tenant "
            f"{self.tenant!r} does not have",
            suggestion=f"set it with `helmline secrets set {self.name} --tenant {self.tenant}`, "
            "or refer to one that `helmline secrets list` shows",
        )


def _seal(key: SealingKey, tenant: str, name: str, value: str) -> str:
    # Bound to one tenant's name: a value copied to another key of the bucket won't open.
    return base64.b64encode(key.seal(f"{tenant}/{name}", value.encode())).decode()


def _open(key: SealingKey, tenant: str, name: str, sealed: str) -> str:
    try:
        return key.open(f"{tenant}/{name}", base64.b64decode(sealed)).decode()
    except (SealingError, binascii.Error) as error:
        raise SecretsKeyError(
            f"the secret {name!r} of tenant {tenant!r} cannot be opened with this secrets "
            f"key: it was set with another key (or its record was altered): {error}"
        ) from error


def load_secrets_key(key: str | None, key_file: Path | None) -> SealingKey | None:
    """The secrets key given as text, else read from the file; None when neither is given."""
    try:
        return sealing_key(key, key_file, setting="HELMLINE_SECRETS_KEY")
    except SealingError as error:
        raise SecretsKeyError(str(error)) from error


class SecretRecord(BaseModel):
    """One revision of a secret: set (with its sealed value) or removed; who, when."""

    model_config = ConfigDict(frozen=True)

    tenant: str
    name: str
    at: datetime
    """When it was set or removed."""
    by: Actor
    """Who set or removed it."""
    sealed: str | None = None
    """The sealed value; None once removed."""
    revision: int = 0
    """The bucket's revision of this record."""

    @property
    def removed(self) -> bool:
        """Whether this revision removed the secret."""
        return self.sealed is None

    def shown(self) -> dict[str, JsonValue]:
        """What may be shown of it: never the value, nor its sealed form."""
        return {
            "tenant": self.tenant,
            "name": self.name,
            "removed" if self.removed else "set_at": self.at.isoformat(),
            "by": self.by.id,
            "revision": self.revision,
        }


def check_name(name: str) -> str:
    """The name, if a secret may be called so."""
    if SECRET_NAME.fullmatch(name) is None:
        raise SecretsError(
            f"{name[:200]!r} is not a secret name: a letter, then up to 127 letters, digits, _ or -"
        )
    return name


_TENANT = TypeAdapter(TenantId)


def _check_tenant(tenant: str) -> str:
    # Part of the bucket's key: a tenant such as `a.b` would read as another key.
    try:
        return _TENANT.validate_python(tenant)
    except ValidationError as error:
        raise SecretsError(f"{tenant[:200]!r} is not a tenant id") from error


class SecretStore:
    """The secrets bucket, through a key (without one, secrets can be listed and removed
    but not set or read); and a folder of values, if given (a mounted Kubernetes Secret),
    whose values win over the bucket's."""

    def __init__(
        self, bucket: KeyValue, key: SealingKey | None, folder: Path | None = None
    ) -> None:
        self._bucket = bucket
        self._key = key
        self._folder = folder
        self._from_bucket: dict[tuple[str, str], str] = {}
        self._from_folder: dict[tuple[str, str], str] = {}

    @classmethod
    async def open(
        cls, js: JetStreamContext, key: SealingKey | None, folder: Path | None = None
    ) -> SecretStore:
        """The store on the bucket, which provisioning made."""
        return cls(await js.key_value(SECRETS_BUCKET.bucket), key, folder)

    def _sealing(self) -> SealingKey:
        if self._key is None:
            raise SecretsKeyError(
                "no secrets key: set HELMLINE_SECRETS_KEY, or HELMLINE_SECRETS_KEY_FILE to the "
                "file holding it (the embedded stack keeps it in its data folder, "
                f"{SECRETS_KEY_FILE})"
            )
        return self._key

    async def set(self, tenant: str, name: str, value: str, by: Actor) -> SecretRecord:
        """Set (or replace) the tenant's secret `name`."""
        check_name(name)
        if not SHORTEST_VALUE <= len(value) <= LONGEST_VALUE:
            raise SecretsError(
                f"the value of {name!r} has {len(value)} characters; a secret has "
                f"{SHORTEST_VALUE} to {LONGEST_VALUE}"
            )
        sealed = _seal(self._sealing(), tenant, name, value)
        record = SecretRecord(tenant=tenant, name=name, at=datetime.now(UTC), by=by, sealed=sealed)
        revision = await self._bucket.put(_key(tenant, name), _encoded(record))
        return record.model_copy(update={"revision": revision})

    async def remove(self, tenant: str, name: str, by: Actor) -> SecretRecord:
        """Remove the tenant's secret `name`: a revision saying who removed it and when."""
        check_name(name)
        current = await self.record(tenant, name)
        if current is None:
            raise UnknownSecret(tenant, name)
        record = SecretRecord(tenant=tenant, name=name, at=datetime.now(UTC), by=by)
        revision = await self._bucket.update(
            _key(tenant, name), _encoded(record), last=current.revision
        )
        return record.model_copy(update={"revision": revision})

    async def record(self, tenant: str, name: str) -> SecretRecord | None:
        """The secret's latest revision if it is set, else None."""
        try:
            entry = await self._bucket.get(_key(tenant, name))
        except KeyNotFoundError:
            return None
        record = _decoded(entry.value, entry.revision)
        return None if record is None or record.removed else record

    async def value(self, tenant: str, name: str) -> str:
        """The value of the tenant's secret `name`: the folder's, else the bucket's."""
        if self._folder is not None:
            mounted = await asyncio.to_thread(_mounted, self._folder / _key(tenant, name))
            if mounted is not None:
                return mounted
        record = await self.record(tenant, check_name(name))
        if record is None or record.sealed is None:
            raise UnknownSecret(tenant, name)
        return _open(self._sealing(), tenant, name, record.sealed)

    async def records(self, tenant: str | None = None) -> list[SecretRecord]:
        """The secrets set now, of one tenant or all, by tenant and name."""
        keys = f"{_check_tenant(tenant)}.>" if tenant else ">"
        watcher = await self._bucket.watch(keys, ignore_deletes=True)
        found: list[SecretRecord] = []
        try:
            async for entry in watcher:
                if entry is None:
                    break
                record = _decoded(entry.value, entry.revision)
                if record is not None and not record.removed:
                    found.append(record)
        finally:
            await watcher.stop()  # type: ignore[no-untyped-call]
        return sorted(found, key=lambda r: (r.tenant, r.name))

    async def follow(self, loaded: asyncio.Event) -> None:
        """Keep this process's output safety redacting every secret set now, in every
        tenant, the bucket's (with a key) and the folder's, within moments of a change;
        `loaded` is set once those set before are redacted. Until cancelled."""
        sources = [
            *([self._follow_bucket] if self._key is not None else []),
            *([self._follow_folder] if self._folder is not None else []),
        ]
        each = [asyncio.Event() for _ in sources]

        async def all_loaded() -> None:
            for source_loaded in each:
                await source_loaded.wait()
            loaded.set()

        # One failing ends the others: the service does not go on redacting half.
        async with asyncio.TaskGroup() as group:
            group.create_task(all_loaded())
            for source, ready in zip(sources, each, strict=True):
                group.create_task(source(ready))

    async def _register(self) -> None:
        # Both of a name set in both: the one not resolved is still a value to keep out.
        values = [*self._from_bucket.items(), *self._from_folder.items()]
        # Off the event loop: with hundreds of secrets it takes tens of ms.
        register_secrets(await asyncio.to_thread(_by_name, values))

    async def _follow_bucket(self, loaded: asyncio.Event) -> None:
        key = self._sealing()
        values = self._from_bucket
        # An ordered consumer: it starts again where it was after a reconnection.
        watcher = await self._bucket.watchall()
        try:
            async for entry in watcher:
                if entry is None:
                    loaded.set()  # The values set before are all in.
                    continue
                tenant, _, name = entry.key.partition(".")
                record = (
                    None
                    if entry.operation in (KV_DEL, KV_PURGE)
                    else _decoded(entry.value, entry.revision)
                )
                if record is None or record.sealed is None:
                    values.pop((tenant, name), None)
                else:
                    try:
                        values[tenant, name] = _open(key, tenant, name, record.sealed)
                    except SecretsKeyError as error:
                        # Said loudly, without a value; the others are still redacted.
                        logger.error("%s; it is not redacted by this process", error)
                        values.pop((tenant, name), None)
                if entry.delta == 0:  # Rebuilt once a burst of changes is all in.
                    await self._register()
                    loaded.set()
        finally:
            await watcher.stop()  # type: ignore[no-untyped-call]

    async def _follow_folder(self, loaded: asyncio.Event) -> None:
        # Kubernetes updates a mounted Secret in place (a minute or so after it changes):
        # the folder is read again every half second.
        assert self._folder is not None
        said: list[str] = []
        while True:
            found, problems = await asyncio.to_thread(_mounted_values, self._folder)
            if problems != said:  # Each said once, not twice a second.
                for problem in problems:
                    logger.warning("secrets folder: %s; not used", problem)
                said = problems
            if found != self._from_folder:
                self._from_folder = found
                await self._register()
            loaded.set()
            await asyncio.sleep(FOLDER_READ_EVERY_S)


FOLDER_READ_EVERY_S = 0.5
"""How often a folder of secrets is read again."""


def _mounted(path: Path) -> str | None:
    try:
        return path.read_text()
    except FileNotFoundError:
        return None


def _mounted_values(folder: Path) -> tuple[dict[tuple[str, str], str], list[str]]:
    """The folder's values by tenant and name (each file `<tenant>.<NAME>` holds one), and
    what is wrong with the files that are not used. Hidden entries (Kubernetes' `..data` and
    timestamped folders) are skipped."""
    found: dict[tuple[str, str], str] = {}
    problems: list[str] = []
    try:
        entries = sorted(folder.iterdir())
    except FileNotFoundError:
        return found, [f"{folder} does not exist"]
    for entry in entries:
        if entry.name.startswith(".") or not entry.is_file():
            continue
        tenant, _, name = entry.name.partition(".")
        try:
            _key(tenant, name)
            value = entry.read_text()
        except (SecretsError, OSError, UnicodeDecodeError) as error:
            problems.append(f"{entry}: not a secret (<tenant>.<NAME>): {error}")
            continue
        if len(value) < SHORTEST_VALUE:
            problems.append(f"{entry}: shorter than {SHORTEST_VALUE} characters")
            continue
        found[tenant, name] = value
    return found, problems


def _by_name(values: Iterable[tuple[tuple[str, str], str]]) -> RegisteredSecrets:
    # Every tenant's values are redacted from every output: a value that reached another
    # tenant's output is no less secret there.
    return RegisteredSecrets((name, value) for (_, name), value in values)


def _key(tenant: str, name: str) -> str:
    return f"{_check_tenant(tenant)}.{check_name(name)}"


def _encoded(record: SecretRecord) -> bytes:
    return record.model_dump_json(exclude={"revision"}).encode()


def _decoded(data: bytes | None, revision: int | None) -> SecretRecord | None:
    if not data:
        return None
    try:
        return SecretRecord.model_validate_json(data).model_copy(update={"revision": revision or 0})
    except ValidationError:
        logger.warning("a record of the secrets bucket is not a secret's record; ignored")
        return None


# --- references -----------------------------------------------------------------------------

REFERENCE_KEY = "secret"
"""An argument `{"secret": "NAME"}` refers to the calling session's tenant's secret NAME."""


def _reference(value: object) -> str | None:
    if isinstance(value, dict) and len(value) == 1:
        name = value.get(REFERENCE_KEY)
        if isinstance(name, str):
            return name
    return None


def has_references(value: object) -> bool:
    """Whether arguments refer to a secret anywhere."""
    if _reference(value) is not None:
        return True
    if isinstance(value, dict):
        return any(has_references(item) for item in value.values())
    if isinstance(value, list):
        return any(has_references(item) for item in value)
    return False


def references_shown(value: JsonValue) -> JsonValue:
    """Arguments with each reference written `[secret:NAME]`: what is checked against a
    tool's schema (a reference stands for a text) and what a message may quote."""
    return _mapped(value, lambda name: f"[secret:{name}]")


async def resolved_arguments(
    secrets: SecretStore | None, tenant: str, arguments: dict[str, JsonValue]
) -> dict[str, JsonValue]:
    """`arguments` with each reference replaced by the tenant's secret's value (raises
    `UnknownSecret`, or `SecretsKeyError` without `secrets` or a key). Call only where the
    call runs, and keep the result out of every event, log line and span."""
    if not has_references(arguments):
        return arguments
    if secrets is None:
        raise SecretsKeyError("this service has no secrets store to resolve references with")
    values = {name: await secrets.value(tenant, name) for name in sorted(_names_in(arguments))}
    resolved = _mapped(arguments, values.__getitem__)
    assert isinstance(resolved, dict)
    return resolved


def _names_in(value: JsonValue) -> set[str]:
    name = _reference(value)
    if name is not None:
        return {name}
    if isinstance(value, dict):
        return set().union(*(_names_in(item) for item in value.values()))
    if isinstance(value, list):
        return set().union(*(_names_in(item) for item in value))
    return set()


def _mapped(value: JsonValue, replace: Callable[[str], str]) -> JsonValue:
    name = _reference(value)
    if name is not None:
        return replace(name)
    if isinstance(value, dict):
        return {key: _mapped(item, replace) for key, item in value.items()}
    if isinstance(value, list):
        return [_mapped(item, replace) for item in value]
    return value
