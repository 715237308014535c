"""The session commands against a real JetStream, without the services: each command's
events are read back from the log, and the services' part is played by appending their
events from the test."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from nats.js import JetStreamContext
from pydantic import TypeAdapter
from typer.testing import CliRunner, Result

from helmline.cli import app
from helmline.cli._follow import session_ids
from helmline.cli._playbook_file import load_playbook
from helmline.cli._sample import sample_playbook, start_sample
from helmline.contracts import (
    Actor,
    ApprovalDecisionSubmitted,
    ApprovalDenied,
    ApprovalGranted,
    ApprovalRequested,
    ArgumentCondition,
    CheckpointCreated,
    Event,
    FileChanges,
    ForkOrigin,
    Payload,
    PlanProposed,
    PlanStep,
    RollbackCompleted,
    RollbackRequested,
    SessionCancelled,
    SessionCancelRequested,
    SessionCompleted,
    SessionFailed,
    SessionPauseRequested,
    SessionResumed,
    SessionResumeRequested,
    SessionStarted,
    SessionState,
    StepScheduled,
    ToolCallAttemptFailed,
    ToolCallAuthorized,
    ToolCallCompleted,
    ToolCallStarted,
    ToolError,
    decode_event,
    fold,
    new_event,
)
from helmline.runtime import EventStore
from helmline.runtime.testing import eventually

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "playbooks"
HELLO = EXAMPLES / "hello.yaml"
HELMLINE = Path(sys.executable).parent / "helmline"


async def helmline(nats_url: str, *args: str) -> Result:
    """Run a command in a worker thread: it runs its own event loop, as from a terminal."""
    return await asyncio.to_thread(
        CliRunner().invoke, app, list(args), env={"HELMLINE_NATS_URL": nats_url}
    )


class Session:
    """A session started by the CLI, whose services' events the test appends by hand."""

    def __init__(self, store: EventStore, tenant: str, session_id: str) -> None:
        self.store = store
        self.tenant = tenant
        self.session_id = session_id

    async def events(self) -> list[Event]:
        return [stored.event for stored in await self.store.read_all(self.tenant, self.id)]

    @property
    def id(self) -> str:
        return self.session_id

    async def emit(self, *payloads: Payload, source: str = "helmline/test") -> None:
        cause = (await self.events())[-1]
        for index, payload in enumerate(payloads):
            await self.store.append(cause.derive(payload, source=source, key=str(index)))

    async def plan_and_ask(self, *request_ids: str) -> None:
        """What planner and approval do for hello.yaml: a plan, then approval requests."""
        started = (await self.events())[0].data
        assert isinstance(started, SessionStarted)
        assert started.playbook is not None
        await self.emit(PlanProposed(revision=1, steps=started.playbook.steps))
        await self.emit(*(_approval_request(request_id) for request_id in request_ids))

    async def state(self) -> SessionState:
        return (await self.store.load(self.tenant, self.id)).state


def _approval_request(request_id: str) -> ApprovalRequested:
    return ApprovalRequested(
        request_id=request_id,
        scope="step",
        step_id="count",
        call_id=f"call-{request_id}",
        tool="run_command",
        arguments={"command": "wc -c notes.txt"},
        risk="high",
        reason="run_command is high risk",
        expires_at=datetime.now(UTC) + timedelta(minutes=10),
    )


@pytest.fixture
async def session(nats_url: str, store: EventStore, tenant: str) -> Session:
    result = await helmline(nats_url, "run", "--playbook", str(HELLO), "--tenant", tenant, "--json")
    assert result.exit_code == 0, result.output
    return Session(store, tenant, json.loads(result.stdout)["session_id"])


async def test_run_appends_session_started_with_the_playbook(session: Session) -> None:
    (event,) = await session.events()

    assert isinstance(event.data, SessionStarted)
    playbook = load_playbook(HELLO)
    assert event.data.playbook == playbook
    assert event.data.goal == playbook.goal
    assert event.data.mode == "playbook"
    assert event.data.requested_by.kind == "user"
    assert set(event.data.requested_by.roles) == {"operator", "approver"}
    assert event.source == "helmline/cli"
    assert (event.tenant, event.session_id) == (session.tenant, session.id)


