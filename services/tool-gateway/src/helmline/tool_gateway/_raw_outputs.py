"""Tool outputs as they came, before caps, redaction and neutralising, kept in an object
store under the session's name for people allowed to see them (`raw_output` in the event)."""

from __future__ import annotations

from nats.js.errors import NotFoundError
from nats.js.object_store import ObjectStore

from helmline.runtime import EventStore, sessions_gone


def raw_output_name(tenant: str, session_id: str, call_id: str) -> str:
    return f"{tenant}/{session_id}/{call_id}"


async def sweep_raw_outputs(bucket: ObjectStore, store: EventStore) -> int:
    """Delete the outputs of sessions the log no longer holds; how many went."""
    try:
        stored = await bucket.list(ignore_deletes=True)
    except NotFoundError:  # The bucket holds nothing.
        return 0
    by_session: dict[tuple[str, str], list[str]] = {}
    for info in stored:
        tenant, session_id, _ = info.name.split("/", 2)
        by_session.setdefault((tenant, session_id), []).append(info.name)
    swept = 0
    for session in await sessions_gone(store, by_session):
        for name in by_session[session]:
            await bucket.delete(name)
            swept += 1
    return swept
