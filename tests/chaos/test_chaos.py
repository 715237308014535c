"""The chaos suite: exactly once under real faults, counted by a witness outside Helmline.

A stack as production runs it (`helmline up --replicas 2 --nats-cluster 3`, every process
real, the supervisor restarting what dies) runs sessions that mix sandboxed commands, MCP
calls over stdio and Streamable HTTP, parallel steps, approvals decided by the test while
faults go on, rollbacks and forks. Meanwhile the test SIGKILLs random service replicas,
kills a NATS server and brings it back, kills PostgreSQL and brings it back, kills an MCP
server under a gateway, and feeds the log malformed events.

Side effects are counted outside Helmline: each sandboxed command connects to the test's
own TCP listener, and each MCP call runs the test's own server, both writing one line per
real invocation to files the stack never reads. At the end every session ended as its
script says, each completed call left exactly one line and no call more than one, every log
folds, the read model agrees with the log, nothing is left in flight, and each poison event
was dead-lettered with its reason. One JSON line gives the figures. How long the work a
killed replica held waited for another is heard, not guessed from the sessions' logs: a tap
in a process of its own (`delivery_tap.py`) notes each delivery JetStream makes to the
services and each answer they send (see `takeover`).

Short by default (CI: `CHAOS_SESSIONS` 30, `CHAOS_KILLS` 10); `make chaos CHAOS_SESSIONS=100
CHAOS_KILLS=30` runs it long. `CHAOS_SEED` replays a run's choices.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import socketserver
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import httpx
import nats
import nats.errors
import psutil
import pytest
import yaml

from helmline.cli._processes import wait_until
from helmline.contracts import (
    SERVICE_CONSUMERS,
    Actor,
    ApprovalDecisionSubmitted,
    ApprovalRequested,
    PlanStep,
    Playbook,
    SessionStarted,
    SessionState,
    ToolCallCompleted,
    ToolCallFailed,
    ToolError,
    encode_event,
    event_subject,
    new_event,
)
from helmline.runtime import (
    EventStore,
    SessionSnapshot,
    StoredEvent,
    connect_nats,
    latest_tool_registry,
    nats_servers,
)
from helmline.runtime.testing import checkpointed, ended, eventually, free_port
from helmline.state import read_model_differences

pytestmark = [
    pytest.mark.stack,
    # The test's NATS client, whose server is killed under it, leaves errors of its
    # reconnecting tasks unretrieved; what matters is checked by the test itself.
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

SESSIONS = int(os.environ.get("CHAOS_SESSIONS", "30"))
KILLS = int(os.environ.get("CHAOS_KILLS", "10"))
SEED = int(os.environ.get("CHAOS_SEED", str(random.randrange(2**32))))
HELMLINE = Path(sys.executable).parent / "helmline"
WITNESS_SERVER = Path(__file__).with_name("witness_mcp_server.py")
DELIVERY_TAP = Path(__file__).with_name("delivery_tap.py")
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "chaos"
REQUESTER = Actor(id="chaos", roles=("operator",))
APPROVER = Actor(id="chaos-approver", roles=("approver",))
TENANT = "chaos"
KILL_PAUSE_S = (0.3, 1.4)
"""Pause between two faults, drawn uniformly: kills land at any moment of a step."""
SESSION_TIMEOUT_S = 120.0
LEADERLESS_S = 30.0
"""How long the test's own reads wait out a stream without a leader."""
SIGN_SLACK_S = 0.25
"""How long after a kill the delivery tap may still hear of a delivery to the replica killed
or a sign of life it sent before (what was on its way when the kill came)."""
STARTUP_TIMEOUT_S = 180.0
Kind = Literal["witnessed", "approved", "rollback", "fork"]
T = TypeVar("T")
KINDS: tuple[Kind, ...] = ("witnessed", "approved", "rollback", "fork", "witnessed")
POLICY = """
version: 1
description: The chaos suite's calls; one kind of command waits for a person.
rules:
  - name: witnessed-commands-asking
    tool: run_command
    arguments: {command: {regex: 'approve-me'}}
    effect: require_approval
    network: true
    approval: {roles: [approver], quorum: 1, expires_in: 30m}
  - {name: witnessed-commands, tool: run_command, effect: allow, network: true}
  - {name: the-rest, effect: allow}
"""


@dataclass
class Witness:
    """Files outside Helmline where the test's command listener and MCP server note each
    real invocation, one token a line."""

    folder: Path

    @property
    def files(self) -> tuple[Path, ...]:
        return (self.commands, self.stdio_calls, self.http_calls)

    @property
    def commands(self) -> Path:
        return self.folder / "commands.witness"

    @property
    def stdio_calls(self) -> Path:
        return self.folder / "stdio-calls.witness"

    @property
    def http_calls(self) -> Path:
        return self.folder / "http-calls.witness"

    def invocations(self) -> Counter[str]:
        seen: Counter[str] = Counter()
        for file in self.files:
            if file.exists():
                seen.update(line for line in file.read_text().splitlines() if line)
        return seen