async def test_run_without_json_prints_only_the_session_id(
    nats_url: str, store: EventStore, tenant: str
) -> None:
    result = await helmline(nats_url, "run", "-p", str(HELLO), "--tenant", tenant)

    assert result.exit_code == 0, result.output
    session_id = result.stdout.strip()
    assert await store.last_seq(tenant, session_id) > 0


@pytest.mark.parametrize(
    ("ending", "exit_code"),
    [
        (SessionCompleted(summary="done"), 0),
        (SessionFailed(reason="step count failed", step_id="count"), 1),
        (SessionCancelled(reason="asked to"), 2),
        (_approval_request("r1"), 3),
    ],
    ids=["completed", "failed", "cancelled", "waiting"],
)
async def test_run_wait_follows_the_session_and_exits_by_how_it_stopped(
    ending: Payload,
    exit_code: int,
    nats_url: str,
    js: JetStreamContext,
    store: EventStore,
    tenant: str,
) -> None:
    running = asyncio.create_task(
        helmline(nats_url, "run", "-p", str(HELLO), "--tenant", tenant, "--wait", "--json")
    )
    sessions = await eventually(lambda: session_ids(js, tenant), what="session started")
    session = Session(store, tenant, sessions[0])
    await session.emit(PlanProposed(revision=1, steps=load_playbook(HELLO).steps))
    await session.emit(ending)

    result = await asyncio.wait_for(running, timeout=30)

    assert result.exit_code == exit_code, result.output
    report = json.loads(result.stdout)
    assert report["session_id"] == session.id
    assert report["status"] == (await session.state()).status
    if exit_code == 3:
        assert report["pending_approvals"] == ["r1"]


async def test_run_wait_shows_the_steps_and_how_to_approve(
    nats_url: str, js: JetStreamContext, store: EventStore, tenant: str
) -> None:
    running = asyncio.create_task(
        helmline(nats_url, "run", "-p", str(HELLO), "--tenant", tenant, "--wait")
    )
    sessions = await eventually(lambda: session_ids(js, tenant), what="session started")
    await Session(store, tenant, sessions[0]).plan_and_ask("r1")

    result = await asyncio.wait_for(running, timeout=30)

    assert result.exit_code == 3, result.output
    assert result.stdout.strip() == sessions[0]
    for shown in ("write", "count", "read", "waiting for approval r1", "wc -c notes.txt"):
        assert shown in result.stderr
    assert f"helmline approve {sessions[0]} --tenant {tenant}" in result.stderr


async def test_approve_grants_the_only_pending_request(nats_url: str, session: Session) -> None:
    await session.plan_and_ask("r1")

    result = await helmline(
        nats_url,
        *("approve", session.id, "--tenant", session.tenant, "--comment", "looks fine"),
        "--no-wait",  # No approval service runs here to answer.
    )

    assert result.exit_code == 0, result.output
    assert "submitted grant of r1: step count (run_command)" in result.stdout
    decision = (await session.events())[-1].data
    assert isinstance(decision, ApprovalDecisionSubmitted)
    assert (decision.request_id, decision.decision, decision.comment) == (
        "r1",
        "grant",
        "looks fine",
    )
    assert "approver" in decision.decided_by.roles


