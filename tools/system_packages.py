"""The Debian packages a few tests need that no PyPI or npm package can give.

    python tools/system_packages.py        # `make test` runs it before pytest

Everything else the suite needs comes from PyPI and npm (`make install`, `make mcp-servers`).
What is missing of these is installed when this runs as root on a machine with apt-get
(`apt-get update` first); otherwise, or if that fails, it says what will be skipped and how to
install it, and the tests that need it are skipped by the root conftest, each with the same
reason, counted at the end of the run. Nothing here fails `make test`: a machine without a
browser still runs every other test. CI sets `HELMLINE_REQUIRE_SYSTEM_PACKAGES=1`, which turns
such a skip into a failure, so that CI never passes by skipping.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass

REQUIRE_VARIABLE = "HELMLINE_REQUIRE_SYSTEM_PACKAGES"


def _static_busybox() -> bool:
    # The container tests copy busybox into an image with nothing else: only a static one runs.
    for path in ("/bin/busybox", "/usr/bin/busybox"):
        if os.access(path, os.X_OK):
            linked = subprocess.run(["ldd", path], capture_output=True, text=True, check=False)
            return "not a dynamic" in linked.stdout + linked.stderr
    return False


@dataclass(frozen=True)
class SystemPackage:
    """A Debian package that some tests need."""

    name: str
    """The Debian package."""
    marker: str
    """The pytest marker of the tests that need it."""
    needed_by: str
    """Those tests, as a person calls them."""
    present: Callable[[], bool]

    @property
    def skip_reason(self) -> str:
        return f"Debian package {self.name} is missing (install: apt-get install -y {self.name})"


PACKAGES = (
    SystemPackage(
        "chromium",
        "browser",
        "the console's browser tests",
        lambda: os.access("/usr/bin/chromium", os.X_OK),
    ),
    SystemPackage(
        "docker.io",
        "container",
        "the container sandbox tests",
        lambda: (
            shutil.which("dockerd", path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin")
            is not None
        ),
    ),
    SystemPackage("busybox-static", "container", "the container sandbox tests", _static_busybox),
    SystemPackage(
        "fuse3",
        "fuse",
        "the power-loss test",
        lambda: (
            shutil.which("fusermount3", path=f"{os.environ.get('PATH', '')}:/usr/bin:/bin")
            is not None
        ),
    ),
)


def missing_packages() -> list[SystemPackage]:
    return [package for package in PACKAGES if not package.present()]


def main() -> int:
    missing = missing_packages()
    names = [package.name for package in missing]
    if missing and os.geteuid() == 0 and shutil.which("apt-get"):
        print(f"installing Debian packages some tests need: {' '.join(names)}", flush=True)
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for step in (["update"], ["install", "-y", "--no-install-recommends", *names]):
            if subprocess.run(["apt-get", *step], env=env, check=False).returncode != 0:
                print(f"apt-get {step[0]} failed", file=sys.stderr)
                break
        missing = missing_packages()
    for package in missing:
        print(f"{package.needed_by} will be skipped: {package.skip_reason}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
