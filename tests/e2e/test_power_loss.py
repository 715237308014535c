"""Power cuts under a running stack: what was acknowledged stays, nothing runs twice.

The nats-server stores JetStream on a filesystem that keeps only what was fsynced
(`lazyfs.py`, as Jepsen's LazyFS), and the power is cut at random moments while sessions
run: every process of the stack is killed with SIGKILL, the filesystem drops whatever was
not fsynced, and everything starts again. Sessions call the test's own command and MCP
server, which append one line per real invocation to files the stack never reads: the
witness of side effects.

Durable (the default), every event acknowledged before a cut is in the log after it, no
side effect happens twice, and a call whose completion was lost is failed as of unknown
outcome (the gateway's `unknown_outcome`, the sandbox's interrupted call), never run again.
Relaxed, the same test must see acknowledged events lost: proof that it can see a loss.

CI cuts the power `POWER_CUTS_IN_CI` times; `POWER_CUTS=200` runs the long form by hand.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest
import yaml

from helmline.cli._processes import wait_until
from helmline.contracts import (
    Actor,
    PlanStep,
    Playbook,
    SessionStarted,
    StepScheduled,
    ToolCallCompleted,
    ToolCallFailed,
    fold,
    new_event,
)
from helmline.runtime import Durability, EventStore, StoredEvent, connect_nats, latest_tool_registry
from helmline.runtime.testing import NatsServer, ServiceProcesses, eventually

from .mcp_servers import SERVICES

LAZYFS = Path(__file__).with_name("lazyfs.py")
TICKETS_SERVER = Path(__file__).with_name("tickets_mcp_server.py")
POWER_CUTS_IN_CI = 20
SESSIONS_PER_ROUND = 3
STEPS = 8
REQUESTER = Actor(id="robot")
POLICY = """
version: 1
description: The witnessed calls run without asking, so that no approval waits across a cut.
rules:
  - {name: witnessed-commands, tool: run_command, effect: allow}
  - {name: witnessed-notices, tool: tickets__notify, effect: allow}