async def test_approve_similar_lets_the_grant_stand_for_later_calls_for_a_while(
    nats_url: str, session: Session
) -> None:
    await session.plan_and_ask("r1")
    asked_at = datetime.now(UTC)

    result = await helmline(
        nats_url,
        *("approve", session.id, "-t", session.tenant, "--similar", "3", "--similar-for", "30m"),
        *("--similar-where", "command~^wc (-c|-l) ", "--similar-where", "command=*.txt"),
        "--no-wait",
    )

    assert result.exit_code == 0, result.output
    (decision,) = _decisions(await session.events())
    assert decision.similar_limit == 3
    assert decision.similar_until is not None
    lasting = decision.similar_until - asked_at
    assert timedelta(minutes=30) <= lasting < timedelta(minutes=31)
    assert decision.similar_where == {
        "command": ArgumentCondition(regex="^wc (-c|-l) ", glob=("*.txt",))
    }


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--similar-for", "30m"], "--similar-for and --similar-where go with --similar N"),
        (["--similar-where", "path=a/*"], "--similar-for and --similar-where go with --similar N"),
        (["--similar", "2", "--similar-where", "path"], "write NAME=GLOB or NAME~REGEX"),
        (["--similar", "2", "--similar-where", "cmd~(x"], "invalid regular expression"),
        (["--similar", "2", "--similar-for", "soon"], "'soon' is not a duration such as 30s"),
        (["--similar", "0"], "Invalid value for '--similar'"),
    ],
    ids=[
        "duration alone",
        "condition alone",
        "not a condition",
        "bad regex",
        "not a duration",
        "no calls",
    ],
)
async def test_a_wrong_standing_grant_appends_nothing(
    args: list[str], message: str, nats_url: str, session: Session
) -> None:
    await session.plan_and_ask("r1")
    before = len(await session.events())

    result = await helmline(nats_url, "approve", session.id, "-t", session.tenant, *args)

    assert result.exit_code == 2
    assert message in result.stderr
    assert len(await session.events()) == before


async def test_approvals_lists_every_waiting_request_of_the_tenant_soonest_expiry_first(
    nats_url: str, store: EventStore, session: Session
) -> None:
    await session.plan_and_ask("r1", "r2")
    other_run = await helmline(nats_url, "run", "-p", str(HELLO), "-t", session.tenant, "--json")
    other = Session(store, session.tenant, json.loads(other_run.stdout)["session_id"])
    await other.plan_and_ask()
    soon = _approval_request("r3").model_copy(
        update={"expires_at": datetime.now(UTC) + timedelta(minutes=1), "quorum": 2}
    )
    await other.emit(soon)
    await session.emit(ApprovalDenied(request_id="r2", decided_by=Actor(id="ana")))

    listed = await helmline(nats_url, "approvals", "-t", session.tenant, "--json")
    shown = await helmline(nats_url, "approvals", "-t", session.tenant)

    assert listed.exit_code == 0, listed.output
    queue = json.loads(listed.stdout)
    assert [(item["session_id"], item["request_id"]) for item in queue] == [
        (other.id, "r3"),
        (session.id, "r1"),
    ]
    assert (queue[0]["quorum"], queue[0]["tool"], queue[0]["risk"]) == (2, "run_command", "high")
    assert shown.exit_code == 0, shown.output
    for text in ("approval requests waiting", other.id, "r3", "(2 people)", "helmline approve"):
        assert text in shown.stdout


async def test_approvals_lists_a_request_of_a_session_a_rollback_reopened(
    nats_url: str, session: Session
) -> None:
    # Denied, the session failed; rolled back, it is open again, and asks anew.
    await session.plan_and_ask("r1")
    ana = Actor(id="ana")
    await session.emit(
        ApprovalDenied(request_id="r1", decided_by=ana),
        SessionFailed(reason="step 'count' was denied"),
    )
    await session.emit(
        CheckpointCreated(checkpoint_id="cp-write", step_id="write", at_seq=1),
        RollbackRequested(rollback_id="rb", checkpoint_id="cp-write", requested_by=ana),
        RollbackCompleted(rollback_id="rb", checkpoint_id="cp-write", undone_steps=("count",)),
        SessionResumed(),
    )
    await session.emit(_approval_request("r2"))
    assert (await session.state()).status == "waiting"

    listed = await helmline(nats_url, "approvals", "-t", session.tenant, "--json")

    assert listed.exit_code == 0, listed.output
    assert [item["request_id"] for item in json.loads(listed.stdout)] == ["r2"]


async def test_approvals_says_when_nothing_waits(nats_url: str, tenant: str) -> None:
    result = await helmline(nats_url, "approvals", "-t", tenant)
    assert result.exit_code == 0, result.output
    assert f"No approval request waits in tenant {tenant!r}." in result.stdout


