"""What services keep beside the log goes once retention removed its session's events:
stored states here (tool outputs and snapshots in their services' tests), and the
conditional change and whole delete of an object the object stores' sweeps rely on."""

from __future__ import annotations

import pytest
from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError, NoKeysError, ObjectNotFoundError

from helmline.contracts import SESSION_STATES_BUCKET, TOOL_OUTPUTS_BUCKET, Event, ThoughtRecorded
from helmline.runtime import (
    EventStore,
    FoldedStates,
    RuntimeSettings,
    ServiceHost,
    Sweep,
    change_object_meta,
    delete_object_if,
    live_objects,
    sessions_gone,
)
from helmline.runtime.testing import eventually, push_out, remains_of, session_started

BoundedLog = tuple[str, JetStreamContext, EventStore]


async def with_thoughts(store: EventStore, tenant: str, thoughts: int) -> Event:
    """A new session of `thoughts` thoughts after its start; its start."""
    started = session_started(tenant)
    await store.append(started)
    await store.append_pipelined(
        [
            started.derive(ThoughtRecorded(kind="observation", text=str(i)), source="t", key=str(i))
            for i in range(thoughts)
        ]
    )
    return started


def key(started: Event) -> tuple[str, str]:
    return started.tenant, started.session_id


async def stored_keys(js: JetStreamContext) -> set[str]:
    try:
        return set(await (await js.key_value(SESSION_STATES_BUCKET.bucket)).keys())
    except NoKeysError:
        return set()


async def test_states_of_sessions_the_log_no_longer_holds_and_of_other_versions_are_swept(
    bounded_log: BoundedLog, tenant: str
) -> None:
    _, js, store = bounded_log
    states = FoldedStates(js, store, every=5, interval_s=0)
    gone = await with_thoughts(store, tenant, 20)
    kept = await with_thoughts(store, tenant, 20)
    for session in (gone, kept):
        assert await states.keep_up(tenant, session.session_id, await store.last_seq(*key(session)))
    bucket = await js.key_value(SESSION_STATES_BUCKET.bucket)
    await bucket.put(f"v0-earlier.{tenant}.{kept.session_id}.index", b"[5]")
    before = await stored_keys(js)
    of_gone = {k for k in before if f".{gone.session_id}." in k}
    assert len(of_gone) >= 2  # States and their index.

    await push_out(store, gone, kept)
    assert await sessions_gone(store, [key(gone), key(kept)]) == {key(gone)}
    swept = await states.sweep()

    assert swept == len(of_gone) + 1
    assert await stored_keys(js) == before - of_gone - {
        f"v0-earlier.{tenant}.{kept.session_id}.index"
    }
    with pytest.raises(KeyNotFoundError) as missing:
        await bucket.get(next(iter(of_gone)))
    assert missing.value.entry is None  # Not even a deletion marker is left.
    loaded = await states.load(tenant, kept.session_id)
    assert loaded.last_seq == await store.last_seq(*key(kept))


async def test_a_service_sweeps_regularly_only_when_the_log_has_limits_whatever_one_sweep_meets(
    bounded_log: BoundedLog,
) -> None:
    url, _, _ = bounded_log
    sweeps: dict[str, list[str]] = {"unbounded": [], "bounded": []}

    def sweep_of(host: str) -> Sweep:
        async def sweep() -> int:
            sweeps[host].append("swept")
            if len(sweeps[host]) == 1:
                raise ValueError("an object the sweep cannot read")  # Later sweeps still run.
            return 0

        return sweep

    unbounded = RuntimeSettings(nats_url=url, sweep_interval_s=0.01)
    bounded = RuntimeSettings(nats_url=url, sweep_interval_s=0.01, events_max_bytes=256 * 1024)
    async with (
        ServiceHost("unbounded", unbounded) as without_limits,
        ServiceHost("bounded", bounded) as with_limits,
    ):
        without_limits.sweep_regularly("nothing", sweep_of("unbounded"))
        with_limits.sweep_regularly("nothing", sweep_of("bounded"))
        # A sweep started without limits would have run first, at once.
        await eventually(lambda: len(sweeps["bounded"]) >= 3, what="three sweeps")
    assert sweeps["unbounded"] == []


