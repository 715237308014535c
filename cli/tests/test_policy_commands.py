"""`helmline policy check` and `helmline policy explain`."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

from typer.testing import CliRunner

from helmline.approval import default_policy, parse_policy
from helmline.approval._policy import judge_plan, judge_step
from helmline.cli._app import app
from helmline.contracts import (
    BUILTIN_TOOLS,
    TOOL_REGISTRY_SUBJECT,
    TOOLS_SESSION,
    TOOLS_TENANT,
    Actor,
    ApprovalRequested,
    Event,
    PlanApproved,
    PlanProposed,
    PlanStep,
    SessionStarted,
    StepAuthorized,
    StepScheduled,
    ToolCallDenied,
    ToolRegistryPublished,
    ToolSpec,
    new_event,
)
from helmline.runtime import EventStore
from helmline.runtime.testing import session_started
from helmline.yamlfile import MAX_BYTES

EXAMPLES = Path(__file__).parents[2] / "examples" / "policies"


def test_check_accepts_a_valid_file_and_prints_its_hash() -> None:
    path = EXAMPLES / "team.yaml"
    result = CliRunner().invoke(app, ["policy", "check", str(path)])

    assert result.exit_code == 0, result.output
    assert "valid, 10 rules" in result.stdout
    assert parse_policy(path.read_bytes(), source="x").hash in result.stdout


def test_check_refuses_an_invalid_file_naming_the_line(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(
        "rules:\n"
        "  - name: ok\n"
        "    effect: allow\n"
        "  - name: broken\n"
        "    effect: require_approval\n"
        "    approval: {quorum: many}\n"
    )
    result = CliRunner().invoke(app, ["policy", "check", str(path)])

    assert result.exit_code == 2
    assert f"{path}:6: rules[1].approval.quorum:" in result.stderr


def test_check_names_a_missing_file(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["policy", "check", str(tmp_path / "nope.yaml")])

    assert result.exit_code == 2
    assert "nope.yaml:1: cannot read" in result.stderr


def _planned_and_scheduled(started: Event, step: PlanStep) -> list[Event]:
    """A session's first events: started, a plan of one step, and its first call scheduled."""
    scheduled = StepScheduled(
        step_id=step.id, call_id=f"{step.id}.1", tool=step.tool, arguments=step.arguments
    )
    return [
        started,
        started.derive(PlanProposed(revision=1, steps=(step,)), source="test"),
        started.derive(scheduled, source="test"),
    ]


async def _session_waiting_on_a_command(store: EventStore, tenant: str) -> str:
    session_id = uuid.uuid4().hex
    started = new_event(
        SessionStarted(goal="g", requested_by=Actor(id="ana", roles=("operator",))),
        tenant=tenant,
        session_id=session_id,
        source="test",
    )
    wipe = PlanStep(id="wipe", tool="run_command", arguments={"command": "rm -rf build"})
    policy = default_policy()
    verdict = policy.judge(
        tenant=tenant, tool="run_command", arguments=wipe.arguments, at=datetime.now(UTC)
    )
    assert verdict.approval is not None
    events = [
        *_planned_and_scheduled(started, wipe),
        started.derive(
            ApprovalRequested(
                request_id="wipe.1",
                scope="step",
                step_id="wipe",
                call_id="wipe.1",
                tool="run_command",
                arguments=wipe.arguments,
                risk=verdict.risk,
                reason=verdict.reason,
                rule=verdict.rule,
                policy_hash=policy.hash,
                expires_at=datetime.now(UTC) + timedelta(minutes=10),
            ),
            source="test",
        ),
    ]
    for event in events:
        await store.append(event)
    return session_id


async def test_explain_shows_the_recorded_rule_and_why_each_rule_did_or_did_not_match(
    store: EventStore, nats_url: str, tenant: str, tmp_path: Path
) -> None:
    session_id = await _session_waiting_on_a_command(store, tenant)
    runner = CliRunner()

    built_in = await asyncio.to_thread(
        runner.invoke,
        app,
        ["policy", "explain", session_id, "wipe", "--tenant", tenant],
        env={"HELMLINE_NATS_URL": nats_url, "HELMLINE_POLICY": None},
    )

    assert built_in.exit_code == 0, built_in.output
    lines = built_in.stdout.splitlines()
    assert lines[0].startswith('step wipe: run_command {"command": "rm -rf build"} (risk high)')
    assert "requested by ana (roles: operator)" in lines
    assert any(
        line.startswith("recorded: require_approval by rule approve-high-and-critical-risk")
        for line in lines
    )
    assert any("is the one it was decided under" in line for line in lines)
    assert "  3. allow-low-and-medium-risk: skipped, not: risk is low or medium" in lines
    assert any(line.startswith("  4. approve-high-and-critical-risk: MATCHED") for line in lines)

    stricter = tmp_path / "stricter.yaml"
    stricter.write_text(
        "rules:\n  - name: no-rm\n    arguments:\n      command: {regex: '\\brm\\b'}\n"
        "    effect: deny\n    reason: nothing is deleted\n"
    )
    other = await asyncio.to_thread(
        runner.invoke,
        app,
        ["policy", "explain", session_id, "wipe", "--tenant", tenant, "--policy", str(stricter)],
        env={"HELMLINE_NATS_URL": nats_url},
    )
    assert other.exit_code == 0, other.output
    assert "is NOT the one it was decided under" in other.stdout
    assert "verdict: deny by rule no-rm: nothing is deleted" in other.stdout


