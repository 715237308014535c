"""A step whose approved plan authorised its call runs when scheduled, with no decision of
its own; one that claims an authorisation the plan's approval does not hold is refused.
Against a real MCP server that counts the calls it receives, behind a real gateway."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from nats.js import JetStreamContext

from helmline.contracts import (
    StepAuthorization,
    StepAuthorized,
    StepScheduled,
    ToolCallCompleted,
    ToolCallFailed,
    call_digest,
)

# Not a package, so mypy cannot follow; pytest imports it all the same.
from .conftest import (  # type: ignore[import-not-found]
    Calls,
    calls_received,
    federated,
    gateway_in_process,
    write_servers_file,
)

pytestmark = pytest.mark.usefixtures("drop_consumer")


def _authorization(step_id: str, tool: str, **arguments: Any) -> StepAuthorization:
    return StepAuthorization(
        step_id=step_id, call_digest=call_digest(tool, arguments), risk="low", rule="allow-notes"
    )


def _scheduled(
    step_id: str, tool: str, revision: int | None = 1, **arguments: Any
) -> StepScheduled:
    """`step.authorized` by plan `revision`; `step.scheduled` to be judged when None."""
    call = StepScheduled(step_id=step_id, call_id=f"{step_id}.1", tool=tool, arguments=arguments)
    if revision is None:
        return call
    return StepAuthorized(**call.model_dump(exclude_defaults=True), authorized_by_plan=revision)


async def test_a_step_its_plan_authorised_runs_when_scheduled_and_others_are_refused(
    nats_url: str,
    js: JetStreamContext,
    calls: Calls,
    tenant: str,
    server_id: str,
    state_dir: Path,
    tmp_path: Path,
) -> None:
    servers = write_servers_file(tmp_path / "servers.yaml", server_id, state_dir)
    note = f"{server_id}__note"
    await calls.approve_plan(
        _authorization("write", note, message="planned"),
        _authorization("other", note, message="planned"),
        _authorization("older", note, message="planned"),
    )
    async with gateway_in_process(nats_url, servers, tenant):
        await federated(js, server_id)
        ran = await calls.outcome(
            await calls.schedule(_scheduled("write", note, message="planned"))
        )
        assert isinstance(ran, ToolCallCompleted), ran
        # Planners before `step.authorized` named the plan on `step.scheduled`: still run.
        older = StepScheduled(
            step_id="older",
            call_id="older.1",
            tool=note,
            arguments={"message": "planned"},
            authorized_by_plan=1,
        )
        assert isinstance(await calls.outcome(await calls.schedule(older)), ToolCallCompleted)
        # The plan authorised other arguments, another step, another revision: none runs.
        refused = [
            await calls.outcome(await calls.schedule(scheduled))
            for scheduled in (
                _scheduled("other", note, message="not what was planned"),
                _scheduled("unplanned", note, message="planned"),
                _scheduled("other", note, revision=2, message="planned"),
            )
        ]
        # A step scheduled to be judged is left to the approval service.
        judged = await calls.schedule(_scheduled("judged", note, revision=None, message="x"))
        # Handled in order: once a later step has its outcome, the gateway saw that one.
        await calls.outcome(await calls.schedule(_scheduled("later", note, message="x")))
    for outcome in refused:
        assert isinstance(outcome, ToolCallFailed), outcome
        assert outcome.error.kind == "permission"
        assert "does not authorise it" in outcome.error.message
    assert await calls.events(judged) == [_scheduled("judged", note, revision=None, message="x")]
    assert calls_received(state_dir, "note") == 2
