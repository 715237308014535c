"""The file tools, on one session's workspace. Blocking: run them in a worker thread.

Every path is resolved (symbolic links included) and must stay inside the workspace; the
last component is opened with `O_NOFOLLOW`, so a link swapped in at the last moment is not
followed either. The call's `PathRules` are checked on the path as named and as resolved, so
a link does not lead into a blocked or read-only part either.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath

from pydantic import JsonValue

from helmline.contracts import LimitHit, ToolError
from helmline.sandbox._errors import LimitReached, ToolRefused
from helmline.sandbox._limits import MIB
from helmline.sandbox._output import cut_text
from helmline.sandbox._paths import (
    PATH_FIELD,
    PathRules,
    is_inside,
    outside_workspace,
    workspace_path,
)

_READ_CHUNK = 1 << 16


def read_file(
    workspace: Path, rules: PathRules, argument: str, limit: int
) -> tuple[JsonValue, bool]:
    """`{"path", "content", "truncated"}` of a text file, cut to `limit` bytes."""
    relative = workspace_path(argument)
    target = _resolve(workspace, relative, argument, rules, changing=False)
    with _refusing_os_errors(argument):
        fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            if stat.S_ISDIR(os.fstat(fd).st_mode):
                raise _not_a_file(argument, "list_files")
            data = _read_up_to(fd, limit + 1)
        finally:
            os.close(fd)
    content, truncated = cut_text(data, limit)
    return {"path": str(relative), "content": content, "truncated": truncated}, truncated


def write_file(
    workspace: Path,
    rules: PathRules,
    argument: str,
    content: str,
    owner: int | None,
    disk_mb: int | None,
) -> JsonValue:
    """Create or replace a file, making folders as needed: `{"path", "bytes"}`.

    What it creates belongs to `owner` (the uid the session's commands run as), so that
    commands can change it too. Refused (`LimitReached`) if the workspace would then hold
    more than `disk_mb` MiB, and more than it does now.
    """
    relative = workspace_path(argument)
    if relative == PurePosixPath("."):
        raise _not_a_file(argument, None)
    target = _resolve(workspace, relative, argument, rules, changing=True)
    data = content.encode("utf-8")
    if disk_mb is not None:
        _within_quota(workspace, target, len(data), disk_mb, argument)
    with _refusing_os_errors(argument):
        _make_folders(os.path.dirname(target), owner)
        fd = os.open(
            target,
            os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o644,
        )
        try:
            if owner is not None:
                os.fchown(fd, owner, owner)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
    return {"path": str(relative), "bytes": len(data)}


def list_files(
    workspace: Path, rules: PathRules, argument: str, limit: int
) -> tuple[JsonValue, bool]:
    """`{"files", "truncated"}`: workspace-relative paths of every non-folder entry under
    a folder but the blocked ones, sorted; symbolic links are listed, never followed. The
    list stops once the paths add up to `limit` bytes."""
    relative = workspace_path(argument)
    target = _resolve(workspace, relative, argument, rules, changing=False)
    root = os.path.realpath(workspace)
    with _refusing_os_errors(argument):
        if not stat.S_ISDIR(os.stat(target, follow_symlinks=False).st_mode):
            raise ToolRefused(
                ToolError(
                    kind="validation",
                    message=f"path {argument!r} is a file, not a folder",
                    suggestion="use read_file to read a file",
                    field=PATH_FIELD,
                )
            )
        found: list[str] = []
        for folder, folders, files in os.walk(target, onerror=_raise):
            found.extend(os.path.relpath(os.path.join(folder, name), root) for name in files)
            # os.walk puts links to folders among the folders, and does not enter them.
            found.extend(
                os.path.relpath(os.path.join(folder, name), root)
                for name in folders
                if os.path.islink(os.path.join(folder, name))
            )
            folders[:] = [
                name
                for name in folders
                if not rules.hides(PurePosixPath(os.path.relpath(os.path.join(folder, name), root)))
            ]
    found = sorted(path for path in found if not rules.hides(PurePosixPath(path)))
    kept: list[JsonValue] = []
    size = 0
    for path in found:
        size += len(path.encode("utf-8", errors="surrogateescape")) + 4
        if size > limit:
            return {"files": kept, "truncated": True}, True
        kept.append(path)
    return {"files": kept, "truncated": False}, False


def delete_file(workspace: Path, rules: PathRules, argument: str) -> JsonValue:
    """Delete a file (a symbolic link itself, not what it points to): `{"path"}`."""
    relative = workspace_path(argument)
    if relative == PurePosixPath("."):
        raise _not_a_file(argument, None)
    rules.check(relative, argument, changing=True)
    folder = _resolve(workspace, relative.parent, argument, rules, changing=True)
    target = os.path.join(folder, relative.name)
    root = os.path.realpath(workspace)
    rules.check(PurePosixPath(os.path.relpath(target, root)), argument, changing=True)
    with _refusing_os_errors(argument):
        if stat.S_ISDIR(os.stat(target, follow_symlinks=False).st_mode):
            raise _not_a_file(argument, None)
        os.unlink(target)
    return {"path": str(relative)}


def workspace_bytes(workspace: Path) -> int:
    """Bytes of disk the workspace's files take (a sparse file counts what it holds), not
    following links. Blocking; files that vanish meanwhile count nothing."""
    total = 0
    folders = [str(workspace)]
    while folders:
        try:
            with os.scandir(folders.pop()) as entries:
                for entry in entries:
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            folders.append(entry.path)
                        else:
                            total += entry.stat(follow_symlinks=False).st_blocks * 512
                    except FileNotFoundError:
                        continue
        except (FileNotFoundError, NotADirectoryError):
            continue
    return total


def _within_quota(workspace: Path, target: str, size: int, disk_mb: int, argument: str) -> None:
    held = workspace_bytes(workspace)
    try:
        replaced = os.stat(target, follow_symlinks=False).st_blocks * 512
    except FileNotFoundError:
        replaced = 0
    after = held - replaced + size
    quota = disk_mb * MIB
    if after > quota and after > held:
        raise LimitReached(
            ToolError(
                kind="limit",
                message=f"writing {size} bytes to {argument!r} would make the workspace hold "
                f"{after / MIB:.1f} MiB, more than the {disk_mb} MiB it may",
                suggestion="delete files the session no longer needs, or raise disk_mb",
                field="/content",
            ),
            LimitHit(limit="disk", value=disk_mb),
        )


def _make_folders(folder: str, owner: int | None) -> None:
    if os.path.isdir(folder):
        return
    _make_folders(os.path.dirname(folder), owner)
    try:
        os.mkdir(folder)
    except FileExistsError:
        return  # Made meanwhile by a parallel call.
    if owner is not None:
        os.chown(folder, owner, owner)


def _resolve(
    workspace: Path, relative: PurePosixPath, argument: str, rules: PathRules, *, changing: bool
) -> str:
    rules.check(relative, argument, changing=changing)
    root = os.path.realpath(workspace)
    resolved = os.path.realpath(os.path.join(root, relative))
    if not is_inside(root, resolved):
        raise outside_workspace(argument, through_link=True)
    rules.check(PurePosixPath(os.path.relpath(resolved, root)), argument, changing=changing)
    return resolved


def _read_up_to(fd: int, size: int) -> bytes:
    chunks: list[bytes] = []
    left = size
    while left > 0:
        chunk = os.read(fd, min(left, _READ_CHUNK))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _raise(error: OSError) -> None:
    raise error


def _not_a_file(argument: str, suggested_tool: str | None) -> ToolRefused:
    return ToolRefused(
        ToolError(
            kind="validation",
            message=f"path {argument!r} is a folder, not a file",
            suggestion=f"use {suggested_tool} for folders" if suggested_tool else None,
            field=PATH_FIELD,
        )
    )


@contextmanager
def _refusing_os_errors(argument: str) -> Iterator[None]:
    """Turn what the operating system refused into a structured tool error."""
    try:
        yield
    except FileNotFoundError as error:
        raise ToolRefused(
            ToolError(
                kind="not_found",
                message=f"path {argument!r} does not exist in the workspace",
                suggestion="list_files shows what the workspace holds",
                field=PATH_FIELD,
            )
        ) from error
    except (IsADirectoryError, NotADirectoryError) as error:
        raise ToolRefused(
            ToolError(
                kind="validation",
                message=f"path {argument!r}: {error.strerror}",
                field=PATH_FIELD,
            )
        ) from error
    except OSError as error:
        if error.errno == errno.ELOOP:
            # O_NOFOLLOW met a link that appeared after the path was checked.
            raise outside_workspace(argument, through_link=True) from error
        kind = "permission" if isinstance(error, PermissionError) else "execution"
        raise ToolRefused(
            ToolError(
                kind=kind,
                message=f"path {argument!r}: {error.strerror or error}",
                retryable=error.errno in (errno.EAGAIN, errno.EINTR, errno.EBUSY),
                field=PATH_FIELD,
            )
        ) from error
