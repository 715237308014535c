"""What the sandbox keeps of a session is swept once retention removed the session's events:
in the workspaces' object store, its snapshots go, then the blobs no snapshot holds, never one
a snapshot still holds or has just stored again, and what goes leaves nothing in the bucket's
stream; on the sandbox's disk, its workspace folder and marker go."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from nats.js import JetStreamContext
from nats.js.errors import ObjectNotFoundError

from helmline.contracts import WORKSPACES_BUCKET, Event
from helmline.runtime import EventStore, change_object_meta
from helmline.runtime.testing import push_out, remains_of, session_started
from helmline.sandbox._paths import workspace_of
from helmline.sandbox._reclaim import (
    OWNED_STAMP,
    marker_of,
    own_workspaces_dir,
    sweep_workspace_folders,
)
from helmline.sandbox._snapshots import (
    BLOB_GRACE,
    CONDEMNED,
    SnapshotMissing,
    WorkspaceSnapshots,
    blob_name,
    condemned_at,
)
from helmline.sandbox._sweep import WorkspaceSweep

SHARED, ONLY_GONE, ONLY_KEPT = b"in both sessions\n", b"only the gone one\n", b"only the kept one\n"
BoundedLog = tuple[str, JetStreamContext, EventStore]


class Clock:
    def __init__(self) -> None:
        self.now = datetime.now(UTC)

    def __call__(self) -> datetime:
        return self.now


def blob_of(content: bytes) -> str:
    return blob_name(hashlib.sha256(content).hexdigest())


def write_files(workspace: Path, files: dict[str, bytes]) -> None:
    workspace.mkdir()
    for name, content in files.items():
        (workspace / name).write_bytes(content)


async def snapshot_of(
    js: JetStreamContext, workspace: Path, started: Event, files: dict[str, bytes]
) -> None:
    write_files(workspace, files)
    taken = await WorkspaceSnapshots(js, max_bytes=1 << 20).take(
        workspace, started.tenant, started.session_id, "snap-1"
    )
    assert taken.refused is None


async def condemnation(js: JetStreamContext, content: bytes) -> datetime | None:
    bucket = await js.object_store(WORKSPACES_BUCKET.bucket)
    return condemned_at((await bucket.get_info(blob_of(content))).headers)


@pytest.fixture
async def one_session_gone(
    bounded_log: BoundedLog, tenant: str, tmp_path: Path
) -> tuple[JetStreamContext, EventStore, Event, Event]:
    """Two sessions with a snapshot each, sharing a file; the first's events pushed out of
    the log. The starts of both."""
    _, js, store = bounded_log
    gone, kept = session_started(tenant), session_started(tenant)
    for session in (gone, kept):
        await store.append(session)
    await snapshot_of(js, tmp_path / "gone", gone, {"shared": SHARED, "mine": ONLY_GONE})
    await snapshot_of(js, tmp_path / "kept", kept, {"shared": SHARED, "mine": ONLY_KEPT})
    await push_out(store, gone, kept)
    return js, store, gone, kept


async def test_a_gone_sessions_snapshots_go_then_after_the_grace_the_blobs_only_they_held(
    one_session_gone: tuple[JetStreamContext, EventStore, Event, Event], tmp_path: Path
) -> None:
    js, store, gone, kept = one_session_gone
    clock = Clock()
    sweep = WorkspaceSweep(js, store, clock=clock)
    snapshots = WorkspaceSnapshots(js, max_bytes=1 << 20)
    bucket = await js.object_store(WORKSPACES_BUCKET.bucket)
    only_gones = [
        info
        for info in await bucket.list()
        if gone.session_id in info.name or info.name == blob_of(ONLY_GONE)
    ]
    assert len(only_gones) == 2  # Its manifest and the blob only it held.

    assert await sweep() == 1  # The gone session's manifest.
    with pytest.raises(SnapshotMissing):
        await snapshots.manifest(gone.tenant, gone.session_id, "snap-1")
    assert await condemnation(js, ONLY_GONE) == clock.now
    assert await condemnation(js, SHARED) is None
    assert await condemnation(js, ONLY_KEPT) is None

    clock.now += BLOB_GRACE - timedelta(seconds=1)
    assert await sweep() == 0  # Condemned, but not long enough.
    clock.now += timedelta(seconds=1)
    assert await sweep() == 1

    with pytest.raises(ObjectNotFoundError):
        await bucket.get_info(blob_of(ONLY_GONE))
    assert await remains_of(js, WORKSPACES_BUCKET.bucket, only_gones) == 0
    restored = tmp_path / "restored"
    await snapshots.restore(restored, kept.tenant, kept.session_id, "snap-1")
    assert (restored / "shared").read_bytes() == SHARED
    assert (restored / "mine").read_bytes() == ONLY_KEPT


async def test_a_condemned_blob_a_new_snapshot_holds_is_stored_again_and_kept(
    one_session_gone: tuple[JetStreamContext, EventStore, Event, Event], tmp_path: Path
) -> None:
    js, store, _, kept = one_session_gone
    clock = Clock()
    sweep = WorkspaceSweep(js, store, clock=clock)
    await sweep()
    assert await condemnation(js, ONLY_GONE) is not None

    # A new session writes what only the gone one held; its snapshot stores it again.
    newer = session_started(kept.tenant)
    await store.append(newer)
    workspace = tmp_path / "newer"
    write_files(workspace, {"again": ONLY_GONE})
    snapshots = WorkspaceSnapshots(js, max_bytes=1 << 20)
    taken = await snapshots.take(workspace, newer.tenant, newer.session_id, "snap-1")
    assert taken.uploaded_bytes == len(ONLY_GONE)
    assert await condemnation(js, ONLY_GONE) is None

    clock.now += BLOB_GRACE
    assert await sweep() == 0
    restored = tmp_path / "restored"
    await snapshots.restore(restored, newer.tenant, newer.session_id, "snap-1")
    assert (restored / "again").read_bytes() == ONLY_GONE


async def test_a_condemned_blob_a_snapshot_holds_is_pardoned(
    bounded_log: BoundedLog, tenant: str, tmp_path: Path
) -> None:
    _, js, store = bounded_log
    live = session_started(tenant)
    await store.append(live)
    await snapshot_of(js, tmp_path / "live", live, {"mine": ONLY_KEPT})
    # Condemned by a sweep that listed the bucket before the snapshot was written.
    earlier = datetime.now(UTC) - BLOB_GRACE

    def condemned(meta: dict[str, object]) -> dict[str, object]:
        return {**meta, "headers": {CONDEMNED: [earlier.isoformat()]}}

    changed = await change_object_meta(js, WORKSPACES_BUCKET.bucket, blob_of(ONLY_KEPT), condemned)
    assert changed is not None

    assert await WorkspaceSweep(js, store)() == 0
    assert await condemnation(js, ONLY_KEPT) is None


async def test_the_folders_and_markers_of_sessions_gone_leave_the_disk_but_one_running_a_call(
    bounded_log: BoundedLog, tenant: str, tmp_path: Path
) -> None:
    _, _, store = bounded_log
    root = tmp_path / "workspaces"
    own_workspaces_dir(root)
    gone, running, kept = (session_started(tenant) for _ in range(3))
    (root / tenant).mkdir()
    for session in (gone, running, kept):
        await store.append(session)
        write_files(workspace_of(root, tenant, session.session_id), {"f": b"x"})
    gone_workspace = workspace_of(root, tenant, gone.session_id)
    (gone_workspace / "sub").mkdir()
    (gone_workspace / "sub" / "g").write_bytes(b"y")
    # A reclaim cut short: its marker written, and another half written beside it.
    marker_of(gone_workspace).write_text("snap-1")
    gone_workspace.with_name(f"{gone.session_id}.reclaimed.new").write_text("snap-")
    half_removed = root / tenant / f".removing-{kept.session_id}.abc"
    half_removed.mkdir()
    await push_out(store, gone, kept)
    await push_out(store, running, kept)

    def runs_a_call(tenant: str, session_id: str) -> bool:
        return session_id == running.session_id

    assert await sweep_workspace_folders(store, root, runs_a_call) == 1

    left = {path.name for path in (root / tenant).iterdir()}
    assert left == {running.session_id, kept.session_id, half_removed.name}
    assert await sweep_workspace_folders(store, root, lambda *_: False) == 1
    assert {path.name for path in (root / tenant).iterdir()} == {
        kept.session_id,
        half_removed.name,
    }


async def test_a_root_the_sandbox_did_not_make_is_never_swept(
    bounded_log: BoundedLog, tenant: str, tmp_path: Path
) -> None:
    _, _, store = bounded_log
    root = tmp_path / "shared"
    (root / "notes" / "todo").mkdir(parents=True)  # Looks like a tenant's session.
    own_workspaces_dir(root)

    assert await sweep_workspace_folders(store, root, lambda *_: False) == 0

    assert (root / "notes" / "todo").is_dir()
    assert not (root / OWNED_STAMP).exists()
