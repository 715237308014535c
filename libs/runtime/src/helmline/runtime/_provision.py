"""Create or update streams and buckets from the contracts' definitions, idempotently."""

from __future__ import annotations

import nats
from nats.js import JetStreamContext
from nats.js.api import (
    DiscardPolicy,
    KeyValueConfig,
    ObjectStoreConfig,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.errors import BadRequestError, NotFoundError

from helmline.contracts import (
    EVENTS_STREAM,
    KEY_VALUE_BUCKETS,
    OBJECT_STORES,
    STREAMS,
    StreamSpec,
)

STREAM_NAME_IN_USE = 10058


def stream_config(spec: StreamSpec) -> StreamConfig:
    """The JetStream configuration of a stream definition."""
    return StreamConfig(
        name=spec.name,
        description=spec.description,
        subjects=list(spec.subjects),
        retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE,
        discard=DiscardPolicy.OLD,
        max_age=spec.max_age_s or 0,
        max_bytes=spec.max_bytes,
        max_msg_size=spec.max_msg_size,
        duplicate_window=spec.duplicate_window_s,
        deny_delete=spec.append_only,
        deny_purge=spec.append_only,
        allow_direct=True,
    )


async def ensure_topology(
    js: JetStreamContext,
    *,
    events_max_age_s: float | None = None,
    events_max_bytes: int | None = None,
) -> None:
    """Make every stream, key-value bucket and object store exist as the contracts define,
    the events stream with the retention limits given (none: it keeps everything).

    Lowering a limit removes at once the events beyond it: export them first."""
    limits = {"max_age_s": events_max_age_s, "max_bytes": events_max_bytes}
    for spec in STREAMS:
        if spec.name == EVENTS_STREAM.name:
            spec = spec.model_copy(update=limits)
        config = stream_config(spec)
        try:
            await js.add_stream(config)
        except BadRequestError as error:
            if error.err_code != STREAM_NAME_IN_USE:
                raise
            await js.update_stream(config)
    for bucket in KEY_VALUE_BUCKETS:
        try:
            await js.key_value(bucket.bucket)
        except NotFoundError:
            await js.create_key_value(
                KeyValueConfig(
                    bucket=bucket.bucket,
                    description=bucket.description,
                    history=bucket.history,
                    ttl=bucket.ttl_s,
                )
            )
    for store in OBJECT_STORES:
        try:
            await js.object_store(store.bucket)
        except NotFoundError:
            await js.create_object_store(
                store.bucket, ObjectStoreConfig(bucket=store.bucket, description=store.description)
            )


async def provision(nats_url: str) -> None:
    """Connect to NATS, ensure the topology, and disconnect (for `helmline up` and deploy jobs)."""
    connection = await nats.connect(nats_url, name="helmline-provision")
    try:
        await ensure_topology(connection.jetstream())
    finally:
        await connection.close()
