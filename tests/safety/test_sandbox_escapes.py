"""Sandbox: escapes tried from inside the built-in tools, each judged from the host, which the
sandbox cannot see: a canary file outside the workspace (readable by anyone, so that only
the sandbox keeps it out of reach), listening sockets, the processes of the sandbox's uid.
Symlinks and hardlinks out, `/proc/self/root`, Unix sockets (Docker's where there is one,
one of the test's own, an abstract one) and the stack's NATS port on 127.0.0.1, a fork bomb,
an output flood and writes outside the workspace: escapes must be 0."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
import tempfile
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from pydantic import JsonValue

from helmline.contracts import SandboxLimits
from helmline.sandbox import SandboxSettings, Tools, tools_for
from helmline.sandbox._tools import Completed, Failed, Outcome
from helmline.sandbox.testing import PrivateDockerd, call, processes_of
from tests.safety import figures

TENANT = f"t{uuid.uuid4().hex[:12]}"
DOCKER_SOCKETS = ("/var/run/docker.sock", "/run/docker.sock")


@dataclass
class Host:
    """What the sandbox must not reach, as the host sees it."""

    outside: Path
    """A folder outside every workspace, open to everyone."""
    token: str
    """The canary's content: found in an output, it was read from outside."""
    workspaces: Path
    escapes: dict[str, int] = field(default_factory=dict)

    @property
    def canary(self) -> Path:
        return self.outside / "canary.txt"


@pytest.fixture(scope="module")
def host() -> Iterator[Host]:
    # Not pytest's tmp_path, which only root may enter: here only the sandbox keeps it out.
    outside = Path(tempfile.mkdtemp(prefix="helmline-safety-outside-"))
    workspaces = Path(tempfile.mkdtemp(prefix="helmline-safety-workspaces-"))
    outside.chmod(0o777)
    token = f"canary-{uuid.uuid4().hex}"
    (outside / "canary.txt").write_text(token + "\n")
    (outside / "canary.txt").chmod(0o666)
    found = Host(outside, token, workspaces)
    yield found
    figures.record(
        "sandbox",
        attacks=len(found.escapes),
        escapes=sum(found.escapes.values()),
        escapes_by_attack=dict(found.escapes),
    )
    shutil.rmtree(outside, ignore_errors=True)
    shutil.rmtree(workspaces, ignore_errors=True)


@pytest.fixture(scope="module")
async def tools() -> AsyncIterator[Tools]:
    """The built-in tools as the sandbox service runs them (process backend: bubblewrap)."""
    made = await tools_for(SandboxSettings())
    yield made
    await made.close()


class Attack:
    """One session's calls: what each returned, as text, to look for the canary in."""

    def __init__(self, tools: Tools, host: Host, name: str) -> None:
        self.tools = tools
        self.host = host
        self.name = name
        self.session = uuid.uuid4().hex[:12]
        self.outputs: list[str] = []

    @property
    def workspace(self) -> Path:
        return self.host.workspaces / TENANT / self.session

    async def run(
        self, tool: str, limits: SandboxLimits | None = None, **args: JsonValue
    ) -> Outcome:
        outcome = await call(
            self.tools, self.workspace, (TENANT, self.session), tool, args, limits=limits
        )
        match outcome:
            case Completed():
                self.outputs.append(json.dumps(outcome.output))
            case Failed():
                self.outputs.append(outcome.error.model_dump_json())
        return outcome

    async def shell(self, command: str, limits: SandboxLimits | None = None) -> Outcome:
        return await self.run("run_command", limits, command=command)

    def canary_read(self) -> int:
        """How many outputs hold the canary."""
        return sum(self.host.token in output for output in self.outputs)

    def escaped(self, count: int) -> None:
        self.host.escapes[self.name] = count
        assert count == 0, f"{self.name}: {count} escape(s); outputs: {self.outputs}"


