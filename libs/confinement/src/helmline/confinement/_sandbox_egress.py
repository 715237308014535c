"""One sandbox's egress, host side and bubblewrap side: the proxy that runs while the sandbox
does, and what the sandbox's command line needs for the forwarder inside. Used alike by the
sandbox service (a command) and the tool gateway (a stdio MCP server)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from helmline.confinement._egress import (
    FORWARDER_SCRIPT,
    SETPRIV,
    WATCHING_CAPABILITIES,
    Destination,
    EgressPlan,
    EgressProxy,
    Refused,
)

RUN_FOLDER = "/run/helmline"
"""Where the egress forwarder and the proxy's socket are, inside the sandbox."""
_SEEN_ANYWAY = PurePosixPath("/usr")


def install_folders(command: str, resolved: str) -> list[str]:
    """The folders a command is installed in: the folder above its `bin` (a virtualenv,
    Node.js), else its own folder; for the command as named and where its links lead.
    /usr and / are left out: a sandbox sees /usr anyway, and never the whole root."""
    found: list[str] = []
    for path in (PurePosixPath(command), PurePosixPath(resolved)):
        folder = path.parent.parent if path.parent.name == "bin" else path.parent
        if folder == PurePosixPath("/") or folder.is_relative_to(_SEEN_ANYWAY):
            continue
        if str(folder) not in found:
            found.append(str(folder))
    return found


@dataclass(frozen=True, slots=True)
class Egress:
    """The host side of one sandbox's egress: the proxy's socket and the sandbox's hosts
    file, and the interpreter (with its folders) that runs the forwarder inside."""

    plan: EgressPlan
    socket: str
    hosts_file: str
    forwarder: str
    interpreter: str
    interpreter_folders: tuple[str, ...]
    watched: bool
    """Whether the forwarder may watch for connections refused inside (as root, with setpriv
    to start the command without the capabilities that takes)."""
    proxy: EgressProxy
    """The proxy outside, running until the stack given to `open_egress` closes."""

    def binds(self) -> list[str]:
        """bubblewrap's arguments that put the forwarder, its interpreter, the proxy's socket
        and the hosts file naming the allowed hosts into the sandbox."""
        argv: list[str] = []
        for folder in self.interpreter_folders:
            argv += ["--ro-bind", folder, folder]
        argv += ["--ro-bind", self.hosts_file, "/etc/hosts"]
        argv += ["--ro-bind", self.forwarder, f"{RUN_FOLDER}/forwarder.py"]
        argv += ["--ro-bind", self.socket, f"{RUN_FOLDER}/egress.sock"]
        return argv

    def capabilities(self) -> list[str]:
        """bubblewrap's arguments (after `--cap-drop ALL`) that let the forwarder watch."""
        if not self.watched:
            return []
        return [arg for capability in WATCHING_CAPABILITIES for arg in ("--cap-add", capability)]

    def command_prefix(self, uid: int | None = None) -> list[str]:
        """What starts the forwarder inside the sandbox; the command follows it, run as
        `uid` if given (by setpriv: the sandbox must leave the forwarder CAP_SETUID and
        CAP_SETGID for it)."""
        return self.plan.forwarder_argv(
            self.interpreter, f"{RUN_FOLDER}/forwarder.py", f"{RUN_FOLDER}/egress.sock", uid
        )


async def open_egress(
    destinations: Iterable[Destination], refused: Refused, stack: contextlib.AsyncExitStack
) -> Egress:
    """Start the proxy admitting `destinations` (telling `refused` of every other), which
    runs, with its socket and hosts file, until `stack` closes."""
    destinations = tuple(destinations)
    plan = EgressPlan.of(destinations)
    folder = await asyncio.to_thread(_egress_folder, plan)
    stack.callback(shutil.rmtree, folder, ignore_errors=True)
    proxy = EgressProxy(destinations, refused)
    await proxy.start(folder / "egress.sock")
    stack.push_async_callback(proxy.close)
    interpreter = await asyncio.to_thread(os.path.realpath, sys.executable)
    return Egress(
        plan=plan,
        socket=str(folder / "egress.sock"),
        hosts_file=str(folder / "hosts"),
        forwarder=str(FORWARDER_SCRIPT),
        interpreter=interpreter,
        interpreter_folders=tuple(install_folders(interpreter, interpreter)),
        watched=os.geteuid() == 0 and await asyncio.to_thread(os.path.exists, SETPRIV),
        proxy=proxy,
    )


def _egress_folder(plan: EgressPlan) -> Path:
    """A folder of its own for one start's proxy socket and hosts file: a short path, for a
    unix socket's path holds at most 107 bytes."""
    folder = Path(tempfile.mkdtemp(prefix="helmline-egress-"))
    (folder / "hosts").write_text(plan.hosts_file)
    return folder
