"""Tool outputs as they came, before caps, redaction and neutralising, kept in an object
store under the session's name for people allowed to see them (`raw_output` in the event),
sealed (AES-256-GCM) with a key the log never holds: the bucket may be replicated, backed up
and read by anyone with access to JetStream, and a raw output may hold every secret that
output safety took out of the event."""

from __future__ import annotations

import json

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError
from nats.js.object_store import ObjectStore
from pydantic import JsonValue

from helmline.contracts import TOOL_OUTPUTS_BUCKET
from helmline.runtime import EventStore, SealingKey, delete_object, live_objects, sessions_gone


def raw_output_name(tenant: str, session_id: str, call_id: str) -> str:
    return f"{tenant}/{session_id}/{call_id}"


class RawOutputs:
    """The tool-outputs bucket, every object sealed with one key."""

    def __init__(self, bucket: ObjectStore, key: SealingKey) -> None:
        self._bucket = bucket
        self._key = key

    @classmethod
    async def open(cls, js: JetStreamContext, key: SealingKey) -> RawOutputs:
        """The shared bucket (provisioned from the contracts), sealed with `key`."""
        return cls(await js.object_store(TOOL_OUTPUTS_BUCKET.bucket), key)

    async def keep(self, name: str, raw: JsonValue) -> None:
        """Keep an output, sealed, under `name`."""
        value = json.dumps(raw, ensure_ascii=False).encode()
        await self._bucket.put(name, self._key.seal(name, value))

    async def read(self, name: str) -> JsonValue | None:
        """The output kept under `name`, None when there is none; `SealingError` when it
        does not open with the key (another key's, or altered)."""
        try:
            sealed = (await self._bucket.get(name)).data or b""
        except NotFoundError:
            return None
        parsed: JsonValue = json.loads(self._key.open(name, sealed))
        return parsed


async def sweep_raw_outputs(js: JetStreamContext, store: EventStore) -> int:
    """Delete the outputs of sessions the log no longer holds; how many went."""
    by_session: dict[tuple[str, str], list[str]] = {}
    for info in await live_objects(js, TOOL_OUTPUTS_BUCKET.bucket):
        tenant, session_id, _ = info.name.split("/", 2)
        by_session.setdefault((tenant, session_id), []).append(info.name)
    swept = 0
    for session in await sessions_gone(store, by_session):
        for name in by_session[session]:
            swept += await delete_object(js, TOOL_OUTPUTS_BUCKET.bucket, name)
    return swept