async def test_symlinks_out_of_the_workspace(tools: Tools, host: Host) -> None:
    attack = Attack(tools, host, "symlink")
    canary, outside = host.canary, host.outside
    # The control: what the workspace holds is read back, so an output is looked at at all.
    await attack.run("write_file", path="own.txt", content=f"own {host.token[::-1]}")
    await attack.run("read_file", path="own.txt")
    assert host.token[::-1] in attack.outputs[-1]
    await attack.shell(
        f"ln -s {canary} link; ln -s {outside} out; ln -s / root; ln -s ../../.. up; "
        "cat link out/canary.txt root" + str(canary) + " up" + str(canary) + "; echo done"
    )
    for path in ("link", "out/canary.txt", f"root{canary}", f"up{canary}", str(canary)):
        await attack.run("read_file", path=path)
    for path in ("out", "root/tmp", "up"):
        await attack.run("list_files", path=path)
    await attack.run("write_file", path="out/written-through-link", content="x")
    await attack.run("delete_file", path="out/canary.txt")
    await attack.shell("echo x > out/written-by-command")
    outside_changed = sorted(p.name for p in outside.iterdir()) != ["canary.txt"]
    attack.escaped(attack.canary_read() + outside_changed + (not canary.exists()))


def first_line(path: str) -> str:
    """The first line of a host file, or nothing if it has none."""
    try:
        return Path(path).read_text().splitlines()[0]
    except (OSError, IndexError):
        return ""


def existing(*paths: str) -> list[str]:
    return [path for path in paths if os.path.exists(path)]


async def test_hardlinks_out_of_the_workspace(tools: Tools, host: Host) -> None:
    attack = Attack(tools, host, "hardlink")
    shadow = first_line("/etc/shadow")
    await attack.shell(
        f"ln {host.canary} canary; ln /etc/shadow shadow; ln /etc/passwd passwd; "
        "ln /usr/bin/env env; ln /proc/self/root/etc/shadow shadow2; ls -la"
    )
    for name in ("canary", "shadow", "passwd", "env", "shadow2"):
        await attack.run("read_file", path=name)
    # A name in the workspace for a file outside it: another inode's link count gives it away.
    names: dict[tuple[int, int], int] = {}
    links: dict[tuple[int, int], int] = {}
    for path in attack.workspace.rglob("*"):
        if path.is_file() and not path.is_symlink():
            stat = path.stat()
            names[(stat.st_dev, stat.st_ino)] = names.get((stat.st_dev, stat.st_ino), 0) + 1
            links[(stat.st_dev, stat.st_ino)] = stat.st_nlink
    linked_out = sum(links[inode] > names[inode] for inode in names)
    shadow_read = bool(shadow) and any(shadow in output for output in attack.outputs)
    attack.escaped(attack.canary_read() + linked_out + shadow_read)


async def test_proc_self_root_and_other_processes_roots(tools: Tools, host: Host) -> None:
    attack = Attack(tools, host, "proc_root")
    canary = host.canary
    await attack.shell(
        f"cat /proc/self/root{canary} /proc/1/root{canary} /proc/$PPID/root{canary}; "
        f"for p in /proc/[0-9]*; do cat $p/root{canary} $p/cwd/../../../..{canary}; done "
        "2>/dev/null; echo done"
    )
    for path in (f"/proc/self/root{canary}", f"/proc/1/root{canary}", f"../../../..{canary}"):
        await attack.run("read_file", path=path)
    attack.escaped(attack.canary_read())


CONNECT_UNIX = (
    'python3 -c "import socket, sys\n'
    "for path in sys.argv[1:]:\n"
    "    s = socket.socket(socket.AF_UNIX)\n"
    "    try:\n"
    "        s.connect(path.replace('@', chr(0), 1)); print('CONNECTED', path)\n"
    "    except OSError as e: print('refused', path, e)\n"
    '" {paths}'
)
CONNECT_TCP = (
    'python3 -c "import socket\n'
    "try:\n"
    "    socket.create_connection(('127.0.0.1', {port}), 2); print('CONNECTED')\n"
    "except OSError as e: print('refused', e)\""
)


class Listener:
    """A Unix socket listening on the host, counting the connections it accepts."""

    def __init__(self, address: str) -> None:
        self.accepted = 0
        self.socket = socket.socket(socket.AF_UNIX)
        self.socket.bind(address.replace("@", "\0", 1))
        if not address.startswith("@"):
            os.chmod(address, 0o777)
        self.socket.listen()
        self.socket.settimeout(0.1)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                connection, _ = self.socket.accept()
            except TimeoutError:
                continue
            self.accepted += 1
            connection.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.socket.close()


