"""The embedded stack through the real `helmline` command: up, status, up again, down, and
two stacks side by side. Every process is real; every wait is a condition with a deadline."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from helmline.cli._processes import wait_until

pytestmark = pytest.mark.stack

COMPONENTS = {"nats", "postgres", "planner", "tool-gateway", "state", "approval", "sandbox", "api"}
HELMLINE = Path(sys.executable).parent / "helmline"
# Generous: on a busy 2-core machine six Python services start side by side.
COMMAND_TIMEOUT = 180.0


@dataclass(frozen=True)
class Recorded:
    """A process as `stack.json` records it."""

    name: str
    pid: int
    create_time: float

    def alive(self) -> bool:
        try:
            process = psutil.Process(self.pid)
            # A stopped process whose parent has not reaped it is dead all the same.
            return (
                abs(process.create_time() - self.create_time) < 0.05
                and process.status() != psutil.STATUS_ZOMBIE
            )
        except psutil.NoSuchProcess:
            return False


@dataclass(frozen=True)
class Stack:
    """One data folder, and the `helmline` command pointed at it."""

    data_dir: Path
    env: dict[str, str]

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(HELMLINE), *args, "--data-dir", str(self.data_dir)],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT,
            check=False,
        )

    def start(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [str(HELMLINE), *args, "--data-dir", str(self.data_dir)],
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def up(self) -> subprocess.CompletedProcess[str]:
        result = self.run("up")
        assert result.returncode == 0, _explain(result, self.data_dir)
        return result

    def status(self) -> tuple[int, dict[str, Any]]:
        result = self.run("status", "--json")
        return result.returncode, json.loads(result.stdout)

    def record(self) -> dict[str, Any]:
        loaded: dict[str, Any] = json.loads((self.data_dir / "stack.json").read_text())
        return loaded

    def processes(self) -> list[Recorded]:
        return [
            Recorded(c["name"], c["process"]["pid"], c["process"]["create_time"])
            for c in self.record()["components"]
            if c["process"] is not None
        ]


def processes_inside(folder: Path) -> list[psutil.Process]:
    """Live processes working in `folder`: the stack's processes and any children they made
    (services, nats-server and PostgreSQL all run with their working folder there)."""
    found = []
    for process in psutil.process_iter():
        try:
            if process.status() != psutil.STATUS_ZOMBIE and Path(process.cwd()).is_relative_to(
                folder
            ):
                found.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def eventually(condition: Callable[[], bool], *, timeout: float = 30.0) -> None:
    assert wait_until(condition, timeout=timeout), f"not within {timeout} s: {condition}"


def _explain(result: subprocess.CompletedProcess[str], data_dir: Path) -> str:
    logs = data_dir / "logs"
    tails = ""
    if logs.is_dir():
        for log in sorted(logs.glob("*.log")):
            tails += f"\n--- {log.name}\n" + "\n".join(log.read_text().splitlines()[-15:])
    return f"exit {result.returncode}\n{result.stdout}\n{result.stderr}{tails}"


@pytest.fixture
def new_stack() -> Iterator[Callable[[], Stack]]:
    """Make stacks in fresh data folders; whatever a test leaves running is stopped after it."""
    # The environment's own HELMLINE_* settings (an external NATS, say) must not leak in.
    env = {k: v for k, v in os.environ.items() if not k.startswith("HELMLINE_")}
    made: list[Stack] = []

    def make() -> Stack:
        # Not pytest's tmp_path: `up` opens the folder's parents to PostgreSQL's
        # unprivileged user when run as root, and pytest resets its own root's mode.
        stack = Stack(Path(tempfile.mkdtemp(prefix="helmline-stack-")), env)
        made.append(stack)
        return stack

    yield make
    for stack in made:
        stack.run("down")
        shutil.rmtree(stack.data_dir, ignore_errors=True)


def test_lifecycle_of_one_stack(new_stack: Callable[[], Stack]) -> None:
    stack = new_stack()
    started = stack.up()
    # A new data folder's first stack has a sample session waiting for an approval.
    assert "Sample session" in started.stdout
    assert "helmline approve" in started.stdout

    code, status = stack.status()
    assert code == 0, status
    assert states(status) == dict.fromkeys(COMPONENTS, "healthy")
    # The API is listed where people reach it, not at its health port.
    (api,) = [c for c in status["components"] if c["name"] == "api"]
    assert api["address"] == status["api_url"] != f"http://127.0.0.1:{api['health_port']}"
    first = stack.processes()
    dev_key = check_api_keys(stack, started.stdout)
    assert all(p.alive() for p in first)

    again = stack.up()
    assert "already running" in again.stdout
    assert stack.processes() == first

    # A stack with a dead process is stale: `up` clears away the rest and starts anew.
    victim = next(p for p in first if p.name == "planner")
    os.kill(victim.pid, signal.SIGKILL)
    eventually(lambda: not victim.alive())
    code, status = stack.status()
    assert code == 1
    assert states(status)["planner"] == "stopped"
    restarted = stack.up()  # `up` succeeds only once every component is ready.
    assert dev_key in restarted.stdout  # The data folder's key is kept, and still valid.
    assert "Sample session" not in restarted.stdout  # The log has its sessions already.
    assert not any(p.alive() for p in first), [p for p in first if p.alive()]
    second = stack.processes()
    assert {p.pid for p in second}.isdisjoint({p.pid for p in first})

    stack.run("down")
    assert not any(p.alive() for p in second), [p for p in second if p.alive()]
    assert processes_inside(stack.data_dir) == []
    assert not (stack.data_dir / "stack.json").exists()

    repeated = stack.run("down")
    assert repeated.returncode == 0, repeated.stderr
    assert "Nothing is running" in repeated.stdout


def check_api_keys(stack: Stack, printed: str) -> str:
    """`up` printed an admin key, kept it readable by its owner only, and it works; the
    console address carries it; `keys create` makes keys of other tenants and roles."""
    key_file = stack.data_dir / "api-key"
    dev_key = key_file.read_text().strip()
    assert dev_key in printed
    assert key_file.stat().st_mode & 0o777 == 0o600
    api_url = stack.record()["api_url"]
    assert stack.run("console").stdout.strip() == f"{api_url}/#key={dev_key}"
    admin = {"Authorization": f"Bearer {dev_key}"}

    def sample_listed() -> bool:
        sessions = httpx.get(f"{api_url}/sessions", headers=admin).json()
        return [s["status"] for s in sessions] == ["waiting"]

    eventually(sample_listed)
    made = stack.run(
        "keys", "create", "--tenant", "acme", "--role", "viewer", "-p", "repo.write", "--json"
    )
    assert made.returncode == 0, made.stderr
    key = json.loads(made.stdout)["key"]
    me = httpx.get(f"{api_url}/me", headers={"Authorization": f"Bearer {key}"}).json()
    assert (me["tenant"], me["roles"]) == ("acme", ["repo.write", "viewer"])
    refused = stack.run("keys", "create", "--tenant", "Bad Tenant", "--role", "viewer")
    assert refused.returncode == 2
    assert "tenant" in refused.stderr
    not_a_permission = stack.run("keys", "create", "-t", "acme", "-r", "viewer", "-p", "admin")
    assert not_a_permission.returncode == 2
    assert "permissions" in not_a_permission.stderr
    return dev_key


def test_two_stacks_side_by_side_and_racing_ups(new_stack: Callable[[], Stack]) -> None:
    left, right = new_stack(), new_stack()
    # Two `up`s race for the left folder while the right one starts its own stack.
    # No sample sessions: three at once would only load the machine.
    starting = [left.start("up", "--no-sample") for _ in range(2)] + [
        right.start("up", "--no-sample")
    ]
    outputs = [process.communicate(timeout=COMMAND_TIMEOUT) for process in starting]
    assert [process.returncode for process in starting] == [0, 0, 0], outputs
    assert ["already running" in stdout for stdout, _ in outputs].count(True) == 1, outputs

    statuses = [left.status(), right.status()]
    assert [code for code, _ in statuses] == [0, 0], statuses
    addresses = [{c["address"] for c in status["components"]} for _, status in statuses]
    assert addresses[0].isdisjoint(addresses[1])

    stopped = left.processes()
    left.run("down")
    assert not any(p.alive() for p in stopped)
    assert processes_inside(left.data_dir) == []
    code, status = right.status()
    assert code == 0, status


def states(status: dict[str, Any]) -> dict[str, str]:
    return {c["name"]: c["state"] for c in status["components"]}


@pytest.mark.parametrize(
    ("option", "expected"),
    [
        # A server: pg_ctl fails, and PostgreSQL's own log says why.
        ("--pg-port", ["could not start PostgreSQL", "Address already in use"]),
        # A service: it exits once every server is up, and its log is shown.
        ("--api-port", ["api exited", "api.log", "address already in use"]),
    ],
)
def test_a_port_taken_fails_up_with_the_reason_and_leaves_nothing(
    new_stack: Callable[[], Stack], option: str, expected: list[str]
) -> None:
    stack = new_stack()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        result = stack.run("up", option, str(taken.getsockname()[1]))

    assert result.returncode == 1, result.stdout
    for text in expected:
        assert text in result.stderr
    assert not (stack.data_dir / "stack.json").exists()
    assert processes_inside(stack.data_dir) == []
