"""A plan's steps: scheduled as a tool call, skipped, or tried again later."""

from __future__ import annotations

from datetime import datetime
from typing import Self

from pydantic import Field

from helmline.contracts._payload import Payload
from helmline.contracts._services import PLANNER, STATE
from helmline.contracts._taint import CallTaint
from helmline.contracts._values import Arguments, Host, Risk, StepId, ToolName
from helmline.contracts.events._samples import AT
from helmline.contracts.events.plans import PlanApproved
from helmline.contracts.events.tools import ToolCallAuthorized


# The state service schedules a rollback's undo calls (`compensation_id` set).
class StepScheduled(Payload, type="step.scheduled", published_by=(PLANNER, STATE)):
    """The planner wants a step to run now; it becomes a tool call."""

    step_id: StepId
    """The step."""
    call_id: str = Field(min_length=1, max_length=128)
    """The tool call this attempt makes; unique within the session."""
    attempt: int = Field(default=1, ge=1)
    """1 for the first try, then one more per retry."""
    tool: ToolName
    """The tool to call."""
    arguments: Arguments = Field(default_factory=dict)
    """The arguments."""
    risk: Risk | None = None
    """Risk declared by the plan, if any."""
    requires_approval: bool = False
    """The plan asks a person to approve this call, even where the policy would let it run."""
    compensation_id: str | None = Field(default=None, min_length=1, max_length=128)
    """Set when the call undoes a step during a rollback (scheduled by the state service, not
    the planner): it is judged and run like any call, but is not a step of the plan."""
    hosts: tuple[Host, ...] = ()
    """Network hosts the call needs to reach, as its plan step declares them."""
    taint: CallTaint | None = None
    """What untrusted content the model had read when it proposed the call, as its plan
    step records it; None when none was in its context (or a playbook or rollback made the
    call)."""
    authorized_by_plan: int | None = Field(default=None, ge=1)
    """The approved plan revision whose `authorized_steps` allowed this call (see
    `StepAuthorized`, which a planner appends for such a step). On `step.scheduled` it is
    None, the call being judged when scheduled (`tool.call.authorized` or another decision
    follows), except in events that planners before `step.authorized` appended: the gateway
    still runs those as authorised."""

    def authorized_by(self, approved: PlanApproved) -> ToolCallAuthorized | None:
        """The call as `approved` authorised it: None unless this event names that plan
        revision, and the plan authorised this step's call with exactly this tool and these
        arguments."""
        if self.authorized_by_plan != approved.revision or self.compensation_id is not None:
            return None
        authorization = approved.authorization_of(self.step_id, self.tool, self.arguments)
        if authorization is None:
            return None
        return ToolCallAuthorized(
            call_id=self.call_id,
            step_id=self.step_id,
            tool=self.tool,
            arguments=self.arguments,
            risk=authorization.risk,
            rule=authorization.rule,
            policy_hash=approved.policy_hash,
            sandbox_profile=authorization.sandbox_profile,
            network=authorization.network,
        )

    @classmethod
    def example(cls) -> Self:
        return cls(
            step_id="count",
            call_id="count.1",
            tool="run_command",
            arguments={"command": "wc -c notes.txt"},
        )


class StepAuthorized(StepScheduled, type="step.authorized", published_by=(PLANNER,)):
    """The planner wants a step to run now, and its approved plan authorised its call: the
    tool gateway runs it on this event, once it has checked that authorisation against the
    call, and no decision follows. A step scheduled all the same (the approval service,
    which judges every `step.scheduled`, is not handed these).

    A type of its own, not a flag on `step.scheduled`, because consumers filter by subject:
    the approval service would otherwise receive, decode and acknowledge each of them only
    to pass it by."""

    authorized_by_plan: int = Field(ge=1)
    """The approved plan revision whose `authorized_steps` allowed this call."""

    @classmethod
    def example(cls) -> Self:
        scheduled = StepScheduled.example().model_dump(exclude_defaults=True)
        return cls(**scheduled, authorized_by_plan=1)


class StepSkipped(Payload, type="step.skipped", published_by=(PLANNER,)):
    """A step will not run (it was denied and the plan continues, or a dependency failed)."""

    step_id: StepId
    """The step."""
    reason: str
    """Why it will not run."""

    @classmethod
    def example(cls) -> Self:
        return cls(step_id="count", reason="denied: not now")


class StepRetryDeferred(Payload, type="step.retry_deferred", published_by=(PLANNER,)):
    """A step whose call failed is tried again later, not at once: a call now would fail
    without doing anything (the failure said when a retry may succeed, or its MCP server's
    circuit breaker is open)."""

    step_id: StepId
    """The step."""
    call_id: str
    """The call that failed."""
    retry_at: datetime
    """When the next attempt is scheduled: when a retry may succeed."""
    reason: str
    """Why it waits."""

    @classmethod
    def example(cls) -> Self:
        return cls(
            step_id="count",
            call_id="count.1",
            retry_at=AT,
            reason="the circuit of MCP server tickets is open",
        )
