"""A tool's required permission, enforced by the approval service across the services as
processes: an MCP tool that creates a git branch runs only in the sessions of a requester
holding its permission."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from nats.js import JetStreamContext

from helmline.contracts import (
    Actor,
    Payload,
    PlanStep,
    Playbook,
    SessionState,
    ToolCallCompleted,
    ToolCallDenied,
    ToolCallStarted,
    fold,
)
from helmline.runtime import EventStore, latest_tool_registry
from helmline.runtime.testing import ServiceProcesses, eventually, run_playbook

from .mcp_servers import federating_stack, git_repository

CREATE_BRANCH = "git__git_create_branch"
WRITER = Actor(id="wes", roles=("operator", "repo.write"))
READER = Actor(id="rita", roles=("operator",))


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return git_repository(tmp_path_factory.mktemp("repo") / "repo")


@pytest.fixture(scope="module")
def stack(
    nats_url: str, tmp_path_factory: pytest.TempPathFactory, repository: Path
) -> Iterator[ServiceProcesses]:
    git = {
        "id": "git",
        "stdio": {
            "command": sys.executable,
            "args": ["-m", "mcp_server_git", "--repository", str(repository)],
        },
        "sandbox": {"write": [str(repository)]},
        # Low risk: the built-in policy lets the call run at once, so what decides is the
        # permission alone.
        "risk": "low",
        "tools": {"git_create_branch": {"required_permission": "repo.write"}},
    }
    with federating_stack(nats_url, tmp_path_factory.mktemp("stack"), [git]) as running:
        yield running


async def _git_federated(js: JetStreamContext) -> None:
    async def published() -> bool:
        registry = await latest_tool_registry(js)
        return registry is not None and any(
            tool.name == CREATE_BRANCH and tool.required_permission == "repo.write"
            for tool in registry.tools
        )

    await eventually(published, timeout_s=60, what="the git server's tools in the registry")


async def _branch_session(
    store: EventStore, tenant: str, requester: Actor, branch: str, repository: Path
) -> tuple[SessionState, list[Payload]]:
    playbook = Playbook(
        goal="make a branch",
        steps=(
            PlanStep(
                id="branch",
                tool=CREATE_BRANCH,
                arguments={"repo_path": str(repository), "branch_name": branch},
            ),
        ),
    )
    session_id = await run_playbook(store, tenant, playbook, requester)
    events = [stored.event for stored in await store.read_all(tenant, session_id)]
    return fold(events), [event.data for event in events]


def _branches(repository: Path) -> set[str]:
    listed = subprocess.run(
        ["git", "branch", "--format=%(refname:short)"],
        cwd=repository,
        check=True,
        capture_output=True,
        text=True,
    )
    return set(listed.stdout.split())


async def test_a_tool_requiring_a_permission_runs_only_for_a_requester_holding_it(
    stack: ServiceProcesses,
    js: JetStreamContext,
    store: EventStore,
    tenant: str,
    repository: Path,
) -> None:
    await _git_federated(js)

    state, events = await _branch_session(store, tenant, READER, "not-for-rita", repository)
    assert state.status == "failed", state.outcome
    (denied,) = (e for e in events if isinstance(e, ToolCallDenied))
    assert denied.rule == "required-permission"
    assert denied.reason == (
        f"tool {CREATE_BRANCH!r} requires the permission 'repo.write', "
        "which the requester rita (roles: operator) does not hold"
    )
    assert "requires the permission 'repo.write'" in state.outcome
    assert not any(isinstance(e, ToolCallStarted) for e in events)
    assert "not-for-rita" not in _branches(repository)

    state, events = await _branch_session(store, tenant, WRITER, "for-wes", repository)
    assert state.status == "completed", state.outcome
    assert any(isinstance(e, ToolCallCompleted) for e in events)
    assert "for-wes" in _branches(repository)
