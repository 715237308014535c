"""Workspace snapshots in a real JetStream object store: round trips byte for byte, only
changes cost, the size cap, and the events around mutating calls."""

from __future__ import annotations

import hashlib
import os
import stat
import uuid
from pathlib import Path

import pytest
from nats.js import JetStreamContext

from helmline.contracts import (
    CompensationFailed,
    CompensationScheduled,
    Event,
    FileChanges,
    Payload,
    SandboxExecutionRequested,
    WorkspaceSnapshotsPruned,
    WorkspaceSnapshotted,
    new_event,
)
from helmline.runtime import Delivery, EventStore
from helmline.sandbox import SandboxHandler, SandboxSettings, tools_for
from helmline.sandbox._manifests import LISTED_CHANGES, Entry, file_changes, restore_plan
from helmline.sandbox._snapshots import SnapshotMissing, WorkspaceSnapshots


def tree(root: Path) -> dict[str, tuple[str, int, str]]:
    """Every entry under root: kind, permission bits and a content hash (or link target)."""
    found: dict[str, tuple[str, int, str]] = {}
    for folder, folders, files in os.walk(root):
        for name in [*folders, *files]:
            path = Path(folder, name)
            info = path.lstat()
            relative = str(path.relative_to(root))
            if stat.S_ISLNK(info.st_mode):
                found[relative] = ("link", 0, os.readlink(path))
            elif stat.S_ISDIR(info.st_mode):
                found[relative] = ("dir", stat.S_IMODE(info.st_mode), "")
            else:
                digest = hashlib.sha256(path.read_bytes()).hexdigest()
                found[relative] = ("file", stat.S_IMODE(info.st_mode), digest)
    return found


def fill(workspace: Path) -> None:
    (workspace / "src" / "deep" / "er").mkdir(parents=True)
    (workspace / "src" / "deep" / "er" / "notes.txt").write_text("nested\n")
    (workspace / "blob.bin").write_bytes(bytes(range(256)) * 1000)
    (workspace / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (workspace / "run.sh").chmod(0o755)
    (workspace / "empty").mkdir()
    (workspace / "link").symlink_to("src/deep")


def snapshots_for(js: JetStreamContext, max_bytes: int = 1 << 30) -> WorkspaceSnapshots:
    return WorkspaceSnapshots(js, max_bytes=max_bytes)


async def test_restore_gives_back_the_snapshot_byte_for_byte(
    js: JetStreamContext, tmp_path: Path, tenant: str
) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    fill(workspace)
    expected = tree(workspace)
    snapshots = snapshots_for(js)
    taken = await snapshots.take(workspace, tenant, "s1", "snap-1")
    assert taken.refused is None
    assert taken.files == 3
    assert taken.bytes == 256_000 + len("nested\n") + len("#!/bin/sh\necho hi\n")

    # Change everything: contents, modes, deletions, new files and folders, a file for a folder.
    (workspace / "blob.bin").write_bytes(b"\x00garbage")
    (workspace / "run.sh").chmod(0o600)
    (workspace / "src" / "deep" / "er" / "notes.txt").unlink()
    (workspace / "src" / "deep" / "er").rmdir()
    (workspace / "empty").rmdir()
    (workspace / "empty").write_text("now a file")
    (workspace / "new" / "folder").mkdir(parents=True)
    (workspace / "new" / "folder" / "x").write_text("x")
    (workspace / "link").unlink()
    assert tree(workspace) != expected

    # A fresh instance (as after a restart) restores from the object store alone.
    restored = await snapshots_for(js).restore(workspace, tenant, "s1", "snap-1")
    assert restored == taken.manifest
    assert tree(workspace) == expected


async def test_only_changed_files_are_stored_again(
    js: JetStreamContext, tmp_path: Path, tenant: str
) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    for i in range(50):
        (workspace / f"f{i}.txt").write_text(f"{tenant} {i}\n")
    snapshots = snapshots_for(js)
    first = await snapshots.take(workspace, tenant, "s1", "a")
    assert first.uploaded_bytes == first.bytes > 0
    unchanged = await snapshots.take(workspace, tenant, "s1", "b")
    assert unchanged.uploaded_bytes == 0
    assert unchanged.digest == first.digest
    (workspace / "f7.txt").write_text(f"{tenant} changed\n")
    changed = await snapshots.take(workspace, tenant, "s1", "c")
    assert changed.uploaded_bytes == len(f"{tenant} changed\n")
    assert changed.digest != first.digest


async def test_above_the_cap_a_snapshot_is_refused_with_the_reason(
    js: JetStreamContext, tmp_path: Path, tenant: str
) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "big").write_bytes(os.urandom(5000))
    taken = await snapshots_for(js, max_bytes=4096).take(workspace, tenant, "s1", "big")
    assert taken.refused is not None
    assert "5000 new bytes" in taken.refused
    assert "4096" in taken.refused