async def test_deny_names_one_request_of_several(nats_url: str, session: Session) -> None:
    await session.plan_and_ask("r1", "r2")

    result = await helmline(
        nats_url, "deny", session.id, "-t", session.tenant, "-r", "r2", "--no-wait"
    )

    assert result.exit_code == 0, result.output
    decisions = _decisions(await session.events())
    assert [(d.request_id, d.decision) for d in decisions] == [("r2", "deny")]


async def test_approve_all_decides_every_pending_request(nats_url: str, session: Session) -> None:
    await session.plan_and_ask("r1", "r2")

    result = await helmline(
        nats_url, "approve", session.id, "-t", session.tenant, "--all", "--no-wait"
    )

    assert result.exit_code == 0, result.output
    decisions = _decisions(await session.events())
    assert sorted((d.request_id, d.decision) for d in decisions) == [
        ("r1", "grant"),
        ("r2", "grant"),
    ]


@pytest.mark.parametrize(
    ("requests", "args", "message"),
    [
        ((), [], "has no pending approval request"),
        (("r1", "r2"), [], "has 2 pending approval requests (r1, r2): choose one with --request"),
        (("r1",), ["--request", "r9"], "has no approval request r9; pending: r1"),
        (("r1",), ["--request", "r1", "--all"], "either --request or --all"),
    ],
    ids=["none pending", "several pending", "unknown request", "both options"],
)
async def test_a_decision_without_a_clear_request_appends_nothing(
    requests: Sequence[str], args: list[str], message: str, nats_url: str, session: Session
) -> None:
    await session.plan_and_ask(*requests)
    before = len(await session.events())

    result = await helmline(nats_url, "approve", session.id, "-t", session.tenant, *args)

    assert result.exit_code in (1, 2)
    assert message in result.stderr
    assert len(await session.events()) == before


async def test_a_request_decided_already_is_not_decided_again(
    nats_url: str, session: Session
) -> None:
    await session.plan_and_ask("r1")
    # What the approval service appends once a person denied it.
    await session.emit(ApprovalDenied(request_id="r1", decided_by=Actor(id="ana")))

    result = await helmline(nats_url, "approve", session.id, "-t", session.tenant, "-r", "r1")

    assert result.exit_code == 1
    assert "approval request r1 is already denied" in result.stderr


@pytest.mark.parametrize(
    ("command", "payload_class", "reason"),
    [
        ("pause", SessionPauseRequested, "lunch"),
        ("resume", SessionResumeRequested, None),
        ("cancel", SessionCancelRequested, "wrong goal"),
    ],
)
async def test_controls_append_their_request(
    command: str,
    payload_class: type[Payload],
    reason: str | None,
    nats_url: str,
    session: Session,
) -> None:
    args = ["--reason", reason] if reason else []

    result = await helmline(nats_url, command, session.id, "-t", session.tenant, *args)

    assert result.exit_code == 0, result.output
    request = (await session.events())[-1].data
    assert isinstance(request, payload_class)
    assert getattr(request, "requested_by").kind == "user"  # noqa: B009 - every control has it
    if reason:
        assert getattr(request, "reason") == reason  # noqa: B009


async def test_a_session_that_ended_is_not_steered(nats_url: str, session: Session) -> None:
    await session.emit(SessionCompleted())

    result = await helmline(nats_url, "cancel", session.id, "-t", session.tenant)

    assert result.exit_code == 1
    assert "has already ended: completed" in result.stderr
    assert len(await session.events()) == 2


async def test_show_json_is_the_state_folded_from_the_whole_log(
    nats_url: str, session: Session
) -> None:
    await _run_first_step(session)
    await session.emit(_approval_request("r1"))

    result = await helmline(nats_url, "show", session.id, "-t", session.tenant, "--json")

    assert result.exit_code == 0, result.output
    folded = TypeAdapter(SessionState).dump_json(await session.state())
    assert json.loads(result.stdout) == json.loads(folded)


