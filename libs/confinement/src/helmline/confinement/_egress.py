"""Egress by host: a sandbox reaches the named `host:port`s and nothing else, decided outside it.

A sandbox allowed some hosts still gets a network namespace of its own, with loopback only.
Inside, a forwarder (`_forwarder.py`) listens on one loopback address and port per allowed
destination: `127.0.0.1:8080` as itself, a named host (`api.example.com:443`) on an address
of 127.100.0.0/16 that the sandbox's own hosts file gives that name. Whatever connects there
is passed, through a unix socket bound into the sandbox, to the `EgressProxy` outside, which
admits only the allowed destinations and connects out. A destination not allowed has
nothing listening for it: the connection is refused inside the namespace, and nothing
leaves (the forwarder, given CAP_NET_RAW to watch for them, tells the proxy of each, which
records it); one asked of the proxy directly is refused there, and recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

FORWARDER_SCRIPT = Path(__file__).with_name("_forwarder.py")
"""The forwarder, run inside the sandbox by its interpreter (standard library only)."""
WATCHING_CAPABILITIES = ("CAP_NET_RAW", "CAP_SETPCAP")
"""What a sandbox run as root gives its forwarder, to watch for connections refused inside
(a raw socket) and to start the server without them (setpriv, which the forwarder needs)."""
SETPRIV = "/usr/bin/setpriv"

_LABEL = r"[A-Za-z0-9][A-Za-z0-9-]{0,62}"
_HOST_NAME = re.compile(rf"(?=.{{1,253}}$){_LABEL}(\.{_LABEL})*")
_NAMED_HOSTS = ipaddress.ip_network("127.100.0.0/16")
_ANSWER_TIMEOUT_S = 10.0
_CONNECT_TIMEOUT_S = 10.0
_CHUNK = 65536


UNROUTED = "unrouted "
"""What the forwarder says before a destination a connection was attempted to, that nothing
in the sandbox leads to (the kernel refused it there)."""


WATCHING = "watching"
"""What the forwarder says to open its control connection, on which the proxy asks `sync`
and the forwarder answers `synced` once it has told of every attempt refused so far."""
_SYNC_TIMEOUT_S = 1.0


class EgressError(ValueError):
    """A destination that cannot be allowed, and why."""


@dataclass(frozen=True, slots=True, order=True)
class Destination:
    """A host (a name, or a loopback address) and a port a sandbox may connect to."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"

    @classmethod
    def parse(cls, text: str) -> Destination:
        """`host:port`: a host name or a loopback IPv4 address, and a port 1-65535."""
        host, colon, port = text.rpartition(":")
        if not colon or not port.isdigit() or not 1 <= int(port) <= 65535:
            raise EgressError(f"{text!r} is not host:port (a port from 1 to 65535)")
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            if _HOST_NAME.fullmatch(host) is None:
                raise EgressError(f"{host!r} in {text!r} is not a host name") from None
            return cls(host.lower(), int(port))
        # The namespace holds loopback only: another address has no route there, and
        # cannot be taken over by the forwarder. A name can.
        if address.version != 4 or not address.is_loopback:
            raise EgressError(
                f"{host!r} in {text!r}: an address must be a loopback IPv4 one "
                "(127.x.x.x); name other hosts by their name"
            )
        return cls(str(address), int(port))


def checked_destinations(texts: Iterable[str], field: str) -> tuple[str, ...]:
    """`texts` as `Destination`s write them, for a configuration's `field`; raises
    `ValueError` (as pydantic validators do) naming the field and what was wrong."""
    try:
        return tuple(str(Destination.parse(text)) for text in texts)
    except EgressError as error:
        raise ValueError(f"{field}: {error}") from None


@dataclass(frozen=True, slots=True)
class Route:
    """Where, inside the sandbox, the forwarder listens for one destination."""

    listen: str
    """`address:port` in the sandbox's namespace."""
    destination: Destination


