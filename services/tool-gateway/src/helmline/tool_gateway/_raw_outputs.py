"""Tool outputs as they came, before caps, redaction and neutralising, kept in an object
store under the session's name for people allowed to see them (`raw_output` in the event)."""

from __future__ import annotations

from nats.js import JetStreamContext

from helmline.contracts import TOOL_OUTPUTS_BUCKET
from helmline.runtime import EventStore, delete_object, live_objects, sessions_gone


def raw_output_name(tenant: str, session_id: str, call_id: str) -> str:
    return f"{tenant}/{session_id}/{call_id}"


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
