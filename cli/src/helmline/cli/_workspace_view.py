"""Which stored snapshot shows a session's workspace at a point, and how its entries read.
Pure: the log and the manifest come from the caller."""

from __future__ import annotations

import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath

from helmline.cli._errors import CliError
from helmline.contracts import CheckpointCreated, WorkspaceRestored, WorkspaceSnapshotted
from helmline.runtime import StoredEvent
from helmline.sandbox import Entry, Manifest


@dataclass(frozen=True, slots=True)
class Chosen:
    """The snapshot that shows the workspace, and how to name that point to a person."""

    snapshot_id: str
    point: str


def choose_snapshot(log: Sequence[StoredEvent], at: str | None) -> Chosen:
    """The snapshot of the workspace now (`at` None), at checkpoint `at`, or snapshot `at`.

    The workspace at a point is the last snapshot taken (or restored) up to it: the sandbox
    records the snapshot after a call before the call's result, so a checkpoint made on that
    result already covers it.
    """
    cutoff: int | None = None
    point = "now"
    if at is not None:
        checkpoint = _checkpoint(log, at)
        if checkpoint is not None:
            point = f"checkpoint {at}"
            if checkpoint.snapshot_id is not None:
                return _stored(log, checkpoint.snapshot_id, point)
            cutoff = checkpoint.at_seq
        elif any(_snapshot_id(stored) == at for stored in log):
            return _stored(log, at, f"snapshot {at}")
        else:
            raise CliError(
                f"the session has no checkpoint or snapshot {at!r} "
                "(`helmline show SESSION` lists its checkpoints)"
            )
    latest: str | None = None
    for stored in log:
        if cutoff is not None and stored.seq > cutoff:
            break
        latest = _snapshot_id(stored) or latest
    if latest is None:
        raise CliError(
            f"the session has no workspace snapshot {'yet' if at is None else 'by ' + point}: "
            "no call had changed its workspace"
        )
    return _stored(log, latest, point)


def _checkpoint(log: Sequence[StoredEvent], checkpoint_id: str) -> CheckpointCreated | None:
    for stored in log:
        data = stored.event.data
        if isinstance(data, CheckpointCreated) and data.checkpoint_id == checkpoint_id:
            return data
    return None


def _snapshot_id(stored: StoredEvent) -> str | None:
    data = stored.event.data
    if isinstance(data, WorkspaceSnapshotted | WorkspaceRestored):
        return data.snapshot_id
    return None


def _stored(log: Sequence[StoredEvent], snapshot_id: str, point: str) -> Chosen:
    for stored in log:
        data = stored.event.data
        if (
            isinstance(data, WorkspaceSnapshotted)
            and data.snapshot_id == snapshot_id
            and data.irreversible_reason is not None
        ):
            raise CliError(
                f"the workspace {point} was not stored ({data.irreversible_reason}), "
                "so it cannot be shown"
            )
    return Chosen(snapshot_id, point)


def normal_path(path: str) -> str:
    """`path` as manifests spell it (relative, `/`-separated; "" for the workspace itself);
    refuses one that leaves the workspace."""
    parts = [part for part in PurePosixPath(path.lstrip("/")).parts if part != "."]
    if ".." in parts:
        raise CliError(f"invalid path {path!r}: '..' leaves the workspace", exit_code=2)
    return "/".join(parts)


def listed(manifest: Manifest, path: str) -> list[Entry]:
    """What `ls PATH` shows: a folder's direct entries, or the entry itself."""
    if path:
        for entry in manifest:
            if entry.path == path and entry.kind != "dir":
                return [entry]
        if not any(entry.path == path for entry in manifest):
            raise CliError(f"no {path!r} in the workspace")
    prefix = f"{path}/" if path else ""
    return [
        entry
        for entry in manifest
        if entry.path.startswith(prefix) and "/" not in entry.path[len(prefix) :]
    ]


def file_entry(manifest: Manifest, path: str) -> Entry:
    """The file at `path`, for `cat`."""
    for entry in manifest:
        if entry.path == path:
            if entry.kind != "file":
                raise CliError(f"{path!r} is a {'folder' if entry.kind == 'dir' else 'link'}")
            return entry
    raise CliError(f"no {path!r} in the workspace")


_KIND_BITS = {"file": stat.S_IFREG, "dir": stat.S_IFDIR, "link": stat.S_IFLNK}


def entry_line(entry: Entry) -> str:
    """One line of `ls`: mode, size and path, the way `ls -l` shows them."""
    mode = stat.filemode(_KIND_BITS[entry.kind] | (0o777 if entry.kind == "link" else entry.mode))
    size = str(entry.size) if entry.kind == "file" else "-"
    name = entry.path
    if entry.kind == "dir":
        name += "/"
    elif entry.kind == "link":
        name += f" -> {entry.sha256}"
    return f"{mode} {size:>10}  {name}"