class CommandWitness(socketserver.ThreadingTCPServer):
    """A listener on 127.0.0.1 that appends each line a sandboxed command sends it."""

    daemon_threads = True

    def __init__(self, file: Path) -> None:
        self.file = file
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), _NoteLine)

    @property
    def port(self) -> int:
        return int(self.server_address[1])


class _NoteLine(socketserver.StreamRequestHandler):
    server: CommandWitness

    def handle(self) -> None:
        token = self.rfile.readline().decode().strip()
        if token:
            with self.server.lock, self.server.file.open("a") as file:
                file.write(f"{token}\n")


@dataclass
class ChaosStack:
    """The stack the suite runs against, through the real `helmline` command."""

    data_dir: Path

    def helmline(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [str(HELMLINE), *args, "--data-dir", str(self.data_dir)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={k: v for k, v in os.environ.items() if not k.startswith("HELMLINE_")},
        )

    def run(self, *args: str, timeout: float = STARTUP_TIMEOUT_S) -> tuple[int, str, str]:
        process = self.helmline(*args)
        out, err = process.communicate(timeout=timeout)
        return process.returncode, out, err

    def record(self) -> dict[str, Any]:
        loaded: dict[str, Any] = json.loads((self.data_dir / "stack.json").read_text())
        return loaded

    def replicas_of_services(self) -> dict[str, list[str]]:
        """Each service's replicas by component name (`planner`: `planner-1`, `planner-2`)."""
        replicas: dict[str, list[str]] = {}
        for component in self.record()["components"]:
            if component["kind"] == "service":
                replicas.setdefault(component["service"], []).append(component["name"])
        return replicas

    def processes(self, kind: str) -> dict[str, int]:
        return {
            c["name"]: c["process"]["pid"]
            for c in self.record()["components"]
            if c["kind"] == kind and c["process"] is not None
        }


@dataclass
class Tally:
    """What happened during the run."""

    kills: Counter[str] = field(default_factory=Counter)
    service_kills: list[tuple[float, str]] = field(default_factory=list)
    """When (epoch seconds) each service replica was killed, and which (`planner-2`)."""
    service_backs: list[tuple[float, str]] = field(default_factory=list)
    """When (epoch seconds) a killed replica was ready again: a new process, its consumers
    receiving."""
    sessions: dict[str, Kind] = field(default_factory=dict)
    """Every session started, forks included, by what its script is."""
    forks: dict[str, str] = field(default_factory=dict)
    """Fork id by the session it was forked from."""
    rollbacks: dict[str, str] = field(default_factory=dict)
    """The rollback's exit (and output) by session."""
    acknowledged: list[str] = field(default_factory=list)
    """Ids of the events the test appended and JetStream acknowledged."""


@pytest.fixture(scope="module")
def witness() -> Iterator[Witness]:
    folder = Path(tempfile.mkdtemp(prefix="helmline-chaos-witness-"))
    yield Witness(folder)
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def command_witness(witness: Witness) -> Iterator[CommandWitness]:
    listener = CommandWitness(witness.commands)
    thread = threading.Thread(target=listener.serve_forever, daemon=True)
    thread.start()
    yield listener
    listener.shutdown()
    listener.server_close()


@pytest.fixture(scope="module")
def http_witness(witness: Witness) -> Iterator[str]:
    """The witness MCP server over Streamable HTTP, run by the test: the gateway's calls to
    it survive the gateway's death."""
    port = free_port()
    log = (witness.folder / "http-server.log").open("ab")
    process = subprocess.Popen(
        [sys.executable, str(WITNESS_SERVER), str(witness.http_calls), str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    assert wait_until(lambda: _listening(port), timeout=30), "the HTTP witness did not start"
    yield f"http://127.0.0.1:{port}/mcp"
    process.terminate()
    process.wait(timeout=10)
    log.close()


@pytest.fixture(scope="module")
def stack(witness: Witness, http_witness: str) -> Iterator[ChaosStack]:
    data_dir = Path(tempfile.mkdtemp(prefix="helmline-chaos-"))
    policy = data_dir.parent / f"{data_dir.name}-policy.yaml"
    policy.write_text(POLICY)
    servers = data_dir.parent / f"{data_dir.name}-mcp-servers.yaml"
    limit = {"calls": 10_000, "per_s": 60}
    stdio = {"command": sys.executable, "args": [str(WITNESS_SERVER), str(witness.stdio_calls)]}
    servers.write_text(
        yaml.safe_dump(
            {
                "servers": [
                    {
                        "id": "witness",
                        "stdio": stdio,
                        # In its sandbox it may write where it notes each call, nowhere else.
                        "sandbox": {"write": [str(witness.stdio_calls.parent)]},
                        "risk": "low",
                        "rate_limit": limit,
                    },
                    {
                        "id": "web",
                        "http": {"url": http_witness},
                        "risk": "low",
                        "rate_limit": limit,
                    },
                ]
            }
        )
    )
    chaos = ChaosStack(data_dir)
    code, out, err = chaos.run(
        "up",
        "--no-sample",
        "--replicas",
        "2",
        "--nats-cluster",
        "3",
        "--policy",
        str(policy),
        "--mcp-servers",
        str(servers),
    )
    try:
        assert code == 0, f"{out}\n{err}"
        yield chaos
    finally:
        chaos.run("down")
        # The services' logs outlive the run: what a failure needs to be understood.
        shutil.copytree(data_dir / "logs", ARTIFACTS / f"seed-{SEED}", dirs_exist_ok=True)
        shutil.rmtree(data_dir, ignore_errors=True)
        policy.unlink(missing_ok=True)
        servers.unlink(missing_ok=True)


@dataclass
class Delivered:
    """One delivery of a message to a deciding service's replicas, as the tap heard it."""

    consumer: str
    seq: int
    """The message's stream sequence."""
    count: int
    """Its delivery count (1 the first time, more on redelivery)."""
    at: float
    """When the tap heard it (epoch seconds)."""


@dataclass
class DeliveryTap:
    """What `delivery_tap.py` heard: each delivery to a deciding service's consumer, and
    each answer a replica sent for one."""

    replies: dict[str, Delivered] = field(default_factory=dict)
    """Deliveries by their reply (ack) subject, which names one delivery."""
    answers: dict[str, list[tuple[str, float]]] = field(default_factory=dict)
    """Answers (an ack: empty or `+ACK`; `-NAK...`, `+TERM...`, `+WPI`) by reply subject."""

    @classmethod
    def read(cls, file: Path) -> DeliveryTap:
        tap = cls()
        for line in file.read_text().splitlines():
            match json.loads(line):
                case ["delivered", at, reply, consumer, seq, count]:
                    tap.replies[reply] = Delivered(consumer, seq, count, at)
                case ["answered", at, reply, answer]:
                    tap.answers.setdefault(reply, []).append((answer, at))
        return tap


@pytest.fixture(scope="module")
def delivery_tap(stack: ChaosStack, witness: Witness) -> Iterator[Path]:
    """The tap, listening from before the first session on; the file it writes."""
    file = witness.folder / "deliveries.jsonl"
    process = subprocess.Popen(
        [sys.executable, str(DELIVERY_TAP), stack.record()["nats_url"], str(file)],
        stderr=subprocess.DEVNULL,
    )
    listening = json.dumps(["listening"])
    assert wait_until(lambda: file.exists() and listening in file.read_text(), timeout=30), (
        "the delivery tap did not start"
    )
    yield file
    process.terminate()
    process.wait(timeout=10)


class PatientStore(EventStore):
    """The test's own reads ride out what the faults do to NATS: a read to a session's end
    asks the stream's leader, which a killed server leaves unelected for seconds."""

    async def read_all(self, *args: Any, **kwargs: Any) -> list[StoredEvent]:
        return await _patiently(lambda: super(PatientStore, self).read_all(*args, **kwargs))

    async def load(self, *args: Any, **kwargs: Any) -> SessionSnapshot:
        return await _patiently(lambda: super(PatientStore, self).load(*args, **kwargs))


async def _patiently(read: Callable[[], Awaitable[T]]) -> T:
    deadline = time.monotonic() + LEADERLESS_S
    while True:
        try:
            return await read()
        except (TimeoutError, nats.errors.Error):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)  # The election is the cluster's, and says nothing.


@contextlib.asynccontextmanager
async def event_log(chaos: ChaosStack) -> AsyncIterator[tuple[nats.NATS, EventStore]]:
    connection = await connect_nats(
        nats_servers(chaos.record()["nats_url"]),
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.2,
    )
    try:
        yield connection, PatientStore(connection.jetstream())
    finally:
        await connection.close()


async def test_exactly_once_under_chaos(
    stack: ChaosStack,
    witness: Witness,
    command_witness: CommandWitness,
    delivery_tap: Path,
    capsys: Any,
) -> None:
    rng = random.Random(SEED)
    tally = Tally()
    began = time.monotonic()
    async with event_log(stack) as (nc, store):
        await federated(nc)
        poison = await feed_poison(nc)
        faults = asyncio.create_task(inject_faults(stack, rng, tally))
        drivers = []
        for index in range(SESSIONS):
            kind = KINDS[index % len(KINDS)]
            drivers.append(asyncio.create_task(drive(stack, store, kind, command_witness, tally)))
            # Starts spread over the faults, so that kills meet sessions at every stage.
            await asyncio.sleep(rng.uniform(*KILL_PAUSE_S) * KILLS / SESSIONS)
        results = await asyncio.gather(*drivers, return_exceptions=True)
        await faults
        elapsed = time.monotonic() - began
        failures = [r for r in results if isinstance(r, BaseException)]
        assert not failures, f"seed {SEED}: {failures[:3]}"

        await everything_healthy(stack)
        await nothing_in_flight(nc)
        report = await account(stack, store, witness, tally)
        letters = dead_letters(stack)
        tap = DeliveryTap.read(delivery_tap)

    report.update(
        seed=SEED,
        sessions=len(tally.sessions),
        kills=dict(tally.kills),
        takeover_s=takeover(
            tap, tally.service_kills, tally.service_backs, stack.replicas_of_services()
        ),
        steps_per_s=round(report["completed_calls"] / elapsed, 1),
        elapsed_s=round(elapsed, 1),
    )
    with capsys.disabled():
        print("\n" + json.dumps({"chaos": report}), flush=True)
    assert report["lost"] == 0, report
    assert report["duplicated"] == 0, report
    assert report["unexpected_ends"] == [], report
    assert report["read_model_differences"] == {}, report
    for marker, reason in poison.items():
        assert any(
            marker in letter["payload"] and reason in letter["reason"] for letter in letters
        ), f"no dead letter of {marker} saying {reason!r}"


async def federated(nc: nats.NATS) -> None:
    """Until both witness servers are federated, the approval service denies their tools."""
    js = nc.jetstream()

    async def ready() -> bool:
        registry = await latest_tool_registry(js)
        available = {s.server for s in registry.servers if s.available} if registry else set()
        return {"witness", "web"} <= available

    await eventually(ready, timeout_s=60, interval_s=0.2, what="the witness servers federated")


async def feed_poison(nc: nats.NATS) -> dict[str, str]:
    """Malformed events on valid subjects: a bad payload under a known type, and a schema
    version from the future. Their markers, with what each dead letter must say."""
    js = nc.jetstream()
    valid = json.loads(
        encode_event(
            new_event(
                _started(Playbook(goal="g", steps=(PlanStep(id="a", tool="echo"),))),
                tenant=TENANT,
                session_id="poison-payload",
                source="chaos",
            )
        )
    )
    bad_payload = {**valid, "data": {"goal": 42, "playbook": "not a playbook"}}
    future = {**valid, "subject": "poison-future", "schemaversion": 99}
    future["id"] = str(uuid.uuid4())
    await js.publish(
        event_subject(TENANT, "poison-payload", "session.started"), json.dumps(bad_payload).encode()
    )
    await js.publish(
        event_subject(TENANT, "poison-future", "session.started"), json.dumps(future).encode()
    )
    return {"poison-payload": "", "poison-future": "schema version 99 is newer"}


def _started(playbook: Playbook) -> SessionStarted:
    return SessionStarted(goal=playbook.goal, playbook=playbook, requested_by=REQUESTER)


def witnessed_command(listener: CommandWitness, token: str, *, asking: bool = False) -> str:
    """A command that tells the witness listener it ran, over the network policy grants."""
    note = "  # approve-me" if asking else ""
    return (
        f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {listener.port}), "
        f"10).sendall(b'{token}\\n')\"{note}"
    )


def playbook_of(kind: Kind, session_id: str, listener: CommandWitness) -> Playbook:
    def token(step: str) -> str:
        return f"{session_id}/{step}"

    def command(step: str, **more: Any) -> PlanStep:
        arguments = {"command": witnessed_command(listener, token(step), **more)}
        return PlanStep(id=step, tool="run_command", arguments=arguments)

    def call(step: str, server: str, after: tuple[str, ...] = ()) -> PlanStep:
        return PlanStep(
            id=step, tool=f"{server}__record", arguments={"token": token(step)}, depends_on=after
        )

    match kind:
        case "witnessed":
            steps = (
                command("cmd"),
                call("stdio", "witness"),
                call("http", "web"),
                call("last", "witness", after=("cmd", "stdio", "http")),
            )
        case "approved":
            steps = (command("asked", asking=True), call("after", "web", after=("asked",)))
        case "rollback" | "fork":
            steps = tuple(
                PlanStep(
                    id=f"w{n}",
                    tool="write_file",
                    arguments={"path": f"f{n}.txt", "content": f"{n}\n"},
                    depends_on=(f"w{n - 1}",) if n > 1 else (),
                )
                for n in (1, 2, 3)
            )
    return Playbook(goal=f"chaos {kind}", steps=steps)


async def drive(
    chaos: ChaosStack, store: EventStore, kind: Kind, listener: CommandWitness, tally: Tally
) -> None:
    """One session through its script."""
    session_id = uuid.uuid4().hex
    playbook = playbook_of(kind, session_id, listener)
    started = new_event(_started(playbook), tenant=TENANT, session_id=session_id, source="chaos")
    await store.append(started)
    tally.acknowledged.append(str(started.id))
    tally.sessions[session_id] = kind
    if kind == "approved":
        await approve_when_asked(store, session_id, tally)
    state = await _ended(store, session_id)
    if state.status != "completed":
        return  # Judged at the end: only an interrupted call may fail a session.
    if kind == "rollback":
        await checkpointed(store, TENANT, session_id, timeout_s=SESSION_TIMEOUT_S)
        code, out, err = await asyncio.to_thread(
            chaos.run, "rollback", session_id, "--to", "1", "--tenant", TENANT, "--json"
        )
        tally.rollbacks[session_id] = f"exit {code}: {out.strip()} {err.strip()}"
    elif kind == "fork":
        await checkpointed(store, TENANT, session_id, timeout_s=SESSION_TIMEOUT_S)
        code, out, err = await asyncio.to_thread(
            chaos.run, "fork", session_id, "--at", "1", "--tenant", TENANT, "--json"
        )
        assert code == 0, f"fork of {session_id}: {err}"
        fork_id = json.loads(out)["session_id"]
        tally.forks[session_id] = fork_id
        tally.sessions[fork_id] = "fork"
        await _ended(store, fork_id)


async def _ended(store: EventStore, session_id: str) -> SessionState:
    """The session once it has ended; or a failure that shows where its log stopped."""
    try:
        return await ended(store, TENANT, session_id, timeout_s=SESSION_TIMEOUT_S)
    except TimeoutError as error:
        log = await store.read_all(TENANT, session_id)
        tail = [f"{stored.seq} {stored.event.type}" for stored in log[-8:]]
        raise AssertionError(
            f"{error}; its log ends: {tail}; consumers: {await _consumers(store)}"
        ) from error


async def _consumers(store: EventStore) -> dict[str, tuple[int, int, int]]:
    """Each service consumer's (pending, in flight, redelivered) messages."""
    js = store.js
    found = {}
    for spec in SERVICE_CONSUMERS:
        info = await js.consumer_info(spec.stream, spec.durable)
        found[spec.durable] = (info.num_pending or 0, info.num_ack_pending or 0,
                               info.num_redelivered or 0)  # fmt: skip
    return found


async def approve_when_asked(store: EventStore, session_id: str, tally: Tally) -> None:
    """Grant the session's approval request once it asks, as a person would."""

    async def asked() -> Any:
        log = await store.read_all(TENANT, session_id)
        state = (await store.load(TENANT, session_id)).state
        if state.is_terminal:
            return "ended"
        for stored in log:
            data = stored.event.data
            if isinstance(data, ApprovalRequested):
                return stored.event
        return None

    request = await eventually(
        asked, timeout_s=SESSION_TIMEOUT_S, interval_s=0.2, what=f"{session_id} to ask"
    )
    if request == "ended":
        return
    assert isinstance(request.data, ApprovalRequested)
    vote = ApprovalDecisionSubmitted(
        request_id=request.data.request_id, decision="grant", decided_by=APPROVER
    )
    decided = request.derive(vote, source="chaos/approver")
    await store.append(decided)
    tally.acknowledged.append(str(decided.id))


async def inject_faults(chaos: ChaosStack, rng: random.Random, tally: Tally) -> None:
    """`KILLS` SIGKILLs of random service replicas, and once each: a NATS server killed and
    brought back, PostgreSQL killed and brought back, the stdio MCP server killed."""
    plan = ["service"] * KILLS
    for once, at in (("nats", 1 / 4), ("postgres", 1 / 2), ("mcp", 3 / 4)):
        plan.insert(int(len(plan) * at), once)
    watchers = []
    for fault in plan:
        await asyncio.sleep(rng.uniform(*KILL_PAUSE_S))
        match fault:
            case "service":
                name, pid = rng.choice(sorted(chaos.processes("service").items()))
                _kill(pid)
                tally.service_kills.append((time.time(), name))
                watchers.append(asyncio.create_task(back_again(chaos, name, pid, tally)))
            case "nats" | "postgres":
                name, pid = rng.choice(sorted(chaos.processes(fault).items()))
                _kill(pid)
                # `up` starts again only what stopped, on its port.
                code, out, err = await asyncio.to_thread(chaos.run, "up")
                assert code == 0, f"up after killing {name}: {out}\n{err}"
            case "mcp":
                stdio = [p.pid for p in psutil.process_iter(["cmdline"]) if _stdio_witness(p)]
                assert stdio, "no stdio witness server runs under a gateway"
                _kill(rng.choice(stdio))
        tally.kills[fault] += 1
    await asyncio.gather(*watchers)


async def back_again(chaos: ChaosStack, name: str, killed: int, tally: Tally) -> None:
    """Note when the replica killed is ready again: the supervisor's new process answers
    `/readyz` (its consumers receiving)."""
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    async with httpx.AsyncClient(timeout=1.0) as client:
        while time.monotonic() < deadline:
            await asyncio.sleep(0.1)  # Nothing tells the test; the supervisor restarts it.
            with contextlib.suppress(ValueError, OSError, StopIteration, httpx.HTTPError):
                component = next(c for c in chaos.record()["components"] if c["name"] == name)
                if component["process"] is None or component["process"]["pid"] == killed:
                    continue
                ready = await client.get(f"http://127.0.0.1:{component['health_port']}/readyz")
                if ready.status_code == 200:
                    tally.service_backs.append((time.time(), name))
                    return


def _stdio_witness(process: psutil.Process) -> bool:
    """A witness MCP server a gateway started (over stdio: no port argument)."""
    command: list[str] = process.info["cmdline"] or []
    return str(WITNESS_SERVER) in command and len(command) == 3


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


async def everything_healthy(chaos: ChaosStack) -> None:
    async def healthy() -> bool:
        code, _, _ = await asyncio.to_thread(chaos.run, "status", "--json")
        return code == 0

    await eventually(healthy, timeout_s=120, interval_s=0.5, what="every component healthy")


async def nothing_in_flight(nc: nats.NATS) -> None:
    js = nc.jetstream()

    async def settled() -> bool:
        for spec in SERVICE_CONSUMERS:
            info = await js.consumer_info(spec.stream, spec.durable)
            if info.num_ack_pending or info.num_pending:
                return False
        return True

    await eventually(settled, timeout_s=120, interval_s=0.5, what="every consumer drained")


async def account(
    chaos: ChaosStack, store: EventStore, witness: Witness, tally: Tally
) -> dict[str, Any]:
    """What the logs and the witness say, side by side."""
    invocations = witness.invocations()
    completed: Counter[str] = Counter()
    interrupted: list[str] = []
    unexpected: list[str] = []
    logs: dict[str, list[str]] = {}
    states: dict[str, SessionState] = {}
    for session_id, kind in tally.sessions.items():
        log = await store.read_all(TENANT, session_id)
        states[session_id] = (await store.load(TENANT, session_id)).state  # Folds, or raises.
        logs[session_id] = [f"{stored.seq}:{stored.event.type}" for stored in log]
        for stored in log:
            data = stored.event.data
            if (isinstance(data, ToolCallCompleted) and data.tool.endswith("record")) or (
                isinstance(data, ToolCallCompleted) and data.tool == "run_command"
            ):
                completed[f"{session_id}/{data.step_id}"] += 1
            elif isinstance(data, ToolCallFailed):
                if _interrupted(data.error):
                    interrupted.append(f"{session_id}/{data.step_id}")
                else:
                    unexpected.append(f"{session_id}/{data.step_id}: {data.error.message}")
        unexpected.extend(_judge(session_id, kind, states[session_id], tally))
    logged = {
        str(stored.event.id) for s in tally.sessions for stored in await store.read_all(TENANT, s)
    }
    lost_events = [event_id for event_id in tally.acknowledged if event_id not in logged]
    lost_effects = [token for token in completed if invocations[token] != 1]
    duplicated = [token for token, count in invocations.items() if count > 1]
    differences = await _read_model_differences(chaos, states, logs)
    return {
        "lost": len(lost_events) + len(lost_effects),
        "duplicated": len(duplicated),
        "interrupted_calls": len(interrupted),
        "completed_calls": sum(completed.values()),
        "witness_lines": sum(invocations.values()),
        "unexpected_ends": unexpected,
        "read_model_differences": differences,
    }


def _interrupted(error: ToolError | None) -> bool:
    """A call a crash interrupted, failed so that it cannot run twice: the gateway's unknown
    outcome, the sandbox's interrupted call."""
    return error is not None and (
        error.kind == "unknown_outcome" or error.message.startswith("interrupted")
    )


def _judge(session_id: str, kind: Kind, state: SessionState, tally: Tally) -> list[str]:
    """How the session ended, if not as its script says."""
    if state.status == "failed":
        failed = [step for step in state.steps.values() if step.status == "failed"]
        interrupted = all(
            step.error is not None
            and (
                step.error.kind == "unknown_outcome" or step.error.message.startswith("interrupted")
            )
            for step in failed
        )
        if failed and interrupted:
            return []
        # Each step with its status and error: what made this end unexpected.
        steps = [
            (s.id, s.status, s.call_id, s.error and s.error.message) for s in state.steps.values()
        ]
        return [f"{session_id} ({kind}) failed: {state.outcome}; steps: {steps}"]
    if kind == "rollback" and state.status != "failed":
        rollbacks = list(state.rollbacks.values())
        if [r.status for r in rollbacks] != ["completed"]:
            said = tally.rollbacks.get(session_id, "not asked")
            return [f"{session_id} rollback: {[r.status for r in rollbacks]} ({said})"]
        return []
    if state.status != "completed":
        return [f"{session_id} ({kind}) ended {state.status}: {state.outcome}"]
    return []


async def _read_model_differences(
    chaos: ChaosStack, states: dict[str, SessionState], logs: dict[str, list[str]]
) -> dict[str, list[str]]:
    """Every session's rows against its folded log, once the read model has caught up."""
    database_url = chaos.record()["database_url"]
    differences: dict[str, list[str]] = {}

    async def agree() -> bool:
        differences.clear()
        for session_id, state in states.items():
            found = await read_model_differences(database_url, state)
            if found:
                differences[session_id] = found
        return not differences

    with contextlib.suppress(TimeoutError):
        await eventually(agree, timeout_s=60, interval_s=1.0, what="the read model to agree")
    return {
        session_id: [*found, f"log: {' '.join(logs[session_id])}"]
        for session_id, found in differences.items()
    }


def takeover(
    tap: DeliveryTap,
    kills: list[tuple[float, str]],
    backs: list[tuple[float, str]],
    replicas: dict[str, list[str]],
) -> dict[str, Any]:
    """How long the messages a killed replica held waited before a live replica took them up,
    from what the delivery tap heard and when the test killed what.

    A delivery was held by a killed replica when the tap heard no answer for it but
    in-progress marks (no ack, nak or term: a handler's retry, a deferral, an approval
    waiting for a person or a long step all answer) and the message was delivered again.
    Its holder went silent at its last sign of life: the delivery or its last in-progress
    mark, or one ack wait before the redelivery if that is earlier (JetStream redelivers one
    ack wait after the last sign it got; the tap, on a loaded machine, may hear a delivery
    late). The kill that silenced it is the first SIGKILL of a replica of the consumer's
    service from `SIGN_SLACK_S` before then up to the redelivery (the earliest: a figure
    erring long). Over those deliveries, in seconds from that kill:

    - `p50`, `max`: to the redelivery, JetStream handing the message to a live replica,
      for the deliveries whose service kept another replica ready from the kill to the
      redelivery: the takeover, which the consumers' ack wait bounds.
    - `handled_p50`, `handled_max`: for those, to the redelivery's ack, once its handler's
      decision is in the log (the handling itself included: a command's run, say).
    - `held`: how many; `no_replica_left`: the others (held, p50, max to the redelivery),
      whose service had no replica ready for part of the wait (the other one killed too and
      not back yet), so that they waited for a replica's restart rather than the ack wait.
    - `unexplained`: unanswered deliveries delivered again with no kill of the service to
      explain them: a replica alive but silent for the ack wait, or cut off with what it
      was handed when a NATS server died (or an answer the tap missed meanwhile).
    - `at_once`: deliveries whose holder still answered after the message was delivered
      again: held by two replicas at once, a live one's silence taken for a death (the log
      and the witness judge whether anything was done twice)."""
    ack_waits = {spec.durable: spec.ack_wait_s for spec in SERVICE_CONSUMERS}
    by_message: dict[tuple[str, int], dict[int, tuple[str, Delivered]]] = {}
    for reply, delivered in tap.replies.items():
        key = (delivered.consumer, delivered.seq)
        by_message.setdefault(key, {})[delivered.count] = (reply, delivered)
    waits: list[float] = []
    handled: list[float] = []
    alone: list[float] = []
    unexplained = at_once = 0
    for (consumer, _), deliveries in by_message.items():
        service = consumer.removeprefix("helmline-")
        for count, (reply, delivered) in deliveries.items():
            if count + 1 not in deliveries:
                continue
            answers = tap.answers.get(reply, [])
            again_reply, again = deliveries[count + 1]
            if any(at > again.at for _, at in answers):
                at_once += 1
            if any(answer != "+WPI" for answer, _ in answers):
                continue
            last_sign = max([delivered.at, *(at for _, at in answers)])
            silent_from = min(last_sign, again.at - ack_waits[consumer]) - SIGN_SLACK_S
            silenced = [
                (killed_at, name)
                for killed_at, name in kills
                if name in replicas[service] and silent_from <= killed_at <= again.at
            ]
            if not silenced:
                unexplained += 1
                continue
            killed_at, name = min(silenced)
            others = [other for other in replicas[service] if other != name]
            if not any(_ready(other, killed_at, again.at, kills, backs) for other in others):
                alone.append(again.at - killed_at)
                continue
            waits.append(again.at - killed_at)
            acks = [at for answer, at in tap.answers.get(again_reply, []) if answer in ("", "+ACK")]
            if acks:
                handled.append(min(acks) - killed_at)
    return {
        **_spread("", waits),
        **_spread("handled_", handled),
        "held": len(waits),
        "no_replica_left": {"held": len(alone), **_spread("", alone)},
        "unexplained": unexplained,
        "at_once": at_once,
    }


def _ready(
    name: str,
    start: float,
    end: float,
    kills: list[tuple[float, str]],
    backs: list[tuple[float, str]],
) -> bool:
    """Whether replica `name` was ready from `start` to `end`: not killed meanwhile, and back
    from its last kill before."""
    killed = [at for at, killed_name in kills if killed_name == name]
    if any(start < at <= end for at in killed):
        return False
    before = [at for at in killed if at <= start]
    return not before or any(
        max(before) < at <= start for at, back_name in backs if back_name == name
    )


def _spread(prefix: str, values: list[float]) -> dict[str, float | None]:
    return {
        f"{prefix}p50": round(statistics.median(values), 2) if values else None,
        f"{prefix}max": round(max(values), 2) if values else None,
    }


def dead_letters(chaos: ChaosStack) -> list[dict[str, Any]]:
    code, out, err = chaos.run("dlq", "list", "--json")
    assert code == 0, err
    letters: list[dict[str, Any]] = json.loads(out)
    return letters


def _listening(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
        return True
    return False


def test_takeover_counts_only_what_a_kill_held() -> None:
    """A retry, a long step, a redelivery no kill explains and work left with no replica are
    told apart from a takeover by a live replica."""
    tap = DeliveryTap()
    heard = [
        # Held by planner-1, killed at 10.8; planner-2 takes it up at 12.5.
        ("planner", 1, 1, 10.0, [("+WPI", 10.5)]),
        ("planner", 1, 2, 12.5, [("", 12.6)]),
        # Its handler failed and asked for a retry: a back-off, not a takeover.
        ("planner", 2, 1, 10.0, [('-NAK {"delay": 2000000000}', 10.1)]),
        ("planner", 2, 2, 12.1, [("+ACK", 12.2)]),
        # A long step, kept in progress until done.
        ("planner", 3, 1, 5.0, [("+WPI", 5.7), ("+WPI", 19.0), ("", 20.0)]),
        # Held by state-1, killed at 30.2 while state-2 (killed at 29.0) was not back.
        ("state", 4, 1, 30.0, []),
        ("state", 4, 2, 35.0, [("", 35.1)]),
        # Delivered again with no kill of the service.
        ("tool-gateway", 5, 1, 50.0, []),
        ("tool-gateway", 5, 2, 52.0, [("", 52.1)]),
        # Its holder still at work after the redelivery: held twice at once.
        ("sandbox", 6, 1, 60.0, [("+WPI", 60.6), ("+WPI", 62.3)]),
        ("sandbox", 6, 2, 62.0, [("", 62.4)]),
    ]
    for service, seq, count, at, answers in heard:
        reply = f"{service}.{seq}.{count}"
        tap.replies[reply] = Delivered(f"helmline-{service}", seq, count, at)
        tap.answers[reply] = answers
    kills = [(29.0, "state-2"), (10.8, "planner-1"), (30.2, "state-1")]
    backs = [(40.0, "state-2"), (41.0, "state-1"), (20.0, "planner-1")]
    replicas = {
        service: [f"{service}-1", f"{service}-2"]
        for service in ("planner", "state", "tool-gateway", "sandbox")
    }

    assert takeover(tap, kills, backs, replicas) == {
        "p50": 1.7,
        "max": 1.7,
        "handled_p50": 1.8,
        "handled_max": 1.8,
        "held": 1,
        "no_replica_left": {"held": 1, "p50": 4.8, "max": 4.8},
        "unexplained": 2,
        "at_once": 1,
    }
