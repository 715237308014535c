"""What every sandbox sees of the host's system, and how a process is started under limits. Pure."""

from __future__ import annotations

SYSTEM_BINDS = ("--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin", "--symlink",
                "usr/sbin", "/sbin", "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64",
                "/lib64", "--ro-bind-try", "/etc/alternatives", "/etc/alternatives")  # fmt: skip
"""bubblewrap's arguments for /usr (and the /bin, /lib links into it) read-only."""

PRLIMIT = "/usr/bin/prlimit"

Rlimits = tuple[tuple[str, int, int, int], ...]
"""(prlimit option, resource, soft, hard) of each resource limit."""


def limited_argv(rlimits: Rlimits, argv: list[str]) -> list[str]:
    """`argv` started under the rlimits, by prlimit rather than a Python `preexec_fn`, which
    would force a fork of the whole service (about 17 ms here) for every start."""
    limits = (f"--{name}={soft}:{hard}" for name, _, soft, hard in rlimits)
    return [PRLIMIT, *limits, "--", *argv]
