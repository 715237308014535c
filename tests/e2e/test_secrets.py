"""Secrets by reference, end to end: a secret set with the CLI is used by a `run_command`
that prints it plain, in base64, URL-encoded and in hex, and by an MCP server that echoes it;
no form of the value reaches the log, `events --json`, the export, the API (reads and SSE),
the read model or a service's log; `show` names the redactions; the CLI never prints a
value; an unknown secret fails its call by name; list and rm work; a wrong key file is
refused clearly."""

from __future__ import annotations

import asyncio
import base64
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import asyncpg
import httpx
import pytest
from nats.js import JetStreamContext

from helmline.api import new_api_key, store_api_key
from helmline.contracts import (
    Actor,
    PlanStep,
    Playbook,
    SessionStarted,
    SessionState,
    ToolCallCompleted,
    ToolCallFailed,
    new_event,
)
from helmline.runtime import EventStore, SealingKey
from helmline.runtime.testing import ServiceProcesses, eventually, free_port, stored_log
from helmline.state import caught_up

from .conftest import HELMLINE, SERVICES  # type: ignore[import-not-found]
from .mcp_servers import everything, until_federated  # type: ignore[import-not-found]

KEY = SealingKey.generate().text()
NAME = "E2E_TOKEN"
# Characters that URL-encoding changes, short enough that `base64` prints it on one line.
VALUE = f"hl-Secret/{uuid.uuid4().hex[:12]}+key=&odd?"
FORMS = {
    "plain": VALUE,
    "base64": base64.b64encode(VALUE.encode()).decode(),
    "url": quote(VALUE, safe=""),
    "hex": VALUE.encode().hex(),
}
PRINT_EVERY_FORM = (
    'printf "%s\\n" "$TOKEN"; '
    'printf %s "$TOKEN" | base64; '
    'printf %s "$TOKEN" | python3 -c \'import sys, urllib.parse; '
    'print(urllib.parse.quote(sys.stdin.read(), safe=""))\'; '
    "printf %s \"$TOKEN\" | od -An -tx1 | tr -d ' \\n'; echo"
)
POLICY = "rules:\n  - name: everything\n    effect: allow\n"
OPERATOR = Actor(id="ana", roles=("operator",))


@pytest.fixture(scope="module")
def everything_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with everything(tmp_path_factory.mktemp("everything")) as url:
        yield url


@pytest.fixture(scope="module")
def api_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def services(
    nats_url: str,
    database_url: str,
    everything_url: str,
    api_port: int,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ServiceProcesses]:
    folder = tmp_path_factory.mktemp("secrets-stack")
    policy = folder / "policy.yaml"
    policy.write_text(POLICY)
    servers = folder / "mcp-servers.yaml"
    servers.write_text(
        json.dumps({"servers": [{"id": "everything", "http": {"url": everything_url}}]})
    )
    own = {
        "approval": {"HELMLINE_POLICY": str(policy)},
        "tool_gateway": {"HELMLINE_MCP_SERVERS": str(servers)},
        "state": {"HELMLINE_DATABASE_URL": database_url},
        "api": {"HELMLINE_API_PORT": str(api_port), "HELMLINE_DATABASE_URL": database_url},
    }
    running = ServiceProcesses(nats_url, folder, env={"HELMLINE_SECRETS_KEY": KEY})
    try:
        for name in (*SERVICES, "api"):
            running.start(name, own.get(name))
        yield running
    finally:
        running.stop_all()


async def _helmline(nats_url: str, *args: str, stdin: str = "", **env: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        HELMLINE,
        *args,
        env={"HELMLINE_NATS_URL": nats_url, "PATH": "/usr/bin:/bin", **env},
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(stdin.encode()), timeout=60)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


def _leaked(text: str | bytes) -> list[str]:
    data = text.encode() if isinstance(text, str) else text
    return [
        form
        for form, value in FORMS.items()
        if value.encode() in data or value.replace("/", "\\/").encode() in data
    ]


async def _run(store: EventStore, tenant: str, playbook: Playbook) -> tuple[str, SessionState]:
    session_id = uuid.uuid4().hex
    started = SessionStarted(goal=playbook.goal, playbook=playbook, requested_by=OPERATOR)
    await store.append(new_event(started, tenant=tenant, session_id=session_id, source="test"))

    async def ended() -> SessionState | None:
        state = (await store.load(tenant, session_id)).state
        return state if state.status in ("completed", "failed") else None

    state: SessionState = await eventually(ended, timeout_s=60, what="the session's end")
    return session_id, state


async def _read_model(database_url: str, tenant: str) -> str:
    connection = await asyncpg.connect(database_url)
    try:
        rows = []
        for table in ("sessions", "steps", "approvals", "checkpoints"):
            rows += await connection.fetch(
                f"SELECT t::text AS row FROM {table} t WHERE tenant = $1",
                tenant,
            )
    finally:
        await connection.close()
    return "\n".join(row["row"] for row in rows)


async def _sse_until_end(client: httpx.AsyncClient, session_id: str) -> str:
    received = ""
    async with client.stream("GET", f"/sessions/{session_id}/events") as response:
        assert response.status_code == 200
        async for chunk in response.aiter_text():
            received += chunk
            if "session.completed" in received or "session.failed" in received:
                break
    return received


