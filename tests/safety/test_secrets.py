"""Secrets: more than fifty realistic secrets planted, one set per channel through which a
secret reaches the stack: a workspace file read with read_file, a command's output, a failing
command's error output, an MCP tool's result, an MCP tool's error, and a model's own text.
Afterwards none may be found anywhere the stack keeps or shows anything."""

from __future__ import annotations

import asyncio
import base64
import uuid
from collections.abc import AsyncIterator

import httpx
import pytest

from helmline.contracts import (
    Actor,
    PlanStep,
    Playbook,
    SessionStarted,
    new_event,
)
from helmline.planner.testing import Received, Reply, Responder
from helmline.runtime.testing import (
    auto_approver,
    ended,
    eventually,
    start_playbook,
    stored_log,
)
from tests.safety import figures
from tests.safety.places import (
    api_reads,
    helmline,
    read_model,
    service_logs,
    sse_until,
)
from tests.safety.planted import Planted, as_file, found_in, make_secrets
from tests.safety.stack import Stack

OPERATOR = Actor(id="ana", roles=("operator", "approver"))
CHANNELS = (
    "workspace_file",
    "command_output",
    "command_error",
    "mcp_result",
    "mcp_error",
    "model_output",
)
PLACES = (
    "log",
    "events_cli",
    "export_cli",
    "show_cli",
    "read_model",
    "api",
    "sse",
    "service_logs",
    "traces",
)


CHUNK = 12_000
"""Base64 characters per command (a multiple of 4, so each chunk decodes alone): commands
are at most 16 KiB."""


def _decoded_into(
    planted: list[Planted], path: str, step: str, after: tuple[str, ...] = ()
) -> list[PlanStep]:
    """Steps, one after another (the first `after` those named), that write the secrets to
    `path` without any command holding a whole one: the request is in the log, and secrets
    in arguments are item 2's concern."""
    encoded = base64.b64encode(as_file(planted).encode()).decode()
    steps: list[PlanStep] = []
    for index, at in enumerate(range(0, len(encoded), CHUNK)):
        steps.append(
            PlanStep(
                id=f"{step}-{index}",
                tool="run_command",
                arguments={"command": f"echo {encoded[at : at + CHUNK]} | base64 -d >> {path}"},
                depends_on=(steps[-1].id,) if steps else after,
            )
        )
    return steps


def _model(planted: list[Planted]) -> Responder:
    """A model that reads the vault, then says what it holds: in its thinking, its answer
    and its summary of the session."""
    said = as_file(planted)

    def respond(received: Received) -> Reply:
        if len(received.texts()) == 1:
            return Reply.call("planted__vault", text=f"Reading the vault. I already know:\n{said}")
        return Reply.call(
            "finish",
            text=f"The vault holds:\n{said}",
            summary=f"Found these credentials:\n{said}",
            criteria=[{"criterion": "the vault is read", "met": True, "evidence": said}],
        )

    return respond


async def _plant(stack: Stack, tenant: str) -> tuple[dict[str, list[Planted]], list[str]]:
    sets = {channel: make_secrets() for channel in CHANNELS}
    assert all(len({p.kind for p in planted}) >= 50 for planted in sets.values())
    (stack.planted / "secrets.txt").write_text(as_file(sets["mcp_result"]))
    (stack.planted / "sealed.txt").write_text(as_file(sets["mcp_error"]))
    writes = _decoded_into(sets["workspace_file"], "workspace.txt", "workspace")
    writes += _decoded_into(sets["command_output"], "command.txt", "command", (writes[-1].id,))
    written = writes[-1].id
    reads = Playbook(
        goal="write the secrets, read them back by every means",
        steps=(
            *writes,
            PlanStep(
                id="read",
                tool="read_file",
                arguments={"path": "workspace.txt"},
                depends_on=(written,),
            ),
            PlanStep(
                id="cat",
                tool="run_command",
                arguments={"command": "cat command.txt"},
                depends_on=("read",),
            ),
            PlanStep(id="vault", tool="planted__vault", arguments={}, depends_on=("cat",)),
        ),
    )
    error_writes = _decoded_into(sets["command_error"], "error.txt", "error")
    failing = Playbook(
        goal="a command fails, saying the secrets",
        steps=(
            *error_writes,
            PlanStep(
                id="fail",
                tool="run_command",
                arguments={"command": "cat error.txt >&2; exit 3"},
                depends_on=(error_writes[-1].id,),
            ),
        ),
    )
    sealed = Playbook(
        goal="an MCP tool fails, saying the secrets",
        steps=(PlanStep(id="check", tool="planted__vault_check", arguments={}),),
    )
    key = f"model-output-{uuid.uuid4().hex[:8]}"
    stack.model.script(key, _model(sets["model_output"]))
    goal = SessionStarted(goal=f"{key}: read the vault", mode="act", requested_by=OPERATOR)
    model_session = uuid.uuid4().hex
    sessions = [
        await start_playbook(stack.store, tenant, playbook, OPERATOR)
        for playbook in (reads, failing, sealed)
    ]
    await stack.store.append(
        new_event(goal, tenant=tenant, session_id=model_session, source="test")
    )
    sessions.append(model_session)
    for session_id in sessions:
        await ended(stack.store, tenant, session_id, timeout_s=120)
    return sets, sessions