async def test_show_lists_steps_results_approvals_and_checkpoints(
    nats_url: str, session: Session
) -> None:
    await _run_first_step(session)
    await session.emit(_approval_request("r1"))

    result = await helmline(nats_url, "show", session.id, "-t", session.tenant)

    assert result.exit_code == 0, result.output
    for shown in (
        session.id,
        "waiting",
        "succeeded",
        '{"bytes":69}',
        "waiting for approval r1",
        "pending approvals",
        "run_command is high risk",
        "cp-write",
        "+notes.txt",
    ):
        assert shown in result.stdout


async def test_show_of_a_fork_says_where_its_completed_steps_ran(
    nats_url: str, store: EventStore, tenant: str
) -> None:
    steps = load_playbook(HELLO).steps
    fork = new_event(
        SessionStarted(
            goal="again",
            playbook=load_playbook(HELLO),
            requested_by=Actor(id="ana"),
            fork_of=ForkOrigin(session_id="origin", at_seq=12, completed_steps=("write",)),
        ),
        tenant=tenant,
        session_id="fork",
        source="helmline/api",
    )
    await store.append(fork)
    await store.append(fork.derive(PlanProposed(revision=1, steps=steps), source="helmline/test"))

    result = await helmline(nats_url, "show", "fork", "-t", tenant)

    assert result.exit_code == 0, result.output
    write = next(line for line in result.stdout.splitlines() if "│ write" in line)
    assert "completed in origin before the fork" in write
    assert "null" not in write


async def test_show_of_a_session_that_ended_before_any_plan_says_it_has_no_steps(
    nats_url: str, store: EventStore, tenant: str
) -> None:
    started = new_event(
        SessionStarted(goal="tidy up", requested_by=Actor(id="ana")),
        tenant=tenant,
        session_id="unplanned",
        source="helmline/api",
    )
    await store.append(started)
    failed = SessionFailed(reason="the model could not be asked: no API key")
    await store.append(started.derive(failed, source="helmline/planner"))

    result = await helmline(nats_url, "show", "unplanned", "-t", tenant)

    assert result.exit_code == 0, result.output
    assert "no steps" in result.stdout
    assert "┃ step" not in result.stdout  # No empty table of steps.


async def test_show_lists_the_standing_grants_and_what_they_cover(
    nats_url: str, session: Session
) -> None:
    await session.plan_and_ask("r1")
    await session.emit(
        ApprovalGranted(
            request_id="r1",
            decided_by=(Actor(id="ana", roles=("approver",)),),
            similar_limit=3,
            similar_until=datetime.now(UTC) + timedelta(minutes=30),
            similar_where={"command": ArgumentCondition(regex="^wc ")},
        )
    )

    result = await helmline(nats_url, "show", session.id, "-t", session.tenant)

    assert result.exit_code == 0, result.output
    for shown in ("standing grants (approve similar)", "0 of 3", '{"command": {"regex": "^wc "}}'):
        assert shown in result.stdout


async def test_show_says_up_front_what_the_plan_expects_and_how_each_call_went(
    nats_url: str, session: Session
) -> None:
    steps = (
        PlanStep(id="fetch", tool="echo", estimated_duration_s=30),
        PlanStep(
            id="send",
            tool="run_command",
            depends_on=("fetch",),
            requires_approval=True,
            estimated_duration_s=120,
        ),
        PlanStep(id="recall", tool="echo"),
    )
    await session.emit(
        PlanProposed(
            revision=1,
            steps=steps,
            confidence=0.8,
            estimated_duration_s=150,
            permissions=("echo", "run_command"),
            completion_criteria=("fetched", "sent", "logged"),
            criteria_required=2,
        )
    )
    call = {"call_id": "c-fetch", "step_id": "fetch", "tool": "echo"}
    await session.emit(StepScheduled(**call, arguments={"message": "hi"}))
    await session.emit(ToolCallAuthorized(**call, risk="low"))
    error = ToolError(kind="unavailable", message="no answer", retryable=True)
    for attempt in (1, 2):
        await session.emit(
            ToolCallAttemptFailed(**call, attempt=attempt, error=error, retry_in_s=1)
        )
    recall = {"call_id": "c-recall", "step_id": "recall", "tool": "echo"}
    await session.emit(StepScheduled(**recall, arguments={"message": "hi"}))
    await session.emit(ToolCallAuthorized(**recall, risk="low"))
    await session.emit(ToolCallCompleted(**recall, output="hi", cached_from="c-earlier"))

    result = await helmline(nats_url, "show", session.id, "-t", session.tenant)

    assert result.exit_code == 0, result.output
    shown = " ".join(result.stdout.split())
    expected = (
        "plan: confidence 80%; about 2 min; needs echo, run_command; "
        "2 of 3 completion criteria must be met"
    )
    assert expected in shown
    assert "authorized (2 retries)" in shown
    assert "pending (plan asks approval)" in shown
    assert "succeeded (result of c-earlier)" in shown