"""


pytestmark = [
    pytest.mark.stack,
    # Debian's fuse3 (fusermount3), installed by `make test` as root (tools/system_packages.py).
    pytest.mark.fuse,
    pytest.mark.skipif(
        not Path("/dev/fuse").exists(),
        reason="no /dev/fuse on this machine: the power-loss test needs FUSE from the kernel",
    ),
]


class LazyMount:
    """`lazyfs.py` serving `backing` at `mountpoint`; killing it is the power cut."""

    def __init__(self, backing: Path, mountpoint: Path) -> None:
        self.backing, self.mountpoint = backing, mountpoint
        backing.mkdir(parents=True, exist_ok=True)
        mountpoint.mkdir(parents=True, exist_ok=True)
        self._process: subprocess.Popen[bytes] | None = None

    def mount(self) -> None:
        with (self.backing.parent / "lazyfs.log").open("ab") as log:
            self._process = subprocess.Popen(
                [sys.executable, str(LAZYFS), str(self.backing), str(self.mountpoint)],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        process = self._process
        mounted = wait_until(
            lambda: os.path.ismount(self.mountpoint) or process.poll() is not None, timeout=10
        )
        assert mounted, "lazyfs did not mount in time"
        assert process.poll() is None, "lazyfs exited: see lazyfs.log"

    def cut(self) -> None:
        """Drop whatever was not fsynced, as the machine's memory is lost."""
        if self._process is not None:
            self._process.kill()
            self._process.wait(timeout=10)
        # The dead filesystem's mount is detached, as a reboot would.
        subprocess.run(["fusermount3", "-u", "-z", str(self.mountpoint)], check=True)

    def unmount(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.send_signal(signal.SIGTERM)  # lazyfs unmounts itself on SIGTERM
            self._process.wait(timeout=10)
        if os.path.ismount(self.mountpoint):
            subprocess.run(["fusermount3", "-u", "-z", str(self.mountpoint)], check=True)


class PoweredStack:
    """A nats-server whose JetStream store is on a lazy mount, and every service as a process
    of its own, which the test can switch off at the wall and on again."""

    def __init__(self, folder: Path, durability: Durability, witness: Witness) -> None:
        # nats-server keeps JetStream in `<store_dir>/jetstream`: only that is on the lazy
        # mount; its configuration and log stay on the real disk.
        self.mount = LazyMount(folder / "disk", folder / "nats" / "jetstream")
        self.nats = NatsServer(folder / "nats", durability=durability)
        policy = folder / "policy.yaml"
        policy.write_text(POLICY)
        servers = folder / "mcp-servers.yaml"
        tickets = {"command": sys.executable, "args": [str(TICKETS_SERVER), str(witness.calls)]}
        # Above the default rate limit: the long form calls it thousands of times a minute.
        tickets_server = {
            "id": "tickets",
            "stdio": tickets,
            "sandbox": {"write": [str(witness.calls.parent)]},
            "risk": "low",
            "rate_limit": {"calls": 10_000, "per_s": 60},
        }
        servers.write_text(yaml.safe_dump({"servers": [tickets_server]}))
        (folder / "stack").mkdir()
        self.services = ServiceProcesses(
            self.nats.url,
            folder / "stack",
            env={
                "HELMLINE_POLICY": str(policy),
                "HELMLINE_MCP_SERVERS": str(servers),
                # The witness file is outside every workspace: bubblewrap would keep the
                # command from reaching it, and what a sandbox confines is not on trial here.
                "HELMLINE_SANDBOX_BACKEND": "unsandboxed",
            },
        )

    async def power_on(self) -> None:
        self.mount.mount()
        self.nats.start()
        await asyncio.gather(*(asyncio.to_thread(self.services.start, s) for s in SERVICES))
        nc = await connect_nats(self.nats.url)
        js = nc.jetstream()

        async def federated() -> bool:
            registry = await latest_tool_registry(js)
            return registry is not None and any(
                server.server == "tickets" and server.available for server in registry.servers
            )

        # Until then the approval service denies the MCP tool as unknown.
        try:
            await eventually(federated, timeout_s=60, what="the tickets server federated")
        except TimeoutError as error:
            gateway_log = (self.services.data_dir / "tool_gateway.log").read_text()[-6000:]
            raise AssertionError(f"{error}; the gateway's log ends:\n{gateway_log}") from None
        finally:
            await nc.close()

    def power_cut(self) -> None:
        """SIGKILL every process of the stack (and what they started: the MCP server, the
        commands), then lose what the disk had not made durable."""
        services = [psutil.Process(p.pid) for p in self.services.processes.values()]
        children = [child for service in services for child in service.children(recursive=True)]
        for process in (*services, *children):
            with contextlib.suppress(psutil.NoSuchProcess):  # gone with its parent
                process.kill()
        self.nats.kill()
        self.mount.cut()
        for popen in self.services.processes.values():
            popen.wait(timeout=10)
        self.services.processes.clear()

    def power_off(self) -> None:
        self.services.stop_all()
        self.nats.stop()
        self.mount.unmount()


@dataclass
class Witness:
    """Files outside Helmline where the test's command and MCP server note each invocation."""

    commands: Path
    calls: Path

    def invocations(self) -> Counter[str]:
        seen: Counter[str] = Counter()
        if self.commands.exists():
            seen.update(line for line in self.commands.read_text().splitlines() if line)
        if self.calls.exists():
            for line in self.calls.read_text().splitlines():
                seen[json.loads(line)["message"]] += 1
        return seen


@dataclass
class Tally:
    """What the cuts did."""

    cuts: int = 0
    acknowledged_checked: int = 0
    """Acknowledged events looked for after a cut (each cut counts those before it)."""
    lost: list[str] = field(default_factory=list)
    sessions: list[str] = field(default_factory=list)


def witnessed_playbook(witness: Witness, session_id: str) -> Playbook:
    """`STEPS` steps, one after another, each leaving one witness line per real invocation:
    commands through the sandbox, notices through the MCP server. A command lingers after
    its side effect, so that cuts often fall between an effect and its recorded completion."""
    steps = []
    for index in range(STEPS):
        key = f"{session_id}/s{index}"
        tool, arguments = (
            ("run_command", {"command": f"echo {key} >> {witness.commands} && sleep 0.2"})
            if index % 2 == 0
            else ("tickets__notify", {"message": key})
        )
        depends = (f"s{index - 1}",) if index else ()
        steps.append(PlanStep(id=f"s{index}", tool=tool, arguments=arguments, depends_on=depends))
    return Playbook(goal="leave witnesses", steps=tuple(steps))


async def the_log(store: EventStore) -> dict[int, str]:
    """Every event the log holds now, by sequence: its id."""
    held: dict[int, str] = {}

    def keep(stored: StoredEvent) -> None:
        held[stored.seq] = str(stored.event.id)

    await store.replay_log(keep, after_seq=0, up_to_seq=await store.log_end())
    return held


async def cut_repeatedly(
    stack: PoweredStack, witness: Witness, tenant: str, cuts: int, rng: random.Random
) -> Tally:
    """Start sessions, cut the power at a random moment, start again: `cuts` times. Before
    each cut the log is read (what the server holds was acknowledged, or would be); after
    it, each of those events must be at its sequence still."""
    tally = Tally()
    await stack.power_on()
    for _ in range(cuts):
        nc = await connect_nats(stack.nats.url)
        store = EventStore(nc.jetstream())
        acknowledged: dict[int, str] = {}
        for _ in range(SESSIONS_PER_ROUND):
            session_id = os.urandom(8).hex()
            started = SessionStarted(
                goal="witnessed",
                playbook=witnessed_playbook(witness, session_id),
                requested_by=REQUESTER,
            )
            event = new_event(started, tenant=tenant, session_id=session_id, source="test")
            appended = await store.append(event)
            acknowledged[appended.seq] = str(event.id)
            tally.sessions.append(session_id)
        # The power fails at a moment nobody chose: a clock, not a wait for anything.
        await asyncio.sleep(rng.uniform(0.05, 1.5))
        held = await the_log(store)
        assert acknowledged.items() <= held.items()
        await nc.close()

        stack.power_cut()
        tally.cuts += 1
        await stack.power_on()

        nc = await connect_nats(stack.nats.url)
        after = await the_log(EventStore(nc.jetstream()))
        await nc.close()
        tally.acknowledged_checked += len(held)
        tally.lost += [f"{seq}:{id_}" for seq, id_ in held.items() if after.get(seq) != id_]
    return tally


@dataclass
class CallsOfStep:
    completed: int = 0
    reconciled: int = 0
    """Failed as of unknown outcome: the call may have taken effect, and was not re-sent."""


async def calls_by_step(
    store: EventStore, tenant: str, sessions: list[str]
) -> dict[str, CallsOfStep]:
    """Each step's calls as the log tells them, by witness key (`session/step`)."""
    found: dict[str, CallsOfStep] = {}
    for session_id in sessions:
        step_of: dict[str, str] = {}
        for stored in await store.read_all(tenant, session_id):
            match stored.event.data:
                case StepScheduled(call_id=call_id, step_id=step_id):
                    step_of[call_id] = step_id
                    found.setdefault(f"{session_id}/{step_id}", CallsOfStep())
                case ToolCallCompleted(call_id=call_id):
                    found[f"{session_id}/{step_of[call_id]}"].completed += 1
                case ToolCallFailed(call_id=call_id, error=error) if (
                    error.kind == "unknown_outcome" or error.message.startswith("interrupted")
                ):
                    found[f"{session_id}/{step_of[call_id]}"].reconciled += 1
                case _:
                    pass
    return found


@pytest.fixture
def witness(tmp_path: Path) -> Witness:
    return Witness(commands=tmp_path / "commands.witness", calls=tmp_path / "calls.witness")


async def test_power_cuts_lose_no_acknowledged_event_and_run_nothing_twice(
    tmp_path: Path, witness: Witness, tenant: str
) -> None:
    cuts = int(os.environ.get("POWER_CUTS", POWER_CUTS_IN_CI))
    seed = int(os.environ.get("POWER_CUTS_SEED", random.randrange(1 << 32)))
    stack = PoweredStack(tmp_path, "durable", witness)
    try:
        tally = await cut_repeatedly(stack, witness, tenant, cuts, random.Random(seed))
        nc = await connect_nats(stack.nats.url)
        store = EventStore(nc.jetstream())

        async def all_ended() -> bool:
            for session_id in tally.sessions:
                if not fold(s.event for s in await store.read_all(tenant, session_id)).is_terminal:
                    return False
            return True

        await eventually(all_ended, timeout_s=180, interval_s=0.5, what="every session to end")
        steps = await calls_by_step(store, tenant, tally.sessions)
        outcomes: Counter[str] = Counter()
        for session_id in tally.sessions:
            log = await store.read_all(tenant, session_id)
            outcomes[fold(s.event for s in log).outcome] += 1
        await nc.close()
    finally:
        stack.power_off()

    invoked = witness.invocations()
    twice = {key: n for key, n in invoked.items() if n > 1}
    unexplained = {
        key: (calls, invoked[key])
        for key, calls in steps.items()
        if not calls.completed <= invoked[key] <= calls.completed + calls.reconciled
    }
    print(
        f"\npower cuts: {tally.cuts} (seed {seed}), acknowledged events checked: "
        f"{tally.acknowledged_checked}, lost: {len(tally.lost)}; calls completed: "
        f"{sum(c.completed for c in steps.values())}, reconciled as of unknown outcome: "
        f"{sum(c.reconciled for c in steps.values())}, side effects: {invoked.total()}, "
        f"twice: {len(twice)}; sessions: {dict(outcomes)}"
    )
    assert tally.lost == [], f"acknowledged events lost (seed {seed})"
    assert twice == {}, f"side effects that happened twice (seed {seed})"
    assert set(invoked) <= set(steps), "a side effect of no call the log knows"
    assert unexplained == {}, f"witness lines that the log does not account for (seed {seed})"
    assert sum(c.completed for c in steps.values()) > 0, "no call completed: nothing was tested"


async def test_relaxed_durability_loses_acknowledged_events_in_a_power_cut(
    tmp_path: Path, witness: Witness, tenant: str
) -> None:
    stack = PoweredStack(tmp_path, "relaxed", witness)
    try:
        tally = await cut_repeatedly(stack, witness, tenant, 3, random.Random(49))
    finally:
        stack.power_off()
    print(
        f"\nrelaxed: power cuts: {tally.cuts}, acknowledged events checked: "
        f"{tally.acknowledged_checked}, lost: {len(tally.lost)}"
    )
    assert tally.lost, "relaxed durability lost nothing: the test cannot see a loss"
