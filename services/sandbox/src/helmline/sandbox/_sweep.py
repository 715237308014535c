"""The workspace snapshots' sweep: the manifests of sessions the log no longer holds go,
then the blobs no manifest holds any more, in two steps (see `_snapshots.py`)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from nats.js import JetStreamContext
from nats.js.errors import ObjectNotFoundError
from nats.js.object_store import ObjectStore

from helmline.contracts import WORKSPACES_BUCKET
from helmline.runtime import (
    EventStore,
    ObjectMeta,
    change_object_meta,
    delete_object,
    delete_object_if,
    live_objects,
    sessions_gone,
)
from helmline.sandbox._manifests import decode_manifest
from helmline.sandbox._snapshots import BLOB_GRACE, BLOBS, CONDEMNED, MANIFESTS, condemned_at


class WorkspaceSweep:
    """One sweep of the workspaces' object store per call; how many objects it deleted.

    A blob no manifest holds is condemned; at a later sweep, once condemned `grace` ago
    and still held by none, it is deleted; held again meanwhile, it is pardoned. Each of
    those is written only over the blob's metadata as the sweep read it, so a snapshot
    storing the blob again at the same moment wins. Replicas may sweep at the same time."""

    def __init__(
        self,
        js: JetStreamContext,
        store: EventStore,
        *,
        grace: timedelta = BLOB_GRACE,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._js = js
        self._store = store
        self._grace = grace
        self._clock = clock
        # The blobs each manifest holds, by name and nuid (a manifest never changes), so
        # that a sweep reads only the manifests written since the one before.
        self._held_by: dict[tuple[str, str], frozenset[str]] = {}

    async def __call__(self) -> int:
        # Taken before listing: a manifest written before it is listed.
        now = self._clock()
        stored = await live_objects(self._js, WORKSPACES_BUCKET.bucket)
        manifests: dict[tuple[str, str], list[tuple[str, str]]] = {}
        blobs: dict[str, dict[str, list[str]] | None] = {}
        for info in stored:
            if info.name.startswith(MANIFESTS):
                tenant, session_id, _ = info.name.removeprefix(MANIFESTS).split("/", 2)
                manifests.setdefault((tenant, session_id), []).append((info.name, info.nuid))
            elif info.name.startswith(BLOBS):
                blobs[info.name] = info.headers
        swept = 0
        for session in await sessions_gone(self._store, manifests):
            for name, _ in manifests.pop(session):
                swept += await delete_object(self._js, WORKSPACES_BUCKET.bucket, name)
        bucket = await self._js.object_store(WORKSPACES_BUCKET.bucket)
        held = await self._blobs_held(bucket, [m for ms in manifests.values() for m in ms])
        for name, headers in blobs.items():
            if name.removeprefix(BLOBS) in held:
                if condemned_at(headers) is not None:
                    await change_object_meta(self._js, WORKSPACES_BUCKET.bucket, name, _pardoned)
            elif condemned_at(headers) is None:
                condemn = _condemned(now)
                await change_object_meta(self._js, WORKSPACES_BUCKET.bucket, name, condemn)
            elif await delete_object_if(
                self._js, WORKSPACES_BUCKET.bucket, name, _condemned_before(now - self._grace)
            ):
                swept += 1
        return swept

    async def _blobs_held(self, bucket: ObjectStore, manifests: list[tuple[str, str]]) -> set[str]:
        held_by = {}
        for manifest in manifests:
            hashes = self._held_by.get(manifest)
            if hashes is None:
                try:
                    stored = await bucket.get(manifest[0])
                except ObjectNotFoundError:
                    continue  # Deleted since it was listed: it holds nothing.
                entries = decode_manifest(stored.data or b"")
                hashes = frozenset(entry.sha256 for entry in entries if entry.kind == "file")
            held_by[manifest] = hashes
        self._held_by = held_by
        return set().union(*held_by.values())


def _condemned(now: datetime) -> Callable[[ObjectMeta], ObjectMeta | None]:
    def condemn(meta: ObjectMeta) -> ObjectMeta | None:
        if meta.get("deleted") or condemned_at(meta.get("headers")) is not None:
            return None
        return {**meta, "headers": {**(meta.get("headers") or {}), CONDEMNED: [now.isoformat()]}}

    return condemn


def _pardoned(meta: ObjectMeta) -> ObjectMeta | None:
    headers = meta.get("headers") or {}
    if meta.get("deleted") or CONDEMNED not in headers:
        return None
    return {**meta, "headers": {k: v for k, v in headers.items() if k != CONDEMNED}}


def _condemned_before(cutoff: datetime) -> Callable[[ObjectMeta], bool]:
    def due(meta: ObjectMeta) -> bool:
        condemned = condemned_at(meta.get("headers"))
        return condemned is not None and condemned <= cutoff

    return due