@dataclass(frozen=True, slots=True)
class EgressPlan:
    """The forwarder's routes and the sandbox's hosts file, for a set of destinations. Pure."""

    routes: tuple[Route, ...]
    hosts_file: str

    @classmethod
    def of(cls, destinations: Iterable[Destination]) -> EgressPlan:
        allowed = sorted(set(destinations))
        addresses: dict[str, str] = {}
        named = _NAMED_HOSTS.hosts()
        routes: list[Route] = []
        for destination in allowed:
            if _is_address(destination.host):
                address = destination.host
            else:
                address = addresses.get(destination.host) or str(next(named))
                addresses[destination.host] = address
            routes.append(Route(f"{address}:{destination.port}", destination))
        # localhost is loopback as everywhere, unless it is named: then it is the forwarder's.
        addresses.setdefault("localhost", "127.0.0.1")
        lines = [f"{address} {name}" for name, address in addresses.items()]
        return cls(tuple(routes), "\n".join(lines) + "\n")

    def forwarder_argv(
        self, interpreter: str, script: str, socket_path: str, uid: int | None = None
    ) -> list[str]:
        """The argv that starts the forwarder inside the sandbox; the command follows it,
        run as `uid` if given (the forwarder itself keeps the sandbox's)."""
        routes = (f"{route.listen}={route.destination}" for route in self.routes)
        as_uid = [f"--uid={uid}"] if uid is not None else []
        return [interpreter, "-I", "-S", script, socket_path, *as_uid, *routes, "--"]


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


Refused = Callable[[str, str], None]
"""Told of each refused connection: the destination asked for (as given) and why."""


class EgressProxy:
    """Outside the sandbox: admits connections to the allowed destinations only."""

    def __init__(self, allowed: Iterable[Destination], refused: Refused) -> None:
        self._allowed = frozenset(allowed)
        self._refused = refused
        self._server: asyncio.Server | None = None
        self._control: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self._syncing = asyncio.Lock()
        self.refusals = 0
        """Connections refused so far."""

    async def start(self, socket_path: Path) -> None:
        """Listen on `socket_path` (a unix socket, to be bound into the sandbox)."""
        self._server = await asyncio.start_unix_server(self._handle, path=str(socket_path))

    async def close(self) -> None:
        if self._control is not None:
            self._control[1].close()
            self._control = None
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None

    async def caught_up(self) -> None:
        """Return once the forwarder has told of every connection refused inside the
        sandbox until now (at once if it does not watch; within a second in any case)."""
        async with self._syncing:
            if self._control is None:
                return
            reader, writer = self._control
            try:
                async with asyncio.timeout(_SYNC_TIMEOUT_S):
                    writer.write(b"sync\n")
                    await writer.drain()
                    answer = await reader.readline()
            except (OSError, TimeoutError):
                answer = b""
            if not answer:
                logger.info("egress: the forwarder's control connection is gone")
                writer.close()
                self._control = None

    def _refuse(self, asked: str, reason: str) -> None:
        self.refusals += 1
        self._refused(asked, reason)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(_ANSWER_TIMEOUT_S):
                line = await reader.readline()
            asked = line.decode(errors="replace").strip()[:300]
            if asked == WATCHING:
                # Kept open for `caught_up`.
                self._control = (reader, writer)
                return
            unrouted = asked.removeprefix(UNROUTED)
            if unrouted != asked:
                # Told by the forwarder, which saw it refused inside the sandbox.
                self._refuse(unrouted, "not an allowed destination; refused in the sandbox")
                return
            try:
                destination = Destination.parse(asked)
            except EgressError as error:
                self._refuse(asked, str(error))
                writer.write(b"refused\n")
                return
            if destination not in self._allowed:
                self._refuse(asked, "not an allowed destination")
                writer.write(b"refused\n")
                return
            try:
                async with asyncio.timeout(_CONNECT_TIMEOUT_S):
                    out_reader, out_writer = await asyncio.open_connection(
                        destination.host, destination.port
                    )
            except (OSError, TimeoutError) as error:
                logger.info("egress to %s failed: %s", destination, error)
                writer.write(b"failed\n")
                return
            writer.write(b"ok\n")
            try:
                await asyncio.gather(_relay(reader, out_writer), _relay(out_reader, writer))
            finally:
                out_writer.close()
        except (OSError, TimeoutError, UnicodeError):
            pass
        finally:
            if self._control is None or writer is not self._control[1]:
                writer.close()


async def _relay(source: asyncio.StreamReader, target: asyncio.StreamWriter) -> None:
    try:
        while data := await source.read(_CHUNK):
            target.write(data)
            await target.drain()
        if target.can_write_eof():
            target.write_eof()
    except OSError:
        pass
