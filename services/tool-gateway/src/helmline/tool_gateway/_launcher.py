"""How the gateway starts a stdio server (in its sandbox, egress proxied) and opens an HTTP
one, secrets resolved at that moment: the I/O around `_sandboxing` and `_server_secrets`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from mcp import StdioServerParameters
from mcp.client.stdio import get_default_environment

from helmline.confinement import (
    Egress,
    EgressProxy,
    find_bubblewrap,
    install_folders,
    open_egress,
)
from helmline.contracts import MAX_EGRESS_REFUSED
from helmline.runtime import SecretsKeyError
from helmline.tool_gateway._config import ServerConfig
from helmline.tool_gateway._sandboxing import sandboxed_start
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
        self,
        config: ServerConfig,
        stack: contextlib.AsyncExitStack,
        refusals: EgressRefusals | None = None,
    ) -> StdioServerParameters:
        """What starts a stdio server: in its sandbox (whose egress proxy, if it may reach
        any host, runs until `stack` closes, adding each connection it refuses to
        `refusals`), its environment's secrets resolved."""
        stdio = config.stdio
        assert stdio is not None
        env = await resolved(stdio.env, self._secret_value)
        if not self.sandboxed:
            return StdioServerParameters(
                command=stdio.command, args=list(stdio.args), env=env or None, cwd=stdio.cwd
            )
        bwrap = await self.bwrap()
        host = await asyncio.to_thread(_HostFacts.of, stdio.command, stdio.args)
        egress = None
        if config.sandbox.network:
            egress = await self._egress(config, refusals or EgressRefusals(), stack)
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

    async def _egress(
        self, config: ServerConfig, refusals: EgressRefusals, stack: contextlib.AsyncExitStack
    ) -> Egress:
        server = config.id

        def refused(asked: str, reason: str) -> None:
            refusals.add(asked)
            logger.warning(
                "MCP server %s: connection to %s refused (%s); its sandbox allows %s",
                server,
                asked,
                reason,
                ", ".join(config.sandbox.network),
            )

        egress = await open_egress(config.sandbox.destinations, refused, stack)
        refusals.proxy = egress.proxy
        return egress


class EgressRefusals:
    """The destinations one server instance's sandbox was refused, numbered in order, the
    latest kept: a call takes a `mark()` when sent and, when answered, the refusals `since`
    it. The sandbox is the instance's, not the call's: on an instance serving several calls
    at once, each of them is given every refusal made while it was in flight. The forwarder
    watches on a thread of its own, so a refusal may be told after the call's answer: the
    gateway awaits `caught_up` (which asks the forwarder) before taking a call's refusals."""

    def __init__(self) -> None:
        self._count = 0
        self._recent: deque[tuple[int, str]] = deque(maxlen=MAX_EGRESS_REFUSED)
        self.proxy: EgressProxy | None = None
        """The egress proxy of the instance's sandbox, while it runs."""

    async def caught_up(self) -> None:
        """Return once every connection refused inside the sandbox until now is added (the
        forwarder watches on a thread of its own, and is asked; see `EgressProxy`)."""
        if self.proxy is not None:
            await self.proxy.caught_up()

    def add(self, destination: str) -> None:
        self._count += 1
        self._recent.append((self._count, destination))

    def mark(self) -> int:
        return self._count

    def since(self, mark: int) -> tuple[str, ...]:
        """The refusals after `mark` still kept (at most `MAX_EGRESS_REFUSED`, the latest)."""
        return tuple(destination for number, destination in self._recent if number > mark)


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