class StoredAgain:
    """JetStream on which the object `name` is stored again (as a snapshot would) right
    after a reader read an object's metadata, the worst moment for a blind write; or, with
    `before_read`, right before (after the reader listed it)."""

    def __init__(self, js: JetStreamContext, name: str, *, before_read: bool = False) -> None:
        self._js = js
        self._name = name
        self._before_read = before_read

    async def get_last_msg(self, stream: str, subject: str):  # type: ignore[no-untyped-def]
        if self._before_read:
            await self._store_again()
        last = await self._js.get_last_msg(stream, subject)
        if not self._before_read:
            await self._store_again()
        return last

    async def _store_again(self) -> None:
        bucket = await self._js.object_store(TOOL_OUTPUTS_BUCKET.bucket)
        await bucket.put(self._name, b"stored again")

    def __getattr__(self, name: str) -> object:
        return getattr(self._js, name)


async def test_an_object_stored_again_after_its_metadata_was_read_is_neither_changed_nor_deleted(
    js: JetStreamContext, tenant: str
) -> None:
    bucket = await js.object_store(TOOL_OUTPUTS_BUCKET.bucket)
    name = f"{tenant}/s/c"
    await bucket.put(name, b"first")
    racing = StoredAgain(js, name)

    marked = await change_object_meta(
        racing,  # type: ignore[arg-type]
        TOOL_OUTPUTS_BUCKET.bucket,
        name,
        lambda meta: {**meta, "headers": {"Marked": ["yes"]}},
    )
    deleted = await delete_object_if(
        racing,  # type: ignore[arg-type]
        TOOL_OUTPUTS_BUCKET.bucket,
        name,
        lambda meta: True,
    )

    assert (marked, deleted) == (None, False)
    stored = await bucket.get(name)
    assert stored.data == b"stored again"
    assert not (stored.info.headers or {}).get("Marked")


async def test_an_object_unchanged_since_read_is_changed_and_deleted(
    js: JetStreamContext, tenant: str
) -> None:
    bucket = await js.object_store(TOOL_OUTPUTS_BUCKET.bucket)
    name = f"{tenant}/s/c"
    await bucket.put(name, b"first")

    marked = await change_object_meta(
        js, TOOL_OUTPUTS_BUCKET.bucket, name, lambda meta: {**meta, "headers": {"Marked": ["yes"]}}
    )
    assert marked is not None
    assert (await bucket.get_info(name)).headers == {"Marked": ["yes"]}
    assert not await delete_object_if(
        js, TOOL_OUTPUTS_BUCKET.bucket, name, lambda meta: "Other" in meta["headers"]
    )
    assert await delete_object_if(
        js, TOOL_OUTPUTS_BUCKET.bucket, name, lambda meta: "Marked" in meta["headers"]
    )
    with pytest.raises(ObjectNotFoundError):
        await bucket.get_info(name)


def cut_short(meta: dict[str, object]) -> dict[str, object]:
    """The marker a delete writes before a crash keeps it from purging anything."""
    return {**meta, "deleted": True, "size": 0, "chunks": 0, "digest": "", "mtime": ""}


async def test_a_delete_leaves_nothing_and_one_cut_short_is_finished_by_the_next_listing(
    js: JetStreamContext, tenant: str
) -> None:
    bucket = await js.object_store(TOOL_OUTPUTS_BUCKET.bucket)
    deleted = await bucket.put(f"{tenant}/s/deleted", b"x" * 300_000)  # Three chunks.
    crashed = await bucket.put(f"{tenant}/s/crashed", b"y" * 300_000)

    assert await delete_object_if(js, TOOL_OUTPUTS_BUCKET.bucket, deleted.name, lambda _: True)
    assert await change_object_meta(js, TOOL_OUTPUTS_BUCKET.bucket, crashed.name, cut_short)
    assert await remains_of(js, TOOL_OUTPUTS_BUCKET.bucket, [deleted]) == 0
    assert await remains_of(js, TOOL_OUTPUTS_BUCKET.bucket, [crashed]) == 4

    listed = {info.name for info in await live_objects(js, TOOL_OUTPUTS_BUCKET.bucket)}
    assert crashed.name not in listed
    assert await remains_of(js, TOOL_OUTPUTS_BUCKET.bucket, [crashed]) == 0


@pytest.mark.parametrize("before_read", [False, True])
async def test_a_name_stored_again_while_its_delete_is_finished_keeps_what_was_stored(
    js: JetStreamContext, tenant: str, before_read: bool
) -> None:
    bucket = await js.object_store(TOOL_OUTPUTS_BUCKET.bucket)
    name = f"{tenant}/s/c"
    await bucket.put(name, b"first")
    assert await change_object_meta(js, TOOL_OUTPUTS_BUCKET.bucket, name, cut_short)

    racing = StoredAgain(js, name, before_read=before_read)
    await live_objects(racing, TOOL_OUTPUTS_BUCKET.bucket)  # type: ignore[arg-type]

    assert (await bucket.get(name)).data == b"stored again"