async def _run_first_step(session: Session) -> None:
    await session.plan_and_ask()
    call = {"call_id": "c-write", "step_id": "write", "tool": "write_file"}
    await session.emit(StepScheduled(**call, arguments={"path": "notes.txt", "content": "x"}))
    await session.emit(ToolCallAuthorized(**call, risk="medium"))
    await session.emit(ToolCallStarted(**call))
    await session.emit(ToolCallCompleted(**call, output={"bytes": 69}, duration_ms=1.5))
    await session.emit(
        CheckpointCreated(
            checkpoint_id="cp-write",
            step_id="write",
            call_id="c-write",
            at_seq=5,
            changes=FileChanges(created=("notes.txt",)),
        )
    )


async def test_show_and_events_of_an_unknown_session(nats_url: str, tenant: str) -> None:
    for command in ("show", "events", "pause"):
        result = await helmline(nats_url, command, "nosuchsession", "--tenant", tenant)

        assert result.exit_code == 1
        assert f"no session nosuchsession in tenant '{tenant}'" in result.stderr


async def test_an_invalid_session_id_is_refused(nats_url: str) -> None:
    result = await helmline(nats_url, "show", "a.b.>")

    assert result.exit_code == 2
    assert "invalid session id" in result.stderr


async def test_events_json_prints_each_event_as_a_cloudevent(
    nats_url: str, session: Session
) -> None:
    await _run_first_step(session)

    result = await helmline(nats_url, "events", session.id, "-t", session.tenant, "--json")

    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    logged = await session.events()
    assert [decode_event(line) for line in lines] == logged
    for line in lines:
        document: dict[str, Any] = json.loads(line)
        assert document["specversion"] == "1.0"
        assert {"id", "source", "type", "time", "subject", "data"} <= set(document)
        assert document["sessionid"] == session.id


async def test_events_prints_a_readable_line_per_event(nats_url: str, session: Session) -> None:
    await _run_first_step(session)

    result = await helmline(nats_url, "events", session.id, "-t", session.tenant)

    lines = result.stdout.splitlines()
    assert len(lines) == len(await session.events())
    assert "session.started" in lines[0]
    assert "tool.call.completed" in lines[-2]
    assert 'output={"bytes":69}' in lines[-2]


async def test_events_follow_until_end_stops_when_the_session_ends(
    nats_url: str, session: Session
) -> None:
    following = asyncio.create_task(
        helmline(nats_url, "events", session.id, "-t", session.tenant, "-f", "--until-end")
    )
    await session.plan_and_ask()
    await session.emit(SessionCompleted(summary="done"))

    result = await asyncio.wait_for(following, timeout=30)

    assert result.exit_code == 0, result.output
    types = [line.split()[2] for line in result.stdout.splitlines()]
    assert types == ["session.started", "plan.proposed", "session.completed"]


