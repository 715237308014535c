"""Changing and deleting a JetStream object only if nobody changed it since it was read, and
deleting it whole.

An object store keeps each object's metadata as the last message on its own subject
(`$O.<bucket>.M.<name>`), and its content as chunks on another (`$O.<bucket>.C.<nuid>`).
The client's `update_meta` and `delete` read the metadata and write it back blindly: one
writer's put between the two is then lost, or its new content deleted. Written here with
the subject's last sequence expected, a change is refused instead.

The client's `delete` also leaves a marker on the metadata subject for ever, and a crash
between the marker and the purge of the chunks leaves content nobody can read. A delete here
removes both, and `live_objects` finishes what a crash cut short."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from nats.js import JetStreamContext
from nats.js.api import Header, ObjectInfo
from nats.js.errors import APIError, NotFoundError
from nats.js.kv import MSG_ROLLUP_SUBJECT
from nats.js.object_store import (
    OBJ_CHUNKS_PRE_TEMPLATE,
    OBJ_META_PRE_TEMPLATE,
    OBJ_STREAM_TEMPLATE,
)

from helmline.contracts import Headers
from helmline.runtime._store import WRONG_LAST_SEQUENCE

ObjectMeta = dict[str, Any]
"""An object's metadata as stored: name, nuid, size, chunks, digest, deleted, headers..."""


def meta_subject(bucket: str, name: str) -> str:
    """The subject holding an object's metadata."""
    return OBJ_META_PRE_TEMPLATE.format(
        bucket=bucket, obj=base64.urlsafe_b64encode(name.encode()).decode()
    )


def chunks_subject(bucket: str, nuid: str) -> str:
    """The subject holding the chunks of an object as put under `nuid`."""
    return OBJ_CHUNKS_PRE_TEMPLATE.format(bucket=bucket, obj=nuid)


@dataclass(frozen=True, slots=True)
class _Stored:
    """An object's metadata and the sequence of the message holding it."""

    meta: ObjectMeta
    seq: int


async def _stored_meta(js: JetStreamContext, bucket: str, name: str) -> _Stored | None:
    stream = OBJ_STREAM_TEMPLATE.format(bucket=bucket)
    try:
        last = await js.get_last_msg(stream, meta_subject(bucket, name))
    except NotFoundError:
        return None
    # A stored message always has a sequence; the client types it as optional.
    return _Stored(json.loads(last.data or b"{}"), cast(int, last.seq))


async def change_object_meta(
    js: JetStreamContext, bucket: str, name: str, change: Callable[[ObjectMeta], ObjectMeta | None]
) -> ObjectMeta | None:
    """Write `change(meta)` over the object's metadata, unless `change` returns None, the
    object is unknown, or its metadata changed since it was read here; what was written."""
    written = await _write_over(js, bucket, name, change)
    return written.meta if written is not None else None


async def delete_object_if(
    js: JetStreamContext, bucket: str, name: str, condition: Callable[[ObjectMeta], bool]
) -> bool:
    """Delete the object if `condition` holds of its metadata as it is when deleted (not as
    it was when the caller looked), leaving nothing of it; whether it was deleted."""

    def deleted(meta: ObjectMeta) -> ObjectMeta | None:
        if meta.get("deleted") or not condition(meta):
            return None
        # As the object store's own delete leaves it: a marker keeping the name and nuid.
        return {**meta, "deleted": True, "size": 0, "chunks": 0, "digest": "", "mtime": ""}

    marker = await _write_over(js, bucket, name, deleted)
    if marker is None:
        return False
    # A crash from here on leaves the marker: `live_objects` finishes the delete.
    await _remove_deleted(js, bucket, name, marker)
    return True


async def delete_object(js: JetStreamContext, bucket: str, name: str) -> bool:
    """Delete the object, leaving nothing of it; whether it was there to delete."""
    return await delete_object_if(js, bucket, name, lambda _: True)


async def live_objects(js: JetStreamContext, bucket: str) -> list[ObjectInfo]:
    """The objects `bucket` holds, but deleted ones, whose remains (the marker, and the
    chunks of a delete a crash cut short) are removed on the way."""
    store = await js.object_store(bucket)
    try:
        listed = await store.list()
    except NotFoundError:  # The bucket holds nothing.
        return []
    for info in listed:
        if info.deleted:
            marker = await _stored_meta(js, bucket, info.name)
            # Unless removed, or stored again, since it was listed.
            if marker is not None and marker.meta.get("deleted"):
                await _remove_deleted(js, bucket, info.name, marker)
    return [info for info in listed if not info.deleted]


async def _write_over(
    js: JetStreamContext, bucket: str, name: str, change: Callable[[ObjectMeta], ObjectMeta | None]
) -> _Stored | None:
    last = await _stored_meta(js, bucket, name)
    if last is None:
        return None
    changed = change(last.meta)
    if changed is None:
        return None
    headers = {
        Header.ROLLUP.value: MSG_ROLLUP_SUBJECT,
        Headers.EXPECTED_LAST_SUBJECT_SEQUENCE: str(last.seq),
    }
    stream = OBJ_STREAM_TEMPLATE.format(bucket=bucket)
    try:
        data = json.dumps(changed).encode()
        ack = await js.publish(meta_subject(bucket, name), data, stream=stream, headers=headers)
    except APIError as error:
        if error.err_code == WRONG_LAST_SEQUENCE:
            return None
        raise
    return _Stored(changed, ack.seq)


async def _remove_deleted(js: JetStreamContext, bucket: str, name: str, marker: _Stored) -> None:
    """Purge a deleted object's chunks, then its marker: the marker, while it stays, is what
    tells a later listing that a delete is unfinished. Up to the marker only, so that the
    name stored again meanwhile keeps its new metadata."""
    stream = OBJ_STREAM_TEMPLATE.format(bucket=bucket)
    await js.purge_stream(stream, subject=chunks_subject(bucket, marker.meta["nuid"]))
    await js.purge_stream(stream, subject=meta_subject(bucket, name), seq=marker.seq + 1)
