"""Where a tool's path argument points, decided without touching the disk.

Paths are relative to the session workspace. Anything that names a place outside it is
refused here, before any file is touched; symbolic links are checked by the file tools,
which compare the resolved path against the workspace with `is_inside`. A sandbox profile's
`PathRules` keep parts of the workspace read-only or out of sight.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from helmline.contracts import ToolError
from helmline.sandbox._errors import ToolRefused

PATH_FIELD = "/path"
_RELATIVE_HINT = 'use a path relative to the workspace, such as "notes/todo.txt"'


def workspace_of(workspaces_dir: Path, tenant: str, session_id: str) -> Path:
    """The folder of one session's workspace.

    Tenant and session ids are restricted by the contracts to letters, digits, `_` and `-`,
    so each is a single, harmless path component.
    """
    return workspaces_dir / tenant / session_id


def workspace_path(argument: str) -> PurePosixPath:
    """The normalised workspace-relative path an argument names (`.` for the workspace).

    Raises `ToolRefused` (kind `permission`) for absolute paths and paths that climb out
    of the workspace, and (kind `validation`) for empty paths or NUL bytes.
    """
    if not argument or "\x00" in argument:
        raise ToolRefused(
            ToolError(
                kind="validation",
                message=f"path {argument!r} is not a usable file name",
                suggestion=_RELATIVE_HINT,
                field=PATH_FIELD,
            )
        )
    if argument.startswith("/"):
        raise ToolRefused(
            ToolError(
                kind="permission",
                message=f"path {argument!r} is absolute; only paths inside the workspace "
                "are allowed",
                suggestion=_RELATIVE_HINT,
                field=PATH_FIELD,
            )
        )
    normal = posixpath.normpath(argument)
    if normal == ".." or normal.startswith("../"):
        raise outside_workspace(argument)
    return PurePosixPath(normal)


def outside_workspace(argument: str, *, through_link: bool = False) -> ToolRefused:
    """The refusal of a path that leads outside the workspace."""
    how = " through a symbolic link" if through_link else ""
    return ToolRefused(
        ToolError(
            kind="permission",
            message=f"path {argument!r} leads outside the workspace{how}; refused",
            suggestion=_RELATIVE_HINT,
            field=PATH_FIELD,
        )
    )


def is_inside(root: str, resolved: str) -> bool:
    """Whether an absolute, resolved path is the root folder or lies beneath it."""
    return resolved == root or resolved.startswith(root.rstrip("/") + "/")


@dataclass(frozen=True, slots=True)
class PathRules:
    """Parts of the workspace kept from a profile's calls: a read-only path (and all beneath
    it) may be read and not changed; a blocked one may be neither seen nor changed."""

    read_only: tuple[PurePosixPath, ...] = ()
    blocked: tuple[PurePosixPath, ...] = ()

    def check(self, relative: PurePosixPath, argument: str, *, changing: bool) -> None:
        """Raise `ToolRefused` (kind `permission`) if a rule keeps `relative` from the call."""
        if (rule := _covering(self.blocked, relative)) is not None:
            raise ToolRefused(
                ToolError(
                    kind="permission",
                    message=f"path {argument!r} is in {str(rule)!r}, which this call's sandbox "
                    "profile blocks",
                    suggestion="leave it alone, or ask for a profile that allows it",
                    field=PATH_FIELD,
                )
            )
        if changing and (rule := _covering(self.read_only, relative)) is not None:
            raise ToolRefused(
                ToolError(
                    kind="permission",
                    message=f"path {argument!r} is in {str(rule)!r}, which this call's sandbox "
                    "profile keeps read-only",
                    suggestion="write somewhere else in the workspace",
                    field=PATH_FIELD,
                )
            )

    def hides(self, relative: PurePosixPath) -> bool:
        """Whether `relative` lies in a blocked path."""
        return _covering(self.blocked, relative) is not None


NO_RULES = PathRules()
"""The whole workspace open to the call."""


def _covering(rules: tuple[PurePosixPath, ...], relative: PurePosixPath) -> PurePosixPath | None:
    return next((rule for rule in rules if rule == relative or rule in relative.parents), None)


def rule_path(text: str) -> PurePosixPath:
    """A rule's workspace-relative path; raises `ValueError` naming what is wrong with it."""
    try:
        path = workspace_path(text)
    except ToolRefused as refused:
        raise ValueError(refused.error.message) from None
    if path == PurePosixPath("."):
        raise ValueError(f"path {text!r} is the whole workspace; name a part of it")
    return path