async def test_events_follow_prints_new_events_until_interrupted(
    nats_url: str, session: Session
) -> None:
    # A real process: Ctrl-C and line-by-line output are what a terminal sees.
    process = await asyncio.create_subprocess_exec(
        str(HELMLINE),
        *("events", session.id, "-t", session.tenant, "--follow", "--json"),
        env={**os.environ, "HELMLINE_NATS_URL": nats_url},
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        first = await asyncio.wait_for(process.stdout.readline(), timeout=30)
        assert json.loads(first)["type"] == "session.started"
        await session.emit(SessionPauseRequested(requested_by=Actor(id="ana")))
        second = await asyncio.wait_for(process.stdout.readline(), timeout=30)
        assert json.loads(second)["type"] == "session.pause_requested"

        process.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(process.wait(), timeout=30) == 130
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def test_sessions_lists_each_session_with_its_status(
    nats_url: str, store: EventStore, tenant: str
) -> None:
    ids = []
    for _ in range(2):
        result = await helmline(nats_url, "run", "-p", str(HELLO), "-t", tenant, "--json")
        ids.append(json.loads(result.stdout)["session_id"])
    await Session(store, tenant, ids[1]).emit(SessionCompleted())

    listed = await helmline(nats_url, "sessions", "-t", tenant, "--json")
    table = await helmline(nats_url, "sessions", "-t", tenant)

    summaries = json.loads(listed.stdout)
    assert [(s["session_id"], s["status"]) for s in summaries] == [
        (ids[0], "planning"),
        (ids[1], "completed"),
    ]
    assert all(session_id in table.stdout for session_id in ids)


async def test_sessions_lists_those_started_last_and_says_how_many_it_left_out(
    nats_url: str, tenant: str
) -> None:
    ids = []
    for _ in range(3):
        result = await helmline(nats_url, "run", "-p", str(HELLO), "-t", tenant, "--json")
        ids.append(json.loads(result.stdout)["session_id"])

    latest = await helmline(nats_url, "sessions", "-t", tenant, "--limit", "2", "--json")
    every = await helmline(nats_url, "sessions", "-t", tenant, "-n", "0", "--json")

    assert [s["session_id"] for s in json.loads(latest.stdout)] == ids[1:]
    assert "the 2 started last of 3 sessions; --limit 0 lists them all" in latest.stderr
    assert [s["session_id"] for s in json.loads(every.stdout)] == ids
    assert every.stderr == ""


async def test_commands_say_when_no_stack_runs(tmp_path: Path) -> None:
    result = await asyncio.to_thread(
        CliRunner().invoke,
        app,
        ["sessions", "--data-dir", str(tmp_path)],
        env={"HELMLINE_NATS_URL": None, "HELMLINE_DATA_DIR": None},
    )

    assert result.exit_code == 1
    assert f"no stack is running from {tmp_path}" in result.stderr


def _decisions(events: list[Event]) -> list[ApprovalDecisionSubmitted]:
    return [e.data for e in events if isinstance(e.data, ApprovalDecisionSubmitted)]


async def test_the_sample_session_is_started_once_per_log(
    nats_url: str, store: EventStore, tenant: str
) -> None:
    playbook = sample_playbook()
    assert playbook == HELLO

    first = await asyncio.to_thread(start_sample, nats_url, playbook, tenant=tenant)
    again = await asyncio.to_thread(start_sample, nats_url, playbook, tenant=tenant)

    assert first is not None
    assert again is None
    (event,) = await Session(store, tenant, first).events()
    assert isinstance(event.data, SessionStarted)
    assert event.data.playbook == load_playbook(HELLO)


async def test_show_at_each_sequence_is_the_fold_of_that_prefix(
    nats_url: str, session: Session
) -> None:
    await _run_first_step(session)
    await session.emit(_approval_request("r1"))
    stored = await session.store.read_all(session.tenant, session.id)

    for index, item in enumerate(stored):
        result = await helmline(
            nats_url, "show", session.id, "-t", session.tenant, "--at-seq", str(item.seq), "--json"
        )
        assert result.exit_code == 0, result.output
        expected = fold(entry.event for entry in stored[: index + 1])
        assert json.loads(result.stdout) == json.loads(
            TypeAdapter(SessionState).dump_json(expected)
        )

    before = await helmline(
        nats_url, "show", session.id, "-t", session.tenant, "--at-seq", str(stored[0].seq - 1)
    )
    if stored[0].seq > 1:
        assert before.exit_code == 1
        assert "at or before sequence" in before.stderr
