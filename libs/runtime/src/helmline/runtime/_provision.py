"""Create or update streams and buckets from the contracts' definitions, idempotently."""

from __future__ import annotations

from collections.abc import Sequence

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
from helmline.runtime._durability import (
    DurabilityFindings,
    durability_findings,
    refuse_unaccepted,
)
from helmline.runtime._nats_client import connect_nats
from helmline.runtime._settings import nats_servers

STREAM_NAME_IN_USE = 10058


def stream_config(spec: StreamSpec, replicas: int = 1) -> StreamConfig:
    """The JetStream configuration of a stream definition, kept on `replicas` servers."""
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
        num_replicas=replicas,
        allow_atomic=spec.atomic_batches,
    )


async def ensure_topology(
    js: JetStreamContext,
    *,
    events_max_age_s: float | None = None,
    events_max_bytes: int | None = None,
    replicas: int = 1,
) -> None:
    """Make every stream, key-value bucket and object store exist as the contracts define,
    the events stream with the retention limits given (none: it keeps everything), each
    kept on `replicas` servers of the cluster (3 in production: docs/durability.md).

    Lowering a limit removes at once the events beyond it: export them first."""
    limits = {"max_age_s": events_max_age_s, "max_bytes": events_max_bytes}
    for spec in STREAMS:
        if spec.name == EVENTS_STREAM.name:
            spec = spec.model_copy(update=limits)
        config = stream_config(spec, replicas)
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
                    replicas=replicas,
                )
            )
    for store in OBJECT_STORES:
        try:
            await js.object_store(store.bucket)
        except NotFoundError:
            await js.create_object_store(
                store.bucket,
                ObjectStoreConfig(
                    bucket=store.bucket, description=store.description, replicas=replicas
                ),
            )


async def provision(
    nats_url: str,
    *,
    replicas: int = 1,
    monitor_urls: Sequence[str] = (),
    accept_relaxed: bool = False,
    accept_single_replica: bool = False,
) -> DurabilityFindings:
    """Connect to NATS, ensure the topology, check what can be seen of its durability, and
    disconnect (for `helmline up` and deploy jobs).

    Raises `DurabilityRefused` when the streams or servers acknowledge appends before they
    are safe and the caller did not accept that by name."""
    connection = await connect_nats(nats_servers(nats_url), name="helmline-provision")
    try:
        js = connection.jetstream()
        await ensure_topology(js, replicas=replicas)
        findings = await durability_findings(js, monitor_urls)
    finally:
        await connection.close()
    refuse_unaccepted(
        findings, accept_relaxed=accept_relaxed, accept_single_replica=accept_single_replica
    )
    return findings
