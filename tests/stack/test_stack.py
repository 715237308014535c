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
from urllib.parse import urlsplit

import httpx
import psutil
import pytest

from helmline.cli._processes import wait_until
from helmline.contracts import EVENTS_STREAM, STREAMS
from helmline.runtime import connect_nats, nats_servers
from helmline.runtime.testing import free_port

pytestmark = pytest.mark.stack

COMPONENTS = {
    "nats",
    "postgres",
    "supervisor",
    "planner",
    "tool-gateway",
    "state",
    "approval",
    "sandbox",
    "api",
}
SUPERVISOR_RESTART_S = 2.0
"""The supervisor starts a dead service again within this."""
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
    # Durable by default: the server fsyncs each append before acknowledging it, and says so.
    assert status["durability"] == "durable"
    assert "durability: durable" in started.stdout
    assert "durability: durable" in stack.run("status").stdout
    # The record keeps the NATS admin's password in its URL; nothing printed shows it.
    password = urlsplit(stack.record()["nats_url"]).password
    assert password
    assert status["nats_url"].startswith("nats://127.0.0.1:")
    for printed in (stack.run("status", "--json").stdout, stack.run("status").stdout):
        assert password not in printed
    assert nats_config(stack)["jetstream"]["sync_interval"] == "always"
    # The key raw outputs are sealed with: made once, its owner's alone, printed nowhere.
    sealing = stack.data_dir / "sealing.key"
    assert sealing.stat().st_mode & 0o777 == 0o600
    sealing_key = sealing.read_text().strip()
    for printed in (stack.run("status", "--json").stdout, started.stdout, started.stderr):
        assert sealing_key not in printed
    assert sealing_key not in (stack.data_dir / "stack.json").read_text()
    # The API is listed where people reach it, not at its health port.
    (api,) = [c for c in status["components"] if c["name"] == "api"]
    assert api["address"] == status["api_url"] != f"http://127.0.0.1:{api['health_port']}"
    first = stack.processes()
    addresses = {c["name"]: c["address"] for c in status["components"]}
    dev_key = check_api_keys(stack, started.stdout)
    assert all(p.alive() for p in first)

    again = stack.up()
    assert "already running" in again.stdout
    assert stack.processes() == first

    # A service that dies is started again by the supervisor, on its ports, alone.
    victim = next(p for p in first if p.name == "planner")
    ports = health_ports(status)
    os.kill(victim.pid, signal.SIGKILL)
    eventually(lambda: planner_restarted(stack, victim), timeout=SUPERVISOR_RESTART_S)
    eventually(lambda: stack.status()[0] == 0)
    code, status = stack.status()
    (planner,) = [c for c in status["components"] if c["name"] == "planner"]
    assert (planner["restarts"], planner["last_exit_code"]) == (1, -signal.SIGKILL)
    assert health_ports(status) == ports
    assert [p for p in stack.processes() if p.pid != planner["pid"]] == [
        p for p in first if p != victim
    ]

    # With the supervisor dead too, `up` starts again only what stopped, where it ran.
    second = stack.processes()
    doomed = {p.name: p for p in second if p.name in ("supervisor", "nats", "sandbox")}
    for process in doomed.values():
        os.kill(process.pid, signal.SIGKILL)
    eventually(lambda: not any(p.alive() for p in doomed.values()))
    code, status = stack.status()
    assert code == 1
    assert {name for name, state in states(status).items() if state == "stopped"} == set(doomed)
    repaired = stack.up()
    assert "already running" in repaired.stdout
    assert sealing.read_text().strip() == sealing_key
    assert "Sample session" not in repaired.stdout
    third = stack.processes()
    assert [p for p in third if p.name not in doomed] == [p for p in second if p.name not in doomed]
    assert all(p.alive() for p in third)
    code, status = stack.status()
    assert code == 0, status
    assert health_ports(status) == ports
    assert {c["name"]: c["address"] for c in status["components"]} == addresses
    check_api_keys(stack, dev_key)

    # Options that differ from how the stack runs are refused, naming them.
    refused = stack.run("up", "--replicas", "2", "--api-port", str(free_port()))
    assert refused.returncode == 2, refused.stdout
    assert "--replicas 2 (it runs with 1)" in refused.stderr
    assert "--api-port" in refused.stderr
    assert stack.processes() == third

    stack.run("down")
    assert not any(p.alive() for p in third), [p for p in third if p.alive()]
    assert processes_inside(stack.data_dir) == []
    assert not (stack.data_dir / "stack.json").exists()

    repeated = stack.run("down")
    assert repeated.returncode == 0, repeated.stderr
    assert "Nothing is running" in repeated.stdout


