"""For testing the sandbox: one built-in tool call carried out as the service would, and a
private Docker engine and a local busybox image, for testing and measuring the container
backend on a machine without a registry or a running engine.

The engine keeps to itself: its own data and exec roots and socket, no iptables rules, no
IP forwarding, no bridge. The image is built from the host's static busybox, with a relative
link per applet (absolute ones would point out of the container).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import shutil
import signal
import socket
import subprocess
import tarfile
import tempfile
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

import docker
import docker.errors
from pydantic import JsonValue

from helmline.contracts import SandboxExecutionRequested, SandboxLimits
from helmline.sandbox._commands import Approached, CommandControl, Reaper
from helmline.sandbox._tools import Outcome, Tools


async def call(
    tools: Tools,
    workspace: Path,
    session: tuple[str, str],
    tool: str,
    arguments: Mapping[str, JsonValue],
    *,
    profile: str | None = None,
    limits: SandboxLimits | None = None,
    network: bool = False,
    approached: Approached | None = None,
) -> Outcome:
    """Carry out one call of a built-in tool in `workspace` of `session` (tenant, session
    id), as the sandbox service would; warnings of limits it comes near go to `approached`."""
    request = SandboxExecutionRequested(
        call_id=f"call-{uuid.uuid4().hex[:8]}",
        step_id="step-1",
        tool=tool,
        arguments=dict(arguments),
        limits=limits or SandboxLimits(),
        network=network,
        profile=profile,
    )
    heard = (approached,) if approached is not None else ()
    control = CommandControl(uuid.uuid4().hex, asyncio.Event(), Reaper(), *heard)
    return await tools.execute(request, workspace, session, control)


def processes_of(uid: int) -> list[int]:
    """Live host processes of `uid` (zombies are dead, only not yet reaped): what a call
    whose sandbox runs as `uid` left behind."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as stat:
                    state = stat.read().rsplit(")", 1)[1].split()[0]
                if os.stat(f"/proc/{name}").st_uid == uid and state not in ("Z", "X"):
                    found.append(int(name))
            except (FileNotFoundError, ProcessLookupError):
                pass
    return found


BUSYBOX_IMAGE = "helmline-test/busybox:latest"
_BUSYBOX_PATHS = ("/bin/busybox", "/usr/bin/busybox")
_READY_S = 30.0


class EngineUnavailable(Exception):
    """No private engine can run here; the message says why (for a test's skip reason)."""


def _kill_leftovers(root: str) -> None:
    """SIGKILL every process whose command line names `root` (a killed engine's containerd
    and shims), and every process below them (the containers'). Blocking."""
    parents: dict[int, int] = {}
    named: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            parents[int(entry.name)] = int(
                (entry / "stat").read_text().rsplit(")", 1)[1].split()[1]
            )
            if root in (entry / "cmdline").read_bytes().decode(errors="replace"):
                named.append(int(entry.name))
    doomed = set(named)
    while grown := {pid for pid, parent in parents.items() if parent in doomed} - doomed:
        doomed |= grown
    for pid in doomed:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


class PrivateDockerd:
    """`dockerd` for the duration of a `with` block; `host` is its API address."""

    def __init__(self) -> None:
        # Short: the exec root holds unix sockets, whose paths may not exceed 108 bytes.
        self._root = Path(tempfile.mkdtemp(prefix="hl-dockerd-", dir="/tmp"))
        self.host = f"unix://{self._root}/docker.sock"
        self._process: subprocess.Popen[bytes] | None = None
        self._killed = False

    def __enter__(self) -> PrivateDockerd:
        self._start()
        return self

    def _start(self) -> None:
        binary = shutil.which("dockerd")
        if binary is None:
            raise EngineUnavailable("dockerd is not installed (Debian: apt-get install docker.io)")
        if os.geteuid() != 0:
            raise EngineUnavailable("a private dockerd needs root")
        roots = [f"--data-root={self._root}/data", f"--exec-root={self._root}/exec"]
        isolated = ["--iptables=false", "--ip-forward=false", "--bridge=none"]
        with open(self._root / "dockerd.log", "wb") as log:
            self._process = subprocess.Popen(
                [
                    binary,
                    *roots,
                    f"--pidfile={self._root}/dockerd.pid",
                    f"--host={self.host}",
                    *isolated,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + _READY_S
        while True:
            # Probed with a socket of our own: the SDK leaks the socket of a refused connect.
            with socket.socket(socket.AF_UNIX) as probe:
                try:
                    probe.connect(str(self._root / "docker.sock"))
                    with contextlib.closing(self.client()) as client:
                        client.ping()
                    return
                except (OSError, docker.errors.DockerException):
                    pass
                if self._process.poll() is not None or time.monotonic() > deadline:
                    tail = (self._root / "dockerd.log").read_text(errors="replace")[-600:]
                    self.__exit__(None, None, None)
                    raise EngineUnavailable(f"dockerd did not start: {tail}") from None
                time.sleep(0.1)

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._process is not None and self._process.poll() is None:
            # SIGTERM: dockerd stops its containers and containerd, and unmounts.
            self._process.send_signal(signal.SIGTERM)
            try:
                self._process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        if self._killed:
            _kill_leftovers(str(self._root))
        # dockerd leaves its network namespace mounted under the exec root.
        with open("/proc/self/mounts") as mounts:
            points = [line.split()[1] for line in mounts if str(self._root) in line]
        for point in sorted(points, reverse=True):
            subprocess.run(["umount", "--lazy", point], check=False, capture_output=True)
        shutil.rmtree(self._root, ignore_errors=True)

    def kill(self) -> None:
        """SIGKILL dockerd, as a crash would: containerd, its shims and the containers keep
        running, until the end of the `with` block kills them."""
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            self._killed = True

    def client(self) -> docker.DockerClient:
        """A new client of this engine; close it when done."""
        return docker.DockerClient(base_url=self.host, version="auto")

    def import_busybox(self, tag: str = BUSYBOX_IMAGE) -> str:
        """Import the host's static busybox as image `tag`; returns the tag."""
        busybox = next((path for path in _BUSYBOX_PATHS if os.path.exists(path)), None)
        if busybox is None:
            raise EngineUnavailable("busybox is not installed (Debian: busybox-static)")
        applets = subprocess.run(
            [busybox, "--list"], check=True, capture_output=True, text=True
        ).stdout.split()
        archive = io.BytesIO()
        with tarfile.open(fileobj=archive, mode="w") as tar:
            for folder, mode in (("bin", 0o755), ("tmp", 0o1777), ("workspace", 0o755),
                                 ("etc", 0o755)):  # fmt: skip
                entry = tarfile.TarInfo(folder)
                entry.type, entry.mode = tarfile.DIRTYPE, mode
                tar.addfile(entry)
            tar.add(busybox, "bin/busybox")
            for applet in applets:
                if applet != "busybox":
                    link = tarfile.TarInfo(f"bin/{applet}")
                    link.type, link.linkname = tarfile.SYMTYPE, "busybox"
                    tar.addfile(link)
            passwd = b"root:x:0:0::/:/bin/sh\nnobody:x:65534:65534::/:/bin/sh\n"
            entry = tarfile.TarInfo("etc/passwd")
            entry.size = len(passwd)
            tar.addfile(entry, io.BytesIO(passwd))
        repository, _, version = tag.partition(":")
        with contextlib.closing(self.client()) as client:
            client.api.import_image_from_data(
                archive.getvalue(), repository=repository, tag=version or "latest"
            )
        return tag
