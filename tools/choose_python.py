"""Print the Python interpreter `make install` builds the virtual environment from.

Every Helmline service is a Python process that spends its time in the interpreter, so how
the interpreter was built shows in every figure: an optimised CPython (profile-guided, as
Debian's, Ubuntu's and the official container images' are) runs the services on 20-25 %
less processor time than one built with a plain `./configure --enable-shared`, the default
of pyenv and of many hand-built interpreters (measured on a 200-step session: planner
0.95 against 0.72-0.82 ms a step, state service 0.71 against 0.41-0.49).

Of the interpreters found (`python3` on PATH first, the user's choice), the first that is
3.11 or newer, can make a virtual environment and is optimised is chosen; when none is
optimised, the first usable one. `make PYTHON=...` overrides the choice.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

CANDIDATES = (
    "python3",
    "python3.14",
    "python3.13",
    "python3.12",
    "python3.11",
    "/usr/local/bin/python3",
    "/usr/bin/python3",
)

# Run by each candidate: its version, whether it can make a venv, and whether it is
# optimised. A build with profile-guided optimisation says so in its configure arguments,
# except distributions' own builds, which configure a shared library but link the
# interpreter statically with their own optimisations: no libpython is mapped into them.
PROBE = """
import json, sys, sysconfig
try:
    import ensurepip, venv
    makes_venv = True
except ImportError:
    makes_venv = False
try:
    with open("/proc/self/maps") as maps:
        shared = any("libpython" in line for line in maps)
except OSError:
    shared = True
optimised = "--enable-optimizations" in (sysconfig.get_config_var("CONFIG_ARGS") or "")
print(json.dumps({
    "version": list(sys.version_info[:2]),
    "makes_venv": makes_venv,
    "optimised": optimised or not shared,
}))
"""


def probe(executable: str) -> dict[str, object] | None:
    """What the interpreter says of itself, or None if it does not run."""
    try:
        answer = subprocess.run(
            [executable, "-c", PROBE], capture_output=True, text=True, timeout=20, check=True
        )
        found: dict[str, object] = json.loads(answer.stdout)
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    return found


def usable(executables: list[str]) -> list[tuple[str, bool]]:
    """Each interpreter that can hold Helmline, with whether it is optimised, in order."""
    found = []
    for executable in executables:
        about = probe(executable)
        if about is None or not about["makes_venv"]:
            continue
        if tuple(about["version"]) < (3, 11):  # type: ignore[arg-type]
            continue
        found.append((executable, bool(about["optimised"])))
    return found


def main() -> None:
    executables: list[str] = []
    for candidate in CANDIDATES:
        path = shutil.which(candidate)
        if path is not None and os.path.realpath(path) not in map(os.path.realpath, executables):
            executables.append(path)
    found = usable(executables)
    if not found:
        sys.exit("no Python 3.11 or newer with venv found: install python3 and python3-venv")
    optimised = [executable for executable, fast in found if fast]
    print(optimised[0] if optimised else found[0][0])


if __name__ == "__main__":
    main()