async def test_explain_reads_a_time_window_as_of_when_the_decision_was_recorded(
    store: EventStore, nats_url: str, tenant: str, tmp_path: Path
) -> None:
    started = session_started(tenant)
    step = PlanStep(id="wipe", tool="run_command", arguments={"command": "rm -rf build"})
    # Decided on a Saturday; the explanation is asked for on any other day as well.
    saturday = datetime(2026, 12, 5, 10, tzinfo=UTC)
    denied = started.derive(
        ToolCallDenied(
            call_id="wipe.1", step_id="wipe", tool="run_command", reason="r", rule="weekend"
        ),
        source="test",
    )
    for event in (
        *_planned_and_scheduled(started, step),
        denied.model_copy(update={"time": saturday}),
    ):
        await store.append(event)
    policy = tmp_path / "weekend.yaml"
    policy.write_text(
        "rules:\n"
        "  - name: weekend\n    during: {days: sat-sun}\n    effect: deny\n"
        "  - name: weekdays\n    effect: allow\n"
    )

    result = await asyncio.to_thread(
        CliRunner().invoke,
        app,
        ["policy", "explain", started.session_id, "wipe", "--tenant", tenant],
        env={"HELMLINE_NATS_URL": nats_url, "HELMLINE_POLICY": str(policy)},
    )

    assert result.exit_code == 0, result.output
    assert "judged as of 2026-12-05T10:00:00+00:00" in result.stdout
    assert "  1. weekend: MATCHED (within 00:00-24:00 UTC on sat, sun)" in result.stdout
    assert "verdict: deny by rule weekend" in result.stdout


async def test_explain_says_when_the_plan_asked_a_person_about_a_step_the_policy_allows(
    store: EventStore, nats_url: str, tenant: str
) -> None:
    started = session_started(tenant)
    step = PlanStep(id="say", tool="echo", arguments={"message": "hi"}, requires_approval=True)
    for event in _planned_and_scheduled(started, step):
        await store.append(event)

    result = await asyncio.to_thread(
        CliRunner().invoke,
        app,
        ["policy", "explain", started.session_id, "say", "--tenant", tenant],
        env={"HELMLINE_NATS_URL": nats_url, "HELMLINE_POLICY": None},
    )

    assert result.exit_code == 0, result.output
    assert any(
        line.startswith("  3. allow-low-and-medium-risk: MATCHED")
        for line in result.stdout.splitlines()
    )
    assert (
        "verdict: require_approval by rule allow-low-and-medium-risk: the plan asks a person "
        "to approve this step (rule allow-low-and-medium-risk would allow it)"
    ) in result.stdout


async def test_explain_shows_the_decision_a_step_was_scheduled_with_by_its_approved_plan(
    store: EventStore, nats_url: str, tenant: str
) -> None:
    started = session_started(tenant)
    step = PlanStep(id="say", tool="echo", arguments={"message": "hi"})
    policy = default_policy()
    (approval,) = judge_plan(
        PlanProposed(revision=1, steps=(step,)),
        policy,
        tenant=tenant,
        requester=None,
        now=datetime.now(UTC),
    )
    assert isinstance(approval.payload, PlanApproved)
    scheduled = StepAuthorized(
        step_id="say", call_id="say.1", tool="echo", arguments=step.arguments, authorized_by_plan=1
    )
    planned = _planned_and_scheduled(started, step)[:2]
    for event in (
        *planned,
        started.derive(approval.payload, source="test"),
        started.derive(scheduled, source="test"),
    ):
        await store.append(event)

    result = await asyncio.to_thread(
        CliRunner().invoke,
        app,
        ["policy", "explain", started.session_id, "say", "--tenant", tenant],
        env={"HELMLINE_NATS_URL": nats_url, "HELMLINE_POLICY": None},
    )

    assert result.exit_code == 0, result.output
    assert (
        f"recorded: allow by rule allow-low-and-medium-risk under policy {policy.hash}"
        in result.stdout
    )