def test_a_restore_plan_removes_deepest_first_and_creates_parents_first() -> None:
    current = (Entry("a", "dir", 0o755), Entry("a/b", "file", 0o644, 1, "x"))
    target = (Entry("a", "file", 0o644, 1, "y"), Entry("c", "dir", 0o700),
              Entry("c/d", "file", 0o600, 1, "z"))  # fmt: skip
    plan = restore_plan(current, target)
    assert [entry.path for entry in plan.remove] == ["a/b", "a"]
    assert [entry.path for entry in plan.create] == ["a", "c", "c/d"]


async def test_mutating_calls_are_snapshotted_and_reads_are_not(
    js: JetStreamContext, tenant: str, tmp_path: Path
) -> None:
    # Through the handler, with the events it records.
    store = EventStore(js)
    workspaces = tmp_path / "workspaces"
    handler = SandboxHandler(
        store, workspaces, await tools_for(SandboxSettings()), snapshots=snapshots_for(js)
    )
    session = uuid.uuid4().hex

    async def call(tool: str, **arguments: str) -> list[WorkspaceSnapshotted]:
        request = new_event(
            SandboxExecutionRequested(
                call_id=f"c-{uuid.uuid4().hex[:8]}", step_id="s", tool=tool, arguments=arguments
            ),
            tenant=tenant,
            session_id=session,
            source="test",
        )
        await store.append(request)
        await handler(Delivery(request, seq=1, deliveries=1))
        return [
            stored.event.data
            for stored in await store.read_all(tenant, session)
            if isinstance(stored.event.data, WorkspaceSnapshotted)
            and stored.event.causation_id == request.id
        ]

    first = await call("write_file", path="a.txt", content="a")
    assert [(snap.call_id is None, snap.files) for snap in first] == [(True, 0), (False, 1)]
    assert await call("read_file", path="a.txt") == []
    second = await call("run_command", command="echo b > b.txt")
    assert [(snap.call_id is not None, snap.files) for snap in second] == [(True, 2)]
    assert second[0].digest != first[1].digest

    # Each snapshot after a call says what the call changed.
    assert first[0].changes is None
    assert first[1].changes == FileChanges(created=("a.txt",))
    assert second[0].changes == FileChanges(created=("b.txt",))
    [third] = await call("run_command", command="mkdir d && echo x > a.txt && rm b.txt")
    assert third.changes == FileChanges(created=("d/",), modified=("a.txt",), deleted=("b.txt",))
    [fourth] = await call("run_command", command="true")
    assert fourth.changes == FileChanges()


def test_changes_list_the_first_paths_of_each_kind_and_count_the_rest() -> None:
    before = (Entry("gone", "file", 0o644, 1, "g"), Entry("kind", "dir", 0o755),
              Entry("same", "file", 0o644, 1, "s"))  # fmt: skip
    after = (
        Entry("kind", "file", 0o644, 1, "k"),
        Entry("same", "file", 0o600, 1, "s"),
        *(Entry(f"new{i:03}", "file", 0o644, 1, "n") for i in range(LISTED_CHANGES + 5)),
    )
    changes = file_changes(before, after)
    assert changes.created[:2] == ("kind", "new000")
    assert len(changes.created) == LISTED_CHANGES
    assert (changes.modified, changes.deleted) == (("same",), ("gone", "kind/"))
    assert changes.unlisted == 6
    assert changes.total == LISTED_CHANGES + 6 + 3


async def test_pruned_snapshots_are_deleted_and_a_rollback_to_one_fails_as_not_stored(
    js: JetStreamContext, tenant: str, tmp_path: Path
) -> None:
    store = EventStore(js)
    snapshots = snapshots_for(js)
    workspaces = tmp_path / "workspaces"
    handler = SandboxHandler(
        store, workspaces, await tools_for(SandboxSettings()), snapshots=snapshots
    )
    session = uuid.uuid4().hex
    workspace = workspaces / tenant / session
    workspace.mkdir(parents=True)
    (workspace / "a.txt").write_text("a")
    for snapshot in ("s1", "s2"):
        await snapshots.take(workspace, tenant, session, snapshot)

    async def deliver(payload: Payload, deliveries: int = 1) -> Event:
        event = new_event(payload, tenant=tenant, session_id=session, source="test")
        await store.append(event)
        await handler(Delivery(event, seq=1, deliveries=deliveries))
        return event

    pruned = WorkspaceSnapshotsPruned(snapshot_ids=("s1",), reason="a test keeps one")
    await deliver(pruned)
    with pytest.raises(SnapshotMissing):
        await snapshots.manifest(tenant, session, "s1")
    assert await snapshots.manifest(tenant, session, "s2")
    await deliver(pruned, deliveries=2)  # Delivered again: nothing left to delete.

    # A rollback that was under way when the snapshot went fails its restore, saying why.
    compensation = CompensationScheduled(
        rollback_id="r", compensation_id="c", step_id="s", kind="restore_workspace",
        snapshot_id="s1",
    )  # fmt: skip
    cause = await deliver(compensation)
    outcomes = [
        stored.event.data
        for stored in await store.read_all(tenant, session)
        if stored.event.causation_id == cause.id
    ]
    assert [type(outcome) for outcome in outcomes] == [CompensationFailed]
    failed = outcomes[0]
    assert isinstance(failed, CompensationFailed)
    assert failed.error.kind == "not_found"
    assert "snapshot s1 is not in the object store" in failed.error.message