def health_ports(status: dict[str, Any]) -> dict[str, int]:
    return {c["name"]: c["health_port"] for c in status["components"] if c["health_port"]}


def planner_restarted(stack: Stack, victim: Recorded) -> bool:
    (planner,) = [p for p in stack.processes() if p.name == "planner"]
    return planner != victim and planner.alive()


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
    # Two `up`s race for the left folder while the right one starts its own stack, relaxed.
    # No sample sessions: three at once would only load the machine.
    starting = [left.start("up", "--no-sample") for _ in range(2)] + [
        right.start("up", "--no-sample", "--durability", "relaxed")
    ]
    outputs = [process.communicate(timeout=COMMAND_TIMEOUT) for process in starting]
    assert [process.returncode for process in starting] == [0, 0, 0], outputs
    assert ["already running" in stdout for stdout, _ in outputs].count(True) == 1, outputs
    # Relaxed is a warning that says what it risks, at `up` and at every `status`.
    for shown in (outputs[2][0], right.run("status").stdout):
        assert "durability: relaxed. Warning:" in shown
        assert "lost on a power loss" in shown
    assert "sync_interval" not in nats_config(right)["jetstream"]

    statuses = [left.status(), right.status()]
    assert [code for code, _ in statuses] == [0, 0], statuses
    assert [status["durability"] for _, status in statuses] == ["durable", "relaxed"]
    addresses = [
        {c["address"] for c in status["components"] if "://" in c["address"]}
        for _, status in statuses
    ]
    assert addresses[0].isdisjoint(addresses[1])

    stopped = left.processes()
    left.run("down")
    assert not any(p.alive() for p in stopped)
    assert processes_inside(left.data_dir) == []
    code, status = right.status()
    assert code == 0, status


def nats_config(stack: Stack) -> dict[str, Any]:
    """The configuration `up` wrote for the stack's nats-server."""
    loaded: dict[str, Any] = json.loads((stack.data_dir / "nats-server.conf").read_text())
    return loaded


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


async def test_replicas_on_a_three_server_cluster(new_stack: Callable[[], Stack]) -> None:
    stack = new_stack()
    started = stack.run("up", "--no-sample", "--replicas", "2", "--nats-cluster", "3")
    assert started.returncode == 0, _explain(started, stack.data_dir)
    code, status = stack.status()
    assert code == 0, status
    services = COMPONENTS - {"nats", "postgres", "supervisor"}
    assert set(states(status)) == {
        "nats-1",
        "nats-2",
        "nats-3",
        "postgres",
        "supervisor",
        *(f"{service}-{replica}" for service in services for replica in (1, 2)),
    }
    assert len(set(health_ports(status).values())) == 2 * len(services)
    # Status shows the servers without the admin's password; the record keeps it.
    assert await stream_replicas(stack.record()["nats_url"]) == dict.fromkeys(
        (spec.name for spec in STREAMS), 3
    )
    assert run_to_completion(stack)

    # The server leading the events stream dies: while the others elect another (about
    # 6 s), a session started and followed by the CLI waits for them and goes on; `up`
    # brings the server back on its port.
    leader = await events_leader(stack.record()["nats_url"])
    (server,) = [p for p in stack.processes() if p.name == leader]
    os.kill(server.pid, signal.SIGKILL)
    eventually(lambda: not server.alive())
    assert run_to_completion(stack)
    stack.up()
    code, status = stack.status()
    assert code == 0, status
    (restarted,) = [c for c in status["components"] if c["name"] == leader]
    assert restarted["restarts"] == 1


async def stream_replicas(nats_url: str) -> dict[str, int]:
    connection = await connect_nats(nats_servers(nats_url))
    try:
        js = connection.jetstream()
        return {
            spec.name: (await js.stream_info(spec.name)).config.num_replicas or 1
            for spec in STREAMS
        }
    finally:
        await connection.close()


async def events_leader(nats_url: str) -> str:
    """The component name of the server leading the events stream (`nats-2`)."""
    connection = await connect_nats(nats_servers(nats_url))
    try:
        info = await connection.jetstream().stream_info(EVENTS_STREAM.name)
    finally:
        await connection.close()
    assert info.cluster is not None
    assert info.cluster.leader is not None
    # The servers are named helmline-1 .. helmline-3, their components nats-1 .. nats-3.
    return "nats-" + info.cluster.leader.rsplit("-", 1)[1]


def run_to_completion(stack: Stack) -> bool:
    """`helmline run --wait` of a playbook that needs no person ends completed (exit 0)."""
    playbook = Path(__file__).resolve().parents[2] / "examples" / "playbooks" / "echo.yaml"
    result = stack.run("run", "--playbook", str(playbook), "--wait")
    return result.returncode == 0 or pytest.fail(_explain(result, stack.data_dir))
