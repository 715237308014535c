"""The bubblewrap command line that confines one call. Pure.

Inside: /usr (and the /bin, /lib links into it) read-only, fresh /proc, /dev and a private
/tmp, the session workspace at /workspace as the only writable host folder, nothing else of
the host (no /root, no /home, no other workspace, no /etc beyond what programs need), no
network unless granted, no capabilities, a clean environment and an unprivileged uid. Parts
of the workspace a profile keeps read-only are mounted so, and blocked ones are covered by an
empty read-only folder or file.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Literal

from helmline.confinement import SYSTEM_BINDS, Egress

WORKSPACE_MOUNT = "/workspace"
SEARCH_PATH = "/usr/local/bin:/usr/bin:/bin"
ENVIRONMENT: dict[str, str] = {
    "PATH": SEARCH_PATH,
    "HOME": WORKSPACE_MOUNT,
    "TMPDIR": "/tmp",
    "LANG": "C.UTF-8",
}
"""The whole environment a command sees: nothing of the service's leaks in."""
SETPRIV = "/usr/bin/setpriv"
SHELL = "/bin/sh"

_NAME_SERVICE = ("/etc/resolv.conf", "/etc/hosts", "/etc/nsswitch.conf", "/etc/ssl",
                 "/etc/ca-certificates")  # fmt: skip
"""What a program needs to resolve names and check certificates, bound only with a network."""


@dataclass(frozen=True, slots=True)
class Mask:
    """A part of the workspace that a command sees otherwise than it is."""

    path: PurePosixPath
    """Where, relative to the workspace."""
    kind: Literal["read_only", "blocked_folder", "blocked_file"]
    """Mounted read-only, or covered by an empty read-only folder or file."""
    fd: int | None = None
    """For `read_only`, a descriptor of the part (opened without following links), bound
    over it; for `blocked_file`, an empty source (/dev/null) the stand-in is filled from."""


@dataclass(frozen=True, slots=True)
class Confinement:
    """What one call may touch."""

    workspace: Path
    """The session's workspace on the host."""
    network: bool
    """Whether the call keeps the host's network (policy granted it)."""
    uid: int | None
    """The host uid the command runs as, switched to inside the sandbox; None when the
    service is not root and the command keeps the service's own uid."""
    tmp_size_mb: int
    """Size of the private /tmp."""
    masks: tuple[Mask, ...] = ()
    """Parts of the workspace seen otherwise, each after any mask that holds it."""
    egress: Egress | None = None
    """With `network`: the network is the sandbox's own, and only the destinations of this
    egress (whose proxy runs for the call) are reached, through its forwarder."""

    @property
    def host_network(self) -> bool:
        """Whether the command keeps the host's network: granted one, with no egress."""
        return self.network and self.egress is None


def bwrap_argv(
    bwrap: str,
    confinement: Confinement,
    command: str,
    unset: str,
    held: tuple[int, int] | None = None,
) -> list[str]:
    """The argv that runs `/bin/sh -c command` confined, its environment bubblewrap's less
    the variable `unset`, with the variables of `ENVIRONMENT` set over it.

    With `held` (info fd, block fd), bubblewrap writes its sandbox's pid to the first once
    the sandbox exists, and starts the command only once the second can be read.
    """
    argv = [bwrap, *SYSTEM_BINDS]
    if held is not None:
        argv += ["--info-fd", str(held[0]), "--block-fd", str(held[1])]
    egress = confinement.egress if confinement.network else None
    if confinement.host_network:
        for path in _NAME_SERVICE:
            argv += ["--ro-bind-try", path, path]
    if egress is not None:
        # Its own hosts file names the allowed hosts; no resolver is reachable anyway.
        for path in _NAME_SERVICE:
            if path not in ("/etc/resolv.conf", "/etc/hosts"):
                argv += ["--ro-bind-try", path, path]
        argv += egress.binds()
    argv += ["--proc", "/proc", "--dev", "/dev"]
    # Sticky and writable by all, like a host's /tmp: the command's uid is not its owner.
    argv += ["--perms", "1777", "--size", str(confinement.tmp_size_mb * 1024 * 1024)]
    argv += ["--tmpfs", "/tmp"]
    argv += ["--bind", str(confinement.workspace), WORKSPACE_MOUNT, "--chdir", WORKSPACE_MOUNT]
    for mask in confinement.masks:
        place = f"{WORKSPACE_MOUNT}/{mask.path}"
        match mask.kind:
            case "read_only":
                # Bound from the descriptor, not the host path: a link swapped in since it
                # was opened cannot bring a host file into the sandbox.
                argv += ["--ro-bind-fd", str(mask.fd), place]
            case "blocked_folder":
                argv += ["--tmpfs", place, "--remount-ro", place]
            case "blocked_file":
                # Not /dev/null bound over it: bubblewrap's binds are nodev, so reading it
                # would fail instead of finding nothing.
                argv += ["--perms", "0444", "--ro-bind-data", str(mask.fd), place]
    # Not --clearenv: bubblewrap is started with nothing in its environment but the call's
    # own variables (a secret's value among them: an environment is readable only by its
    # owner, an argv by everyone) and the marker of the call's processes, which goes.
    argv += ["--die-with-parent", "--new-session", "--unsetenv", unset]
    for name, value in ENVIRONMENT.items():
        argv += ["--setenv", name, value]
    if confinement.uid is None:
        # Unprivileged: bubblewrap needs a user namespace, mapping the service's uid to
        # itself; nothing can raise it.
        argv += ["--unshare-all", "--cap-drop", "ALL"]
        if confinement.host_network:
            argv.append("--share-net")
        prefix = egress.command_prefix() if egress is not None else []
        return [*argv, "--", *prefix, SHELL, "-c", command]
    # As root, bubblewrap makes the namespaces without a user namespace (which would map
    # the sandbox to host root), keeping only what setpriv needs to become the session's
    # uid; from then on the command holds no capability, and no-new-privs (set by
    # bubblewrap) stops setuid programs from giving any back.
    argv += ["--unshare-ipc", "--unshare-pid", "--unshare-uts", "--unshare-cgroup-try"]
    if not confinement.host_network:
        argv.append("--unshare-net")
    argv += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    if egress is not None:
        # The forwarder's, to watch; it starts setpriv without them.
        argv += egress.capabilities()
    if egress is not None:
        # The forwarder starts the command as the session's uid (it runs as root before).
        return [*argv, "--", *egress.command_prefix(confinement.uid), SHELL, "-c", command]
    uid = str(confinement.uid)
    return [
        *argv,
        "--",
        SETPRIV,
        f"--reuid={uid}",
        f"--regid={uid}",
        "--clear-groups",
        "--inh-caps=-all",
        "--",
        SHELL,
        "-c",
        command,
    ]


def session_uid(tenant: str, session_id: str, base: int, count: int) -> int:
    """The host uid of a session's commands: stable, and different between sessions
    except for rare collisions (which share only the per-uid process count)."""
    digest = hashlib.sha256(f"{tenant}/{session_id}".encode()).digest()
    return base + int.from_bytes(digest[:8], "big") % count
