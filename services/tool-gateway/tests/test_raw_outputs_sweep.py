"""Raw tool outputs go once retention removed their session's events, and leave nothing in
the bucket's stream."""

from __future__ import annotations

from nats.js import JetStreamContext

from helmline.contracts import TOOL_OUTPUTS_BUCKET
from helmline.runtime import EventStore
from helmline.runtime.testing import push_out, remains_of, session_started
from helmline.tool_gateway._raw_outputs import raw_output_name, sweep_raw_outputs


async def test_outputs_of_sessions_the_log_no_longer_holds_are_swept(
    bounded_log: tuple[str, JetStreamContext, EventStore], tenant: str
) -> None:
    _, js, store = bounded_log
    bucket = await js.object_store(TOOL_OUTPUTS_BUCKET.bucket)
    gone, kept = session_started(tenant), session_started(tenant)
    put = {}
    for session in (gone, kept):
        await store.append(session)
        put[session.session_id] = [
            await bucket.put(raw_output_name(tenant, session.session_id, call), b"raw")
            for call in ("c1", "c2")
        ]

    await push_out(store, gone, kept)
    swept = await sweep_raw_outputs(js, store)

    assert swept == 2
    left = {info.name for info in await bucket.list(ignore_deletes=True)}
    assert left == {raw_output_name(tenant, kept.session_id, call) for call in ("c1", "c2")}
    assert await remains_of(js, TOOL_OUTPUTS_BUCKET.bucket, put[gone.session_id]) == 0
    assert await remains_of(js, TOOL_OUTPUTS_BUCKET.bucket, put[kept.session_id]) == 4
    assert await sweep_raw_outputs(js, store) == 0