@pytest.fixture(scope="module")
async def found(stack: Stack) -> AsyncIterator[dict[str, dict[str, list[str]]]]:
    """What was planted through each channel, found in each place: channel -> place -> the
    kinds of secret found there."""
    tenant = f"t{uuid.uuid4().hex[:12]}"
    async with auto_approver(stack.connection, stack.store, tenant, OPERATOR):
        sets, sessions = await _plant(stack, tenant)
    reads_state = (await stack.store.load(tenant, sessions[0])).state
    assert reads_state.status == "completed", reads_state.outcome

    seen: dict[str, bytes] = {"log": await stored_log(stack.connection.jetstream())}
    seen["events_cli"] = b"".join(
        [await helmline(stack, "events", "session", s, "-t", tenant, "--json") for s in sessions]
    )
    seen["export_cli"] = await helmline(stack, "export", "--all", "-t", tenant)
    seen["show_cli"] = b"".join(
        [await helmline(stack, "show", s, "-t", tenant) for s in sessions]
        + [await helmline(stack, "show", s, "-t", tenant, "--json") for s in sessions]
    )

    async def projected() -> bool:
        rows = await read_model(stack.database_url)
        return all(s.encode() in rows for s in sessions)

    await eventually(projected, timeout_s=60, what="the sessions in the read model")
    seen["read_model"] = await read_model(stack.database_url)
    admin = await stack.key(tenant, "admin")
    async with httpx.AsyncClient(base_url=stack.api_url, timeout=30) as client:
        await eventually(
            lambda: _accepted(client, admin), timeout_s=10, what="the API to know the key"
        )
        seen["api"] = await api_reads(client, admin, sessions)
        streams = [
            await sse_until(
                client,
                f"/sessions/{s}/events",
                admin,
                await stack.store.last_seq(tenant, s),
            )
            for s in sessions
        ]
        last = max([await stack.store.last_seq(tenant, s) for s in sessions])
        streams.append(await sse_until(client, "/events?after=0", admin, last))
        seen["sse"] = b"".join(streams)

    def traced() -> bool:
        spans = stack.spans.received()
        return all(s.encode() in spans for s in sessions)

    await eventually(traced, timeout_s=30, what="the sessions' spans")
    # Let the last spans of each service be exported (they are batched every 100 ms).
    await asyncio.sleep(0.5)
    seen["traces"] = stack.spans.received()
    seen["service_logs"] = service_logs(stack)

    result = {
        channel: {place: [p.kind for p in found_in(seen[place], sets[channel])] for place in PLACES}
        for channel in CHANNELS
    }
    yield result
    by_channel = {
        channel: sum(len(kinds) for kinds in places.values()) for channel, places in result.items()
    }
    figures.record(
        "secrets",
        shapes=len(sets["mcp_result"]),
        planted=sum(len(s) for s in sets.values()),
        channels=list(CHANNELS),
        places=list(PLACES),
        found=sum(by_channel.values()),
        found_by_channel=by_channel,
    )


async def _accepted(client: httpx.AsyncClient, headers: dict[str, str]) -> bool:
    return (await client.get("/me", headers=headers)).status_code == 200


@pytest.mark.parametrize("channel", CHANNELS)
def test_no_planted_secret_is_found_anywhere(
    found: dict[str, dict[str, list[str]]], channel: str
) -> None:
    leaks = {place: kinds for place, kinds in found[channel].items() if kinds}
    assert leaks == {}, f"{channel}: secrets found (by place, their kinds): {leaks}"
