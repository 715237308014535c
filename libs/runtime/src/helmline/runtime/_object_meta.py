"""Changing a JetStream object's metadata only if nobody changed it since it was read.

An object store keeps each object's metadata as the last message on its own subject
(`$O.<bucket>.M.<name>`), and its content as chunks on another (`$O.<bucket>.C.<nuid>`).
The client's `update_meta` and `delete` read the metadata and write it back blindly: one
writer's put between the two is then lost, or its new content deleted. Written here with
the subject's last sequence expected, a change is refused instead."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any

from nats.js import JetStreamContext
from nats.js.api import Header
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


async def change_object_meta(
    js: JetStreamContext, bucket: str, name: str, change: Callable[[ObjectMeta], ObjectMeta | None]
) -> ObjectMeta | None:
    """Write `change(meta)` over the object's metadata, unless `change` returns None, the
    object is unknown, or its metadata changed since it was read here; what was written."""
    subject = OBJ_META_PRE_TEMPLATE.format(
        bucket=bucket, obj=base64.urlsafe_b64encode(name.encode()).decode()
    )
    stream = OBJ_STREAM_TEMPLATE.format(bucket=bucket)
    try:
        last = await js.get_last_msg(stream, subject)
    except NotFoundError:
        return None
    changed = change(json.loads(last.data or b"{}"))
    if changed is None:
        return None
    headers = {
        Header.ROLLUP.value: MSG_ROLLUP_SUBJECT,
        Headers.EXPECTED_LAST_SUBJECT_SEQUENCE: str(last.seq),
    }
    try:
        await js.publish(subject, json.dumps(changed).encode(), stream=stream, headers=headers)
    except APIError as error:
        if error.err_code == WRONG_LAST_SEQUENCE:
            return None
        raise
    return changed


async def delete_object_if(
    js: JetStreamContext, bucket: str, name: str, condition: Callable[[ObjectMeta], bool]
) -> bool:
    """Delete the object if `condition` holds of its metadata as it is when deleted (not as
    it was when the caller looked); whether it was deleted."""

    def deleted(meta: ObjectMeta) -> ObjectMeta | None:
        if meta.get("deleted") or not condition(meta):
            return None
        # As the object store's own delete leaves it: a marker keeping the name and nuid.
        return {**meta, "deleted": True, "size": 0, "chunks": 0, "digest": "", "mtime": ""}

    marker = await change_object_meta(js, bucket, name, deleted)
    if marker is None:
        return False
    # A crash here leaves the chunks of a deleted object: garbage nobody can read.
    chunks = OBJ_CHUNKS_PRE_TEMPLATE.format(bucket=bucket, obj=marker["nuid"])
    await js.purge_stream(OBJ_STREAM_TEMPLATE.format(bucket=bucket), subject=chunks)
    return True
