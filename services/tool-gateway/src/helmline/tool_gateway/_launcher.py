"""How the gateway starts a stdio server (in its sandbox, egress proxied) and opens an HTTP
one, secrets resolved at that moment: the I/O around `_sandboxing` and `_server_secrets`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from mcp import StdioServerParameters
from mcp.client.stdio import get_default_environment

from helmline.confinement import (
    FORWARDER_SCRIPT,
    SETPRIV,
    EgressPlan,
    EgressProxy,
    find_bubblewrap,
)
from helmline.runtime import SecretsKeyError
from helmline.tool_gateway._config import ServerConfig
from helmline.tool_gateway._sandboxing import Egress, install_folders, sandboxed_start
from helmline.tool_gateway._server_secrets import SecretValue, resolved

logger = logging.getLogger(__name__)


class CommandNotFound(Exception):
    """A stdio server's command is not on the gateway's PATH."""


async def _no_secrets(name: str) -> str:
    raise SecretsKeyError(
        f"the servers file refers to the secret {name!r}, and this gateway has no secrets store"
    )


class ServerLauncher:
    """Starts servers sandboxed by bubblewrap (`bwrap`: the executable to use, found when
    first needed if not given), or, with `sandboxed=False`, as plain children of the gateway
    (development on a host without namespaces only); `secret_value` resolves `{secret: NAME}`."""

    def __init__(
        self,
        *,
        sandboxed: bool = True,
        bwrap: str | None = None,
        secret_value: SecretValue = _no_secrets,
    ) -> None:
        self.sandboxed = sandboxed
        self._bwrap = bwrap
        self._secret_value = secret_value
        self.egress_refusals: dict[str, int] = {}
        """Connections refused to each server's sandbox so far, by server id."""

    async def bwrap(self) -> str:
        """The bubblewrap in use (raises `BubblewrapUnavailable` when none runs here)."""
        if self._bwrap is None:
            self._bwrap = (await asyncio.to_thread(find_bubblewrap, None)).path
        return self._bwrap

    async def headers(self, config: ServerConfig) -> dict[str, str]:
        """An HTTP server's headers, secrets resolved."""
        assert config.http is not None
        return await resolved(config.http.headers, self._secret_value)

    async def stdio(
        self, config: ServerConfig, stack: contextlib.AsyncExitStack
    ) -> StdioServerParameters:
        """What starts a stdio server: in its sandbox (whose egress proxy, if it may reach
        any host, runs until `stack` closes), its environment's secrets resolved."""
        stdio = config.stdio
        assert stdio is not None
        env = await resolved(stdio.env, self._secret_value)
        if not self.sandboxed:
            return StdioServerParameters(
                command=stdio.command, args=list(stdio.args), env=env or None, cwd=stdio.cwd
            )
        bwrap = await self.bwrap()
        host = await asyncio.to_thread(_HostFacts.of, stdio.command, stdio.args)
        egress = await self._egress(config, stack) if config.sandbox.network else None
        start = sandboxed_start(
            bwrap,
            config.sandbox,
            command=host.command,
            command_folders=install_folders(host.command, host.command_target),
            args=stdio.args,
            existing_paths=host.existing_paths,
            cwd=stdio.cwd,
            env=env,
            inherited=get_default_environment(),
            as_root=os.geteuid() == 0,
            egress=egress,
        )
        return StdioServerParameters(command=start.argv[0], args=start.argv[1:], env=start.env)

    async def _egress(self, config: ServerConfig, stack: contextlib.AsyncExitStack) -> Egress:
        server = config.id

        def refused(asked: str, reason: str) -> None:
            self.egress_refusals[server] = self.egress_refusals.get(server, 0) + 1
            logger.warning(
                "MCP server %s: connection to %s refused (%s); its sandbox allows %s",
                server,
                asked,
                reason,
                ", ".join(config.sandbox.network),
            )

        plan = EgressPlan.of(config.sandbox.destinations)
        folder = await asyncio.to_thread(_egress_folder, plan)
        stack.callback(shutil.rmtree, folder, ignore_errors=True)
        proxy = EgressProxy(config.sandbox.destinations, refused)
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
        )


@dataclass(frozen=True, slots=True)
class _HostFacts:
    command: str
    """The command's absolute path, as found on PATH."""
    command_target: str
    """Where its links lead."""
    existing_paths: list[str]
    """The arguments that are absolute paths to something that exists."""

    @classmethod
    def of(cls, command: str, args: Iterable[str]) -> _HostFacts:
        found = shutil.which(command)
        if found is None:
            raise CommandNotFound(f"{command!r} is not on the gateway's PATH")
        found = os.path.abspath(found)
        existing = [arg for arg in args if arg.startswith("/") and os.path.exists(arg)]
        return cls(found, os.path.realpath(found), existing)


def _egress_folder(plan: EgressPlan) -> Path:
    """A folder of its own for one start's proxy socket and hosts file: a short path, for a
    unix socket's path holds at most 107 bytes."""
    folder = Path(tempfile.mkdtemp(prefix="helmline-egress-"))
    (folder / "hosts").write_text(plan.hosts_file)
    return folder