async def test_a_secret_used_by_reference_is_nowhere_in_any_encoding(
    services: ServiceProcesses,
    nats_url: str,
    database_url: str,
    api_port: int,
    store: EventStore,
    js: JetStreamContext,
    tenant: str,
    tmp_path: Path,
) -> None:
    cli = {"HELMLINE_SECRETS_KEY": KEY}
    code, out, err = await _helmline(
        nats_url, "secrets", "set", NAME, "-t", tenant, stdin=VALUE + "\n", **cli
    )
    assert code == 0, err
    assert f"set secret {NAME} of tenant {tenant}" in out
    await until_federated(js, "everything")

    playbook = Playbook(
        goal="use a secret by reference",
        steps=(
            PlanStep(
                id="print",
                tool="run_command",
                arguments={"command": PRINT_EVERY_FORM, "env": {"TOKEN": {"secret": NAME}}},
            ),
            PlanStep(
                id="echo",
                tool="everything__echo",
                arguments={"message": {"secret": NAME}},
                depends_on=("print",),
            ),
        ),
    )
    session_id, state = await _run(store, tenant, playbook)
    assert state.status == "completed", state.outcome

    completed = {
        stored.event.data.step_id: stored.event.data
        for stored in await store.read_all(tenant, session_id)
        if isinstance(stored.event.data, ToolCallCompleted)
    }
    printed = completed["print"].output
    assert isinstance(printed, dict)
    # Each of the four lines the command printed is the secret's name now; of the base64,
    # the last character (the value's last bits, with the padding's) and the padding stay.
    marker = f"[secret:{NAME}]"
    lines = str(printed["stdout"]).splitlines()
    assert [line[: len(marker)] for line in lines] == [marker] * 4, printed
    assert [len(line) - len(marker) <= 3 for line in lines] == [True] * 4, printed
    assert completed["print"].redacted_by == {f"secret:{NAME}": 4}
    assert completed["echo"].redacted_by == {f"secret:{NAME}": 1}
    assert f"[secret:{NAME}]" in json.dumps(completed["echo"].output)
    # What the log says of the calls is the reference, never the value.
    assert state.steps["print"].arguments["env"] == {"TOKEN": {"secret": NAME}}

    assert _leaked(await stored_log(js)) == []
    code, events, err = await _helmline(
        nats_url, "events", "session", session_id, "-t", tenant, "--json"
    )
    assert code == 0, err
    assert f"secret:{NAME}" in events
    assert _leaked(events) == []
    code, exported, err = await _helmline(nats_url, "export", session_id, "-t", tenant)
    assert code == 0, err
    assert session_id in exported
    assert _leaked(exported) == []
    code, shown, err = await _helmline(nats_url, "show", session_id, "-t", tenant, COLUMNS="200")
    assert code == 0, err
    assert f"redacted secret:{NAME}=4" in shown
    assert f"redacted secret:{NAME}=1" in shown
    assert _leaked(shown) == []

    await eventually(
        lambda: caught_up(store, database_url, tenant, 1), timeout_s=30, what="the read model"
    )
    read_model = await _read_model(database_url, tenant)
    assert session_id in read_model
    assert _leaked(read_model) == []

    key, record = new_api_key(tenant, ("viewer",), name="secrets test")
    await store_api_key(js, record, by=OPERATOR)
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{api_port}",
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    ) as client:
        read = await client.get(f"/sessions/{session_id}")
        assert read.status_code == 200, read.text
        assert f"secret:{NAME}" in read.text
        assert _leaked(read.text) == []
        streamed = await asyncio.wait_for(_sse_until_end(client, session_id), timeout=30)
        assert f"secret:{NAME}" in streamed
        assert _leaked(streamed) == []

    logs = sorted(services.data_dir.glob("*.log"))
    assert logs
    for log in logs:
        assert _leaked(log.read_bytes()) == [], log.name

    code, listed, err = await _helmline(nats_url, "secrets", "list", "-t", tenant, "--json")
    assert code == 0, err
    assert [entry["name"] for entry in json.loads(listed)] == [NAME]
    assert _leaked(listed) == []
    code, out, err = await _helmline(nats_url, "secrets", "rm", NAME, "-t", tenant)
    assert code == 0, err
    code, listed, err = await _helmline(nats_url, "secrets", "list", "-t", tenant)
    assert (code, listed.strip()) == (0, "no secrets")


async def test_an_unknown_secret_fails_its_call_by_name_and_is_not_retried(
    services: ServiceProcesses, store: EventStore, tenant: str
) -> None:
    playbook = Playbook(
        goal="refer to a secret nobody set",
        steps=(
            PlanStep(
                id="print",
                tool="run_command",
                arguments={"command": 'echo "$X"', "env": {"X": {"secret": "NEVER_SET"}}},
            ),
        ),
    )
    session_id, state = await _run(store, tenant, playbook)
    assert state.status == "failed"
    failures = [
        stored.event.data
        for stored in await store.read_all(tenant, session_id)
        if isinstance(stored.event.data, ToolCallFailed)
    ]
    assert len(failures) == 1
    error = failures[0].error
    assert (error.kind, error.retryable) == ("not_found", False)
    assert "'NEVER_SET'" in error.message


async def test_the_cli_refuses_a_wrong_key_file_clearly_and_never_prints_a_value(
    nats_url: str, tenant: str, tmp_path: Path
) -> None:
    wrong = tmp_path / "secrets.key"
    wrong.write_text("this is not a key\n")
    code, out, err = await _helmline(
        nats_url,
        "secrets",
        "set",
        "ANY",
        "-t",
        tenant,
        stdin="some-value-123",
        HELMLINE_SECRETS_KEY_FILE=str(wrong),
    )
    assert code != 0
    assert str(wrong) in err
    assert "some-value-123" not in out + err
    missing = tmp_path / "nowhere"
    code, _, err = await _helmline(
        nats_url, "secrets", "set", "ANY", "-t", tenant, "--data-dir", str(missing), stdin="v" * 9
    )
    assert code != 0
    assert "no secrets key" in err
    code, _, err = await _helmline(
        nats_url, "secrets", "set", "ANY", "-t", tenant, stdin="short", HELMLINE_SECRETS_KEY=KEY
    )
    assert code != 0
    assert "5 characters" in err
