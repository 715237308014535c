"""Workspace manifests: what a workspace held, entry by entry, and what it takes to turn one
workspace into another. Pure."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Literal

from helmline.contracts import FileChanges

LISTED_CHANGES = 100
"""Paths of each kind of change an event lists; the rest are only counted."""

Kind = Literal["file", "dir", "link"]


@dataclass(frozen=True, slots=True)
class Entry:
    """One thing in a workspace."""

    path: str
    """Relative to the workspace, `/`-separated."""
    kind: Kind
    mode: int
    """Permission bits (links: 0)."""
    size: int = 0
    """Bytes (files)."""
    sha256: str = ""
    """Content hash (files), or the link's target (links)."""


Manifest = tuple[Entry, ...]
"""A workspace's entries, sorted by path."""


def encode_manifest(manifest: Manifest) -> bytes:
    """The manifest as stored: canonical JSON, so equal workspaces have equal bytes."""
    return json.dumps(
        [asdict(entry) for entry in manifest], separators=(",", ":"), sort_keys=True
    ).encode()


def decode_manifest(data: bytes) -> Manifest:
    """A stored manifest."""
    return tuple(Entry(**item) for item in json.loads(data))


def manifest_digest(manifest: Manifest) -> str:
    """Names the workspace's whole content."""
    return "sha256:" + hashlib.sha256(encode_manifest(manifest)).hexdigest()


@dataclass(frozen=True, slots=True)
class RestorePlan:
    """What to do to a workspace so that it matches a manifest."""

    remove: tuple[Entry, ...]
    """Entries to delete, deepest first."""
    create: tuple[Entry, ...]
    """Entries to (re)create or change, parents first."""


def restore_plan(current: Manifest, target: Manifest) -> RestorePlan:
    """The changes that turn `current` into `target`."""
    now = {entry.path: entry for entry in current}
    wanted = {entry.path: entry for entry in target}
    remove = [
        entry
        for path, entry in now.items()
        if path not in wanted or wanted[path].kind != entry.kind
    ]
    create = [entry for path, entry in wanted.items() if now.get(path) != entry]
    return RestorePlan(
        remove=tuple(sorted(remove, key=lambda entry: entry.path, reverse=True)),
        create=tuple(sorted(create, key=lambda entry: entry.path)),
    )


def file_changes(before: Manifest, after: Manifest) -> FileChanges:
    """What turned the workspace of `before` into that of `after`, path by path."""
    old = {entry.path: entry for entry in before}
    new = {entry.path: entry for entry in after}
    created = [_shown(e) for path, e in new.items() if path not in old or old[path].kind != e.kind]
    deleted = [_shown(e) for path, e in old.items() if path not in new or new[path].kind != e.kind]
    modified = [
        _shown(e)
        for path, e in new.items()
        if path in old and old[path].kind == e.kind and old[path] != e
    ]
    unlisted = sum(max(0, len(paths) - LISTED_CHANGES) for paths in (created, modified, deleted))
    return FileChanges(
        created=tuple(created[:LISTED_CHANGES]),
        modified=tuple(modified[:LISTED_CHANGES]),
        deleted=tuple(deleted[:LISTED_CHANGES]),
        unlisted=unlisted,
    )


def _shown(entry: Entry) -> str:
    return f"{entry.path}/" if entry.kind == "dir" else entry.path
