"""Reclaiming the sandbox's disk: once a session has ended and its latest snapshot holds its
workspace, the workspace folder is removed, and a marker beside it names that snapshot. A
call the session runs later (a rollback reopens a session) puts the folder back from the
snapshot first, so nothing a session made is lost; people read workspaces from the
snapshots anyway (`helmline workspace`).

Crash-safe in this order: the marker is written, the folder is renamed out of the way in one
step, then deleted. A crash leaves the folder (and perhaps its marker, which a folder
overrides), reclaimed when the session's end is delivered again; or the marker and a renamed
folder, which the next start deletes.

With the log's retention limits set, a sweep also removes the folders and markers of
sessions of which the log holds nothing any more (`sweep_workspace_folders`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import uuid
import weakref
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from helmline.contracts import Event, SessionState
from helmline.runtime import Deferred, EventStore, sessions_gone
from helmline.sandbox._snapshots import WorkspaceSnapshots

logger = logging.getLogger(__name__)

MARKER_SUFFIX = ".reclaimed"
"""`<session_id>.reclaimed` beside a reclaimed workspace holds the snapshot to restore; no
session id contains a dot, so it never names a workspace."""
REMOVING_PREFIX = ".removing-"
"""A workspace renamed to `.removing-<session_id>.<random>` is being deleted."""
OWNED_STAMP = ".helmline-workspaces"
"""A file in the workspaces' root saying the sandbox made it. Only such a root is swept, so
that a root set by mistake to a folder holding anything else never loses a thing."""
CALLS_FINISHING_WAIT = timedelta(seconds=5)
"""How long to wait before looking again at a session whose calls are still finishing (a
cancelled session's command being killed, then snapshotted)."""
CALLS_FINISHING_LOOKS = 12
"""How often to look before keeping the workspace (a call that never finishes)."""
_UNFINISHED = frozenset({"authorized", "running"})


@dataclass(frozen=True, slots=True)
class Reclaim:
    """Remove the workspace: `snapshot_id` holds it."""

    snapshot_id: str


@dataclass(frozen=True, slots=True)
class Keep:
    """Leave the workspace where it is, for this reason."""

    reason: str


@dataclass(frozen=True, slots=True)
class Wait:
    """Look again later: a call of the session is still finishing."""

    what: str


def reclaim_decision(state: SessionState) -> Reclaim | Keep | Wait:
    """Whether an ended session's workspace may leave the sandbox's disk. Pure."""
    if not state.is_terminal:
        return Keep("the session was reopened")
    if any(rollback.active for rollback in state.rollbacks.values()):
        return Keep("a rollback is under way")
    finishing = [step.id for step in state.steps.values() if step.status in _UNFINISHED]
    if finishing:
        return Wait(f"step {finishing[0]}")
    snapshot = state.latest_snapshot_id
    if snapshot is None:
        return Keep("no snapshot holds the workspace")
    if snapshot in state.unrestorable_snapshots:
        why = state.unrestorable_snapshots[snapshot]
        return Keep(f"its latest snapshot {snapshot} was not stored: {why}")
    return Reclaim(snapshot)


def marker_of(workspace: Path) -> Path:
    """The marker a reclaimed workspace leaves beside it."""
    return workspace.with_name(workspace.name + MARKER_SUFFIX)


class WorkspaceReclaimer:
    """Removes ended sessions' workspaces from the sandbox's disk and puts them back when
    a session runs a call again."""

    def __init__(
        self,
        store: EventStore,
        snapshots: WorkspaceSnapshots,
        runs_a_call: Callable[[str, str], bool],
    ) -> None:
        """`runs_a_call(tenant, session_id)`: whether this process runs a call of the
        session now (the log may not show it started yet)."""
        self._store = store
        self._snapshots = snapshots
        self._runs_a_call = runs_a_call
        # Parallel calls of a reopened session wait for one restore.
        self._putting_back: dict[Path, asyncio.Task[None]] = {}
        # A lock lives while someone holds or waits for it.
        self._locks: weakref.WeakValueDictionary[Path, asyncio.Lock] = weakref.WeakValueDictionary()

    @contextlib.asynccontextmanager
    async def holding(self, workspace: Path) -> AsyncIterator[None]:
        """Hold the workspace against a reclaim: while a rollback or a fork restores it
        (which may reopen the session the reclaim found ended)."""
        lock = self._locks.get(workspace)
        if lock is None:
            lock = self._locks[workspace] = asyncio.Lock()
        async with lock:
            yield

    async def reclaim(self, ended: Event, workspace: Path, deliveries: int) -> None:
        """Remove an ended session's workspace if its latest snapshot holds it; raise
        `Deferred` while a call of the session is still finishing."""
        async with self.holding(workspace):
            await self._reclaim(ended, workspace, deliveries)

    async def _reclaim(self, ended: Event, workspace: Path, deliveries: int) -> None:
        tenant, session_id = ended.tenant, ended.session_id
        state = (await self._store.load(tenant, session_id)).state
        decision = reclaim_decision(state)
        if isinstance(decision, Reclaim) and self._runs_a_call(tenant, session_id):
            decision = Wait("a call starting here")
        if isinstance(decision, Wait) and deliveries < CALLS_FINISHING_LOOKS:
            raise Deferred(
                datetime.now(UTC) + CALLS_FINISHING_WAIT,
                f"{decision.what} of the ended session is still finishing",
            )
        if not isinstance(decision, Reclaim):
            logger.info("keeping the workspace of %s/%s: %s", tenant, session_id, decision)
            return
        await asyncio.to_thread(_write_durably, marker_of(workspace), decision.snapshot_id)
        removing = self._move_aside(workspace, tenant, session_id)
        if removing is None:
            return
        self._snapshots.forget(workspace)
        await asyncio.to_thread(shutil.rmtree, removing)
        logger.info("reclaimed the workspace of %s/%s", tenant, session_id)

    def _move_aside(self, workspace: Path, tenant: str, session_id: str) -> Path | None:
        """Rename the workspace out of the way unless a call of the session started here
        meanwhile (then drop the marker); where it went. Not async on purpose: nothing
        else runs between the check and the rename, so no call starts in a folder going."""
        if self._runs_a_call(tenant, session_id):
            marker_of(workspace).unlink(missing_ok=True)
            return None
        if not workspace.is_dir():
            return None  # Gone already (a reclaim cut short): the marker says from where.
        return _renamed_aside(workspace)

    async def put_back(self, workspace: Path, tenant: str, session_id: str) -> None:
        """Before a call runs: a reclaimed workspace is restored from its snapshot (raises
        `SnapshotMissing` when that snapshot is no longer stored)."""
        putting_back = self._putting_back.get(workspace)
        if putting_back is None:
            if not _reclaimed(workspace):
                return
            putting_back = asyncio.create_task(self._restore(workspace, tenant, session_id))
            self._putting_back[workspace] = putting_back
            putting_back.add_done_callback(lambda _: self._putting_back.pop(workspace, None))
        await asyncio.shield(putting_back)

    async def _restore(self, workspace: Path, tenant: str, session_id: str) -> None:
        marker = marker_of(workspace)
        snapshot_id = (await asyncio.to_thread(marker.read_text)).strip()
        await self._snapshots.restore(workspace, tenant, session_id, snapshot_id)
        marker.unlink()
        logger.info("put back the workspace of %s/%s from %s", tenant, session_id, snapshot_id)


def _reclaimed(workspace: Path) -> bool:
    # Two stats before every call, in the loop: a thread hop would cost more than both.
    return not workspace.is_dir() and marker_of(workspace).exists()


def _write_durably(path: Path, text: str) -> None:
    """Write a small file whole or not at all, and on the disk before returning."""
    partial = path.with_name(path.name + ".new")
    with open(partial, "w") as written:
        written.write(text)
        written.flush()
        os.fsync(written.fileno())
    os.replace(partial, path)


def _renamed_aside(workspace: Path) -> Path:
    """Rename a workspace to be deleted out of the way, in one step; where it went."""
    # A name of its own: what an earlier removal failed to delete is not in the way.
    removing = workspace.with_name(f"{REMOVING_PREFIX}{workspace.name}.{uuid.uuid4().hex}")
    workspace.rename(removing)
    return removing


def own_workspaces_dir(workspaces_dir: Path) -> None:
    """Stamp the workspaces' root as the sandbox's if it is new: missing, or empty but for
    the `lost+found` of a new volume."""
    workspaces_dir.mkdir(parents=True, exist_ok=True)
    stamp = workspaces_dir / OWNED_STAMP
    if not stamp.exists() and all(e.name == "lost+found" for e in workspaces_dir.iterdir()):
        stamp.write_text("Made by Helmline's sandbox, which removes what it holds of sessions.\n")


async def sweep_workspace_folders(
    store: EventStore, workspaces_dir: Path, runs_a_call: Callable[[str, str], bool]
) -> int:
    """Remove what the disk holds of sessions the log no longer holds (workspaces, markers
    of reclaimed ones), but for those running a call here (`runs_a_call(tenant, session_id)`);
    of how many sessions. Only in a root the sandbox made (`own_workspaces_dir`)."""
    if not (workspaces_dir / OWNED_STAMP).exists():
        logger.warning(
            "not sweeping %s: the sandbox did not make it; if only workspaces are in it, "
            "create an empty file %s there to let the sandbox sweep it",
            workspaces_dir,
            OWNED_STAMP,
        )
        return 0
    on_disk = await asyncio.to_thread(_sessions_on_disk, workspaces_dir)
    swept = 0
    for session in await sessions_gone(store, on_disk):
        # Retention pushed its events out while a command ran: its result is still to come.
        if not runs_a_call(*session):
            await asyncio.to_thread(_remove_all, on_disk[session])
            swept += 1
    return swept


def _sessions_on_disk(workspaces_dir: Path) -> dict[tuple[str, str], list[Path]]:
    """What the disk holds of each session: its workspace, its marker, a marker half written."""
    found: dict[tuple[str, str], list[Path]] = {}
    for tenant in workspaces_dir.iterdir():
        if not tenant.is_dir():
            continue
        for held in tenant.iterdir():
            if held.name.startswith(REMOVING_PREFIX):
                continue  # Being removed already.
            session_id = held.name.split(".", 1)[0]  # No session id contains a dot.
            found.setdefault((tenant.name, session_id), []).append(held)
    return found


def _remove_all(paths: list[Path]) -> None:
    for path in paths:
        # Another replica sharing the volume may have removed it first.
        with contextlib.suppress(FileNotFoundError):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(_renamed_aside(path))
            else:
                path.unlink()


def remove_half_removed(workspaces_dir: Path) -> int:
    """Delete the workspaces a crash left renamed but not deleted; how many."""
    removed = 0
    for tenant in workspaces_dir.glob("*"):
        for leftover in tenant.glob(REMOVING_PREFIX + "*"):
            shutil.rmtree(leftover, ignore_errors=True)
            removed += 1
    return removed
