"""Raw tool outputs go once retention removed their session's events."""

from __future__ import annotations

from nats.js import JetStreamContext

from helmline.contracts import TOOL_OUTPUTS_BUCKET
from helmline.runtime import EventStore
from helmline.runtime.testing import push_out, session_started
from helmline.tool_gateway._raw_outputs import raw_output_name, sweep_raw_outputs


async def test_outputs_of_sessions_the_log_no_longer_holds_are_swept(
    bounded_log: tuple[str, JetStreamContext, EventStore], tenant: str
) -> None:
    _, js, store = bounded_log
    bucket = await js.object_store(TOOL_OUTPUTS_BUCKET.bucket)
    gone, kept = session_started(tenant), session_started(tenant)
    for session in (gone, kept):
        await store.append(session)
        for call in ("c1", "c2"):
            await bucket.put(raw_output_name(tenant, session.session_id, call), b"raw")

    await push_out(store, gone, kept)
    swept = await sweep_raw_outputs(bucket, store)

    assert swept == 2
    left = {info.name for info in await bucket.list(ignore_deletes=True)}
    assert left == {raw_output_name(tenant, kept.session_id, call) for call in ("c1", "c2")}
    assert await sweep_raw_outputs(bucket, store) == 0