async def test_explain_says_which_permission_a_step_lacks_and_what_decides_it_once_granted(
    store: EventStore, nats_url: str, tenant: str, tmp_path: Path
) -> None:
    policy_file = tmp_path / "hosts.yaml"
    policy_file.write_text(
        "permission_requests: {roles: [approver]}\n"
        "rules:\n  - name: status-only\n    hosts: [status.example.com]\n    effect: allow\n"
    )
    policy = parse_policy(policy_file.read_bytes(), source=str(policy_file))
    started = session_started(tenant)
    step = PlanStep(id="say", tool="echo", arguments={"message": "hi"}, hosts=("api.example.com",))
    scheduled = StepScheduled(
        step_id="say", call_id="say.1", tool="echo", arguments=step.arguments, hosts=step.hosts
    )
    (asked,) = judge_step(scheduled, policy, tenant=tenant, requester=None, now=datetime.now(UTC))
    events = [
        *_planned_and_scheduled(started, step)[:2],
        started.derive(scheduled, source="test"),
        started.derive(asked.payload, source="test"),
    ]
    for event in events:
        await store.append(event)

    result = await asyncio.to_thread(
        CliRunner().invoke,
        app,
        ["policy", "explain", started.session_id, "say", "--tenant", tenant],
        env={"HELMLINE_NATS_URL": nats_url, "HELMLINE_POLICY": str(policy_file)},
    )

    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    recorded = "recorded: request_permission by rule status-only"
    assert any(line.startswith(recorded) for line in lines)
    assert "verdict: request_permission, once granted allow by rule status-only: " in result.stdout
    assert (
        "  lacks network api.example.com: rule status-only grants only hosts matching "
        "'status.example.com'"
    ) in lines


async def test_explain_names_the_steps_when_the_step_is_unknown(
    store: EventStore, nats_url: str, tenant: str
) -> None:
    session_id = await _session_waiting_on_a_command(store, tenant)
    result = await asyncio.to_thread(
        CliRunner().invoke,
        app,
        ["policy", "explain", session_id, "nope", "--tenant", tenant],
        env={"HELMLINE_NATS_URL": nats_url},
    )
    assert result.exit_code == 1
    assert "has no step 'nope' (steps: wipe)" in result.stderr


async def test_explain_judges_a_federated_tool_as_the_published_registry_declares_it(
    store: EventStore, nats_url: str, tenant: str
) -> None:
    close = ToolSpec(
        name="tickets__close",
        description="Close a ticket.",
        parameters={"type": "object", "properties": {"id": {"type": "string"}}},
        risk="medium",
        executor="mcp",
        server="tickets",
        remote_name="close",
    )
    registry = ToolRegistryPublished(tools=(*BUILTIN_TOOLS, close))
    await store.publish(
        TOOL_REGISTRY_SUBJECT,
        new_event(registry, tenant=TOOLS_TENANT, session_id=TOOLS_SESSION, source="test"),
    )
    started = session_started(tenant)
    session_id = started.session_id
    step = PlanStep(id="close", tool="tickets__close", arguments={"id": "T-1"})
    for event in _planned_and_scheduled(started, step):
        await store.append(event)

    result = await asyncio.to_thread(
        CliRunner().invoke,
        app,
        ["policy", "explain", session_id, "close", "--tenant", tenant],
        env={"HELMLINE_NATS_URL": nats_url, "HELMLINE_POLICY": None},
    )

    assert result.exit_code == 0, result.output
    assert "(risk medium)" in result.stdout.splitlines()[0]
    assert any(
        line.startswith("  3. allow-low-and-medium-risk: MATCHED")
        for line in result.stdout.splitlines()
    ), result.stdout


def test_up_refuses_an_invalid_policy_before_starting_anything(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("rules:\n  - name: a\n    effect: allow\n    tool: [\n")
    data_dir = tmp_path / "data"

    result = CliRunner().invoke(
        app, ["up", "--policy", str(policy), "--data-dir", str(data_dir), "--no-sample"]
    )

    assert result.exit_code == 2
    assert f"{policy}:5: invalid YAML" in result.stderr
    assert not data_dir.exists()


def test_check_refuses_a_file_past_its_size_limit(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text("rules: []\n" + "#" * MAX_BYTES)
    result = CliRunner().invoke(app, ["policy", "check", str(path)])

    assert result.exit_code == 2
    assert f"{path}:1: this policy is larger than the 1048576 bytes read of one" in result.stderr
    assert "###" not in result.stderr


def test_up_refuses_an_mcp_servers_file_past_its_size_limit(tmp_path: Path) -> None:
    servers = tmp_path / "servers.yaml"
    servers.write_text("servers: []\n" + "#" * MAX_BYTES)
    data_dir = tmp_path / "data"

    result = CliRunner().invoke(
        app, ["up", "--mcp-servers", str(servers), "--data-dir", str(data_dir), "--no-sample"]
    )

    assert result.exit_code == 2
    assert (
        f"{servers}:1: this MCP servers file is larger than the 1048576 bytes read of one"
        in result.stderr
    )
    assert "###" not in result.stderr
    assert not data_dir.exists()
