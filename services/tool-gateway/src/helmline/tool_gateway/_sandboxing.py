"""What a stdio MCP server may touch, as the servers file declares it, and the bubblewrap
command line that holds it to that. Pure.

```yaml
    sandbox:
      network: [api.example.com:443, 127.0.0.1:5432]   # none unless named
      read: [/srv/models]          # besides the system and the server's own install
      write: [/srv/cache]          # besides its own folder
      memory_mb: 512               # data segment (heap) of each of its processes
      folder_mb: 64                # its own folder's size
```

Inside: /usr (and /bin, /lib linked into it) read-only, the few files of /etc programs need
(never /etc/shadow), a fresh /proc, /dev and /tmp, its own empty folder `/home/mcp` (a tmpfs,
gone when it stops; its HOME and working folder unless `cwd` says otherwise), read-only
everything else it is given: the folder its command is installed in (`.../venv` for
`.../venv/bin/python`, `.../nodejs` for `.../nodejs/bin/node`, the same for where a link of
the command points), each argument that is an absolute path to something that exists, its
`cwd`, and `read:`; writable `write:` only. The root itself is read-only. Its processes hold
no capability, live in their own pid, ipc, uts and network namespaces (loopback only: the
named destinations are reached through `helmline.confinement`'s egress forwarder and proxy),
and die with the gateway. Its environment is what the servers file names, over `PATH`,
`HOME`, `TMPDIR` and `LANG`; nothing of the gateway's.
"""

from __future__ import annotations

import posixpath
import resource
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath

from pydantic import BaseModel, ConfigDict, Field, field_validator

from helmline.confinement import (
    SYSTEM_BINDS,
    Destination,
    Egress,
    checked_destinations,
    limited_argv,
)

OWN_FOLDER = "/home/mcp"
"""The server's own writable folder, inside its sandbox."""
SEARCH_PATH = "/usr/local/bin:/usr/bin:/bin"
_ETC = ("/etc/passwd", "/etc/group", "/etc/nsswitch.conf", "/etc/ld.so.cache",
        "/etc/localtime", "/etc/ssl", "/etc/ca-certificates")  # fmt: skip
"""What of /etc programs read: users' names, the linker's cache, the time zone, certificates."""
_SEEN_ANYWAY = PurePosixPath("/usr")


def _absolute(paths: tuple[str, ...], field: str) -> tuple[str, ...]:
    for path in paths:
        if not path.startswith("/") or ".." in PurePosixPath(path).parts:
            raise ValueError(f"{field}: {path!r} is not an absolute path without `..`")
    return tuple(posixpath.normpath(path) for path in paths)


class ServerSandbox(BaseModel):
    """What one stdio server may touch beyond its own folder (see the module's docstring)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    network: tuple[str, ...] = ()
    """`host:port`s it may connect to: host names, or loopback addresses (127.x.x.x)."""
    read: tuple[str, ...] = ()
    """Host paths it may read (absolute), seen at the same place."""
    write: tuple[str, ...] = ()
    """Host paths it may write (absolute), seen at the same place."""
    memory_mb: int | None = Field(default=None, ge=16, le=1 << 20)
    """The data segment each of its processes may grow to (RLIMIT_DATA); none: no limit."""
    folder_mb: int = Field(default=64, ge=1, le=1 << 16)
    """Size of its own folder (memory-backed)."""

    @field_validator("network")
    @classmethod
    def _destinations(cls, network: tuple[str, ...]) -> tuple[str, ...]:
        return checked_destinations(network, "network")

    @field_validator("read")
    @classmethod
    def _readable(cls, paths: tuple[str, ...]) -> tuple[str, ...]:
        return _absolute(paths, "read")

    @field_validator("write")
    @classmethod
    def _writable(cls, paths: tuple[str, ...]) -> tuple[str, ...]:
        paths = _absolute(paths, "write")
        for path in paths:
            if path == "/" or PurePosixPath(path).is_relative_to(_SEEN_ANYWAY):
                raise ValueError(f"write: {path!r} would let the server change the system")
        return paths

    @property
    def destinations(self) -> tuple[Destination, ...]:
        return tuple(Destination.parse(text) for text in self.network)


@dataclass(frozen=True, slots=True)
class Start:
    """What starts one sandboxed server: the command line, and its environment."""

    argv: list[str]
    env: dict[str, str]


def sandboxed_start(
    bwrap: str,
    sandbox: ServerSandbox,
    *,
    command: str,
    command_folders: Iterable[str],
    args: Iterable[str],
    existing_paths: Iterable[str],
    cwd: str | None,
    env: Mapping[str, str],
    inherited: Iterable[str],
    as_root: bool,
    egress: Egress | None,
) -> Start:
    """The command line that runs `command args` confined to `sandbox`.

    `existing_paths`: the arguments that are absolute paths to something that exists
    (read-only inside). `env`: the server's own variables, secrets resolved; passed in the
    environment of bubblewrap, never on its command line (readable by everyone). `inherited`:
    the variables the MCP SDK adds to every server's environment, unset unless set here.
    """
    args = list(args)
    folder = str(PurePosixPath(command).parent)
    environment = {
        "PATH": f"{folder}:{SEARCH_PATH}",
        "HOME": OWN_FOLDER,
        "TMPDIR": "/tmp",
        "LANG": "C.UTF-8",
        **env,
    }
    argv = [bwrap, *SYSTEM_BINDS]
    for path in _ETC:
        argv += ["--ro-bind-try", path, path]
    argv += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    argv += ["--size", str(sandbox.folder_mb * 1024 * 1024), "--tmpfs", OWN_FOLDER]
    readable = [*command_folders, *existing_paths, *([cwd] if cwd else []), *sandbox.read]
    for path in dict.fromkeys(readable):
        if path not in sandbox.write:
            argv += ["--ro-bind", path, path]
    for path in sandbox.write:
        argv += ["--bind", path, path]
    if egress is not None:
        argv += egress.binds()
    argv += ["--remount-ro", "/", "--chdir", cwd or OWN_FOLDER]
    argv += ["--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    if egress is not None:
        argv += egress.capabilities()
    if as_root:
        # bubblewrap runs set up as root without a user namespace (which would map the
        # sandbox to host root with every capability in it); the server keeps uid 0 with no
        # capability, so it reaches only what is bound in, and cannot write what is bound
        # read-only.
        argv += ["--unshare-ipc", "--unshare-pid", "--unshare-uts", "--unshare-net"]
        argv.append("--unshare-cgroup-try")
    else:
        argv.append("--unshare-all")
    for name in inherited:
        if name not in environment:
            argv += ["--unsetenv", name]
    argv.append("--")
    if egress is not None:
        argv += egress.command_prefix()
    argv += [command, *args]
    if sandbox.memory_mb is not None:
        data = sandbox.memory_mb * 1024 * 1024
        argv = limited_argv((("data", resource.RLIMIT_DATA, data, data),), argv)
    return Start(argv, environment)
