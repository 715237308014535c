"""Workspace snapshots in the JetStream object store: content-addressed blobs plus one
manifest per snapshot, so that any snapshot restores the workspace byte for byte.

A blob is stored once, whatever the number of snapshots holding it; a file whose size,
mtime and inode have not changed since the last scan is not even read again. Only what
changed costs.

Blobs no snapshot holds any more (their sessions' logs are gone) are deleted by the sweep
(`_sweep.py`) in two steps at least `BLOB_GRACE` apart: first condemned (a header on the
blob), then deleted if still condemned and held by no snapshot. A snapshot takes a blob as
stored only if it is not condemned (else it stores it again, which lifts the condemnation),
trusts that for `VERIFIED_FOR_S` at most, and writes its manifest within `TAKE_LIMIT_S` of
starting: so a manifest holding a blob is written before any sweep that may delete it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import stat
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from cachetools import LRUCache, TTLCache
from nats.js import JetStreamContext
from nats.js.errors import ObjectNotFoundError
from nats.js.object_store import ObjectStore

from helmline.contracts import WORKSPACES_BUCKET
from helmline.runtime import delete_object
from helmline.sandbox._errors import SandboxError
from helmline.sandbox._manifests import (
    Entry,
    Manifest,
    decode_manifest,
    encode_manifest,
    manifest_digest,
    restore_plan,
)

_CHUNK = 1 << 20
_CACHED_WORKSPACES = 1_000
_KNOWN_BLOBS = 1_000_000
BLOB_GRACE = timedelta(hours=1)
"""Least time between a blob's condemnation and its deletion."""
VERIFIED_FOR_S = 600.0
"""How long a snapshot takes a blob it found stored (or stored) as stored without looking."""
TAKE_LIMIT_S = BLOB_GRACE.total_seconds() - 2 * VERIFIED_FOR_S
"""Longest a snapshot may take from its start to its manifest (else it is refused)."""
CONDEMNED = "Helmline-Condemned-At"
"""The header of a blob condemned by a sweep: when, in ISO 8601."""
BLOBS = "blobs/"
MANIFESTS = "manifests/"
Fingerprint = tuple[int, int, int, int]
"""(size, mtime_ns, inode, ctime_ns): when equal, the content is taken to be unchanged."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A stored (or refused) snapshot."""

    snapshot_id: str
    manifest: Manifest
    digest: str
    files: int
    bytes: int
    uploaded_bytes: int
    """Bytes of blobs this snapshot had to store (the rest were stored before)."""
    refused: str | None = None
    """Why its blobs were not stored (above the size cap): it cannot be restored."""


class SnapshotMissing(SandboxError):
    """A manifest or blob that should be in the object store is not there."""


class HashCache:
    """Content hashes of a workspace's files by fingerprint, from earlier scans."""

    def __init__(self) -> None:
        self._hashes: dict[str, tuple[Fingerprint, str]] = {}

    def hash_of(self, path: str, absolute: str, fingerprint: Fingerprint) -> str:
        known = self._hashes.get(path)
        if known is not None and known[0] == fingerprint:
            return known[1]
        digest = _hash_file(absolute)
        self._hashes[path] = (fingerprint, digest)
        return digest


def scan(workspace: Path, cache: HashCache) -> Manifest:
    """The workspace's entries now. Blocking."""
    entries: list[Entry] = []
    root = str(workspace)
    for folder, folders, files in os.walk(root):
        for name in [*folders, *files]:
            absolute = os.path.join(folder, name)
            relative = os.path.relpath(absolute, root)
            info = os.lstat(absolute)
            mode = stat.S_IMODE(info.st_mode)
            if stat.S_ISLNK(info.st_mode):
                entries.append(Entry(relative, "link", 0, 0, os.readlink(absolute)))
            elif stat.S_ISDIR(info.st_mode):
                entries.append(Entry(relative, "dir", mode))
            elif stat.S_ISREG(info.st_mode):
                fingerprint = (info.st_size, info.st_mtime_ns, info.st_ino, info.st_ctime_ns)
                digest = cache.hash_of(relative, absolute, fingerprint)
                entries.append(Entry(relative, "file", mode, info.st_size, digest))
            # Sockets, fifos and devices are not content: left out.
    entries.sort(key=lambda entry: entry.path)
    return tuple(entries)