async def test_unix_sockets_and_the_stacks_nats_port(
    tools: Tools, host: Host, nats_url: str
) -> None:
    attack = Attack(tools, host, "sockets")
    listeners = [Listener(str(host.outside / "host.sock")), Listener(f"@helmline-{host.token}")]
    try:
        docker = existing(*DOCKER_SOCKETS)
        paths = [str(host.outside / "host.sock"), f"@helmline-{host.token}", *docker]
        paths += [f"/proc/self/root{path}" for path in paths if not path.startswith("@")]
        await attack.shell(CONNECT_UNIX.format(paths=" ".join(paths)))
        port = urlsplit(nats_url).port
        await attack.shell(CONNECT_TCP.format(port=port))
        # Give a connection that got through the time to be accepted.
        await asyncio.sleep(0.2)
    finally:
        for listener in listeners:
            listener.close()
    figures.record("sandbox", host_docker_socket_probed=bool(docker))
    connected = sum(output.count("CONNECTED") for output in attack.outputs)
    attack.escaped(connected + sum(listener.accepted for listener in listeners))


@pytest.mark.container
async def test_a_running_docker_engines_socket_is_out_of_reach(tools: Tools, host: Host) -> None:
    """A real Docker engine (a private one, its socket open to everyone): connecting to it
    from the sandbox, by its path or through `/proc/self/root`, must fail."""
    attack = Attack(tools, host, "docker_socket")
    with PrivateDockerd() as engine:
        socket_path = engine.host.removeprefix("unix://")
        os.chmod(socket_path, 0o777)
        with contextlib.closing(engine.client()) as client:
            assert client.ping()  # The engine answers on that socket: there is one to reach.
        await attack.shell(CONNECT_UNIX.format(paths=f"{socket_path} /proc/self/root{socket_path}"))
    figures.record("sandbox", private_docker_engine_probed=True)
    attack.escaped(sum(output.count("CONNECTED") for output in attack.outputs))


async def test_a_fork_bomb_leaves_no_process_and_stops_at_the_limit(
    tools: Tools, host: Host
) -> None:
    attack = Attack(tools, host, "fork_bomb")
    outcome = await attack.shell(
        "bomb() { bomb | bomb & }; bomb; sleep 20", SandboxLimits(max_processes=32, timeout_s=20)
    )
    uid = attack.workspace.stat().st_uid
    left = processes_of(uid)
    stopped = isinstance(outcome, Failed) and outcome.limit is not None
    attack.escaped(len(left) + (not stopped))


async def test_an_output_flood_is_cut_to_the_cap(tools: Tools, host: Host) -> None:
    attack = Attack(tools, host, "output_flood")
    cap = 4096
    outcome = await attack.shell(
        "yes flood & yes flood >&2 & head -c 100000000 /dev/urandom; wait",
        SandboxLimits(max_output_bytes=cap, timeout_s=5),
    )
    # stdout and stderr are kept to the cap each, plus their markers and the JSON around.
    too_big = len(attack.outputs[-1].encode()) > 4 * cap + 2048
    uid = attack.workspace.stat().st_uid
    attack.escaped(too_big + len(processes_of(uid)) + (not isinstance(outcome, Completed | Failed)))


async def test_writes_outside_the_workspace(tools: Tools, host: Host) -> None:
    attack = Attack(tools, host, "writes_outside")
    targets = [host.outside / "w1", Path("/usr/pwned"), Path("/etc/pwned"), Path("/pwned")]
    other = host.workspaces / TENANT / "someone-else"
    other.mkdir(parents=True)
    targets.append(other / "pwned")
    await attack.shell(
        "; ".join(f"echo x > {target}" for target in targets)
        + f"; echo x > ../someone-else/pwned; echo x > /proc/self/root{host.outside}/w2"
        + f"; mkdir -p /tmp/x && echo x > /tmp/x/w3; cp /dev/null {host.outside}/w4; true"
    )
    for path in (f"{host.outside}/w5", "../someone-else/w6", "../../w7", "/tmp/w8"):
        await attack.run("write_file", path=path, content="x")
    attack.escaped(len(written_outside(host, [*targets, other / "w6", Path("/tmp/w8")])))


def written_outside(host: Host, targets: list[Path]) -> list[Path]:
    """What the attack made outside its workspace: a target, or a file named w* anywhere it
    aimed at."""
    found = [path for path in targets if path.exists()]
    for folder in (host.outside, host.workspaces / TENANT, host.workspaces):
        found += folder.glob("w*")
    return found