def _hash_file(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def blob_name(sha256: str) -> str:
    return f"{BLOBS}{sha256}"


def _manifest_name(tenant: str, session_id: str, snapshot_id: str) -> str:
    return f"{MANIFESTS}{tenant}/{session_id}/{snapshot_id}"


def condemned_at(headers: Mapping[str, str | Sequence[str]] | None) -> datetime | None:
    """When a sweep condemned the blob with these headers; None if it is not condemned."""
    value = (headers or {}).get(CONDEMNED)
    if not value:
        return None
    return datetime.fromisoformat(value if isinstance(value, str) else value[0])


class WorkspaceSnapshots:
    """Takes and restores snapshots of session workspaces."""

    def __init__(self, js: JetStreamContext, *, max_bytes: int) -> None:
        self._js = js
        self._max_bytes = max_bytes
        self._store: ObjectStore | None = None
        # Both only spare work (an object store lookup, reading a file), so forgetting is
        # safe: they are bounded rather than kept for every workspace ever seen. Stored
        # blobs are trusted for a while only, for the sweep (see the module's docstring).
        self._stored_blobs: TTLCache[str, None] = TTLCache(_KNOWN_BLOBS, ttl=VERIFIED_FOR_S)
        self._caches: LRUCache[Path, HashCache] = LRUCache(_CACHED_WORKSPACES)

    async def _bucket(self) -> ObjectStore:
        if self._store is None:
            self._store = await self._js.object_store(WORKSPACES_BUCKET.bucket)
        return self._store

    def forget(self, workspace: Path) -> None:
        """Drop what is known of a removed workspace's files."""
        self._caches.pop(workspace, None)

    def _cache_of(self, workspace: Path) -> HashCache:
        cache = self._caches.get(workspace)
        if cache is None:
            cache = self._caches[workspace] = HashCache()
        return cache

    async def scan(self, workspace: Path) -> Manifest:
        """What the workspace holds now (nothing if it does not exist yet), stored nowhere."""
        if not await asyncio.to_thread(workspace.is_dir):
            return ()
        return await asyncio.to_thread(scan, workspace, self._cache_of(workspace))

    async def take(
        self, workspace: Path, tenant: str, session_id: str, snapshot_id: str
    ) -> Snapshot:
        """Snapshot the workspace (empty if it does not exist yet) under `snapshot_id`.

        When the blobs it would add come to more than the size cap, nothing is stored and
        the snapshot says why.
        """
        started = time.monotonic()
        manifest = await self.scan(workspace)
        files = [entry for entry in manifest if entry.kind == "file"]
        bucket = await self._bucket()
        missing: dict[str, Entry] = {}
        for entry in files:
            if entry.sha256 not in self._stored_blobs and entry.sha256 not in missing:
                if await _stored_and_kept(bucket, blob_name(entry.sha256)):
                    self._stored_blobs[entry.sha256] = None
                else:
                    missing[entry.sha256] = entry
        uploading = sum(entry.size for entry in missing.values())
        snapshot = Snapshot(
            snapshot_id=snapshot_id,
            manifest=manifest,
            digest=manifest_digest(manifest),
            files=len(files),
            bytes=sum(entry.size for entry in files),
            uploaded_bytes=0,
        )
        if uploading > self._max_bytes:
            return _refused(
                snapshot,
                f"the snapshot would store {uploading} new bytes, above the cap of "
                f"{self._max_bytes}",
            )
        for sha256, entry in missing.items():
            data = await asyncio.to_thread(_read, workspace / entry.path)
            if hashlib.sha256(data).hexdigest() != sha256:
                # Changed since the scan (a command still writing): the manifest would lie.
                return _refused(
                    snapshot, f"file {entry.path!r} changed while it was being snapshotted"
                )
            await bucket.put(blob_name(sha256), data)
            self._stored_blobs[sha256] = None
        if time.monotonic() - started > TAKE_LIMIT_S:
            # A sweep may have deleted blobs it found stored at its start.
            return _refused(snapshot, f"the snapshot took longer than {TAKE_LIMIT_S:.0f} s")
        await bucket.put(_manifest_name(tenant, session_id, snapshot_id), encode_manifest(manifest))
        return Snapshot(
            snapshot.snapshot_id,
            manifest,
            snapshot.digest,
            snapshot.files,
            snapshot.bytes,
            uploaded_bytes=uploading,
        )

    async def restore(
        self, workspace: Path, tenant: str, session_id: str, snapshot_id: str
    ) -> Manifest:
        """Make the workspace hold exactly what the snapshot held; its manifest.

        Into a folder that does not exist yet, this exports the snapshot."""
        target = await self.manifest(tenant, session_id, snapshot_id)
        await asyncio.to_thread(workspace.mkdir, parents=True, exist_ok=True)
        cache = self._cache_of(workspace)
        current = await asyncio.to_thread(scan, workspace, cache)
        plan = restore_plan(current, target)
        owner = (await asyncio.to_thread(workspace.stat)).st_uid
        for entry in plan.remove:
            await asyncio.to_thread(_remove, workspace / entry.path)
        for entry in plan.create:
            data = b""
            if entry.kind == "file":
                data = await self.blob(entry.sha256)
            await asyncio.to_thread(_create, workspace / entry.path, entry, data, owner)
        return target

    async def drop(self, tenant: str, session_id: str, snapshot_ids: Sequence[str]) -> int:
        """Delete snapshots' manifests (a sweep deletes their blobs once no manifest holds
        them); how many were still stored."""
        dropped = 0
        for snapshot_id in snapshot_ids:
            name = _manifest_name(tenant, session_id, snapshot_id)
            dropped += await delete_object(self._js, WORKSPACES_BUCKET.bucket, name)
        return dropped

    async def manifest(self, tenant: str, session_id: str, snapshot_id: str) -> Manifest:
        """What a stored snapshot holds; raises `SnapshotMissing` if it was never stored."""
        name = _manifest_name(tenant, session_id, snapshot_id)
        return decode_manifest(await self._get(name, f"snapshot {snapshot_id}"))

    async def blob(self, sha256: str) -> bytes:
        """A stored file's content by its hash; raises `SnapshotMissing` if not stored."""
        return await self._get(blob_name(sha256), f"the content {sha256}")

    async def _get(self, name: str, what: str) -> bytes:
        bucket = await self._bucket()
        try:
            stored = await bucket.get(name)
        except ObjectNotFoundError as error:
            raise SnapshotMissing(f"{what} is not in the object store") from error
        return stored.data or b""


def _refused(snapshot: Snapshot, reason: str) -> Snapshot:
    return Snapshot(
        snapshot.snapshot_id,
        snapshot.manifest,
        snapshot.digest,
        snapshot.files,
        snapshot.bytes,
        uploaded_bytes=0,
        refused=reason,
    )


async def _stored_and_kept(bucket: ObjectStore, name: str) -> bool:
    """Whether the blob is stored and not condemned by a sweep."""
    try:
        info = await bucket.get_info(name)
    except ObjectNotFoundError:
        return False
    return condemned_at(info.headers) is None


def _read(path: Path) -> bytes:
    with open(path, "rb") as file:
        return file.read()


def _remove(path: Path) -> None:
    info = os.lstat(path)
    if stat.S_ISDIR(info.st_mode):
        # Its contents were removed first (deepest first), unless they were not content.
        for child in os.listdir(path):
            _remove(path / child)
        os.rmdir(path)
    else:
        os.unlink(path)


def _create(path: Path, entry: Entry, data: bytes, owner: int) -> None:
    match entry.kind:
        case "dir":
            with contextlib.suppress(FileExistsError):
                os.mkdir(path)
            os.chmod(path, entry.mode)
        case "link":
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            os.symlink(entry.sha256, path)
        case "file":
            # Written beside, then renamed: a restore cut short never leaves half a file.
            partial = path.with_name(f".{path.name}.restoring")
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fchmod(fd, entry.mode)
            finally:
                os.close(fd)
            os.rename(partial, path)
    if os.geteuid() == 0 and owner != 0:
        os.lchown(path, owner, owner)
