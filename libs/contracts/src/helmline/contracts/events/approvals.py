"""Requests for a person's approval (of a plan, a call or a permission), and the decisions."""

from __future__ import annotations

from datetime import datetime
from typing import Literal, Self, TypeAlias

from pydantic import Field

from helmline.contracts._payload import Payload
from helmline.contracts._services import API, APPROVAL
from helmline.contracts._taint import CallTaint
from helmline.contracts._values import (
    Actor,
    ArgumentCondition,
    Arguments,
    Contract,
    Risk,
    StepId,
    ToolName,
)
from helmline.contracts.events._samples import ANA, AT


class ApprovalRequested(Payload, type="approval.requested", published_by=(APPROVAL,)):
    """A person must decide before something runs."""

    request_id: str = Field(min_length=1, max_length=128)
    """Identifies the request in decisions."""
    scope: Literal["plan", "step"]
    """Whether a whole plan revision or one step waits."""
    revision: int | None = None
    """The plan revision, for plan approvals."""
    step_id: StepId | None = None
    """The step, for step approvals."""
    call_id: str | None = None
    """The tool call that waits, for step approvals."""
    tool: ToolName | None = None
    """The tool to be called."""
    arguments: Arguments | None = None
    """The arguments it would be called with."""
    risk: Risk
    """The risk that made approval necessary."""
    reason: str
    """Why approval is needed, in words."""
    rule: str | None = None
    """The policy rule that asked for approval."""
    policy_hash: str | None = None
    """Hash of the policy in force when asking."""
    agent_reason: str | None = None
    """The agent's stated reason for the action."""
    approver_roles: tuple[str, ...] = ("approver",)
    """Roles allowed to decide."""
    quorum: int = Field(default=1, ge=1)
    """How many distinct approvers must grant."""
    expires_at: datetime
    """When the request becomes a denial if nobody decided."""
    taint: CallTaint | None = None
    """For step approvals, what untrusted content the model had read when it proposed the
    call: the results (step, call and tool) its arguments came from, with the span to read,
    and those flagged as suspected injections. None when none was in its context."""
    definition_digest: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    """For step approvals of an MCP tool, the digest of the tool's definition when asked
    (`ToolSpec.definition_digest`): a grant, and an "approve similar" grant, holds for that
    definition only. None for built-in tools, and in logs written before tools were pinned."""

    @classmethod
    def example(cls) -> Self:
        return cls(
            request_id="count.1",
            scope="step",
            step_id="count",
            call_id="count.1",
            tool="run_command",
            arguments={"command": "wc -c notes.txt"},
            risk="high",
            reason="high-risk tool calls need a person's approval",
            rule="default: require approval for high and critical risk",
            approver_roles=("approver",),
            expires_at=AT,
        )


PermissionKind: TypeAlias = Literal["tool", "network", "path"]
"""What sort of permission a call needs: a tool's required permission, a network host, or a
workspace path."""


GrantScope: TypeAlias = Literal["step", "session"]
"""What a granted permission stands for: the step that asked (its retries too), or every
later call of the session that needs it."""


class PermissionNeed(Contract):
    """One permission a call needs and the session lacks: what, and why it is needed."""

    kind: PermissionKind
    """`tool`: the tool's required permission, which the requester does not hold;
    `network`: a host the step declares it reaches, which the policy rule deciding the call
    does not grant; `path`: the workspace path the call's `path` argument names, outside the
    paths that rule grants."""
    name: str = Field(min_length=1, max_length=4096)
    """The permission's name (`repo.write`), the host (`api.example.com`), or the path
    (normalised, `deploy/prod.env`)."""
    reason: str = Field(min_length=1)
    """Why it is needed, naming the rule (or the tool's configuration) that asks for it."""


class PermissionRequested(ApprovalRequested, type="permission.requested", published_by=(APPROVAL,)):
    """A call needs a permission the session lacks; instead of being denied it waits for a
    person to grant it, for the step or for the session, until a time they choose (or to
    deny it).

    An approval request of a new kind: it waits in the same queue, is decided with the same
    `approval.decision_submitted` (with `grant_scope` and `grant_until`), and ends in the
    same `approval.granted`, `approval.denied` or `approval.expired`. Once granted the call is
    judged again with the permission held, so the policy's rules still decide it (they may
    allow it, send it to approval or deny it).
    """

    permissions: tuple[PermissionNeed, ...] = Field(min_length=1)
    """Every permission the call lacks; one grant grants them all."""

    @classmethod
    def example(cls) -> Self:
        return cls(
            request_id="permission-fetch.1",
            scope="step",
            step_id="fetch",
            call_id="fetch.1",
            tool="run_command",
            arguments={"command": "curl -s https://api.example.com/status"},
            risk="high",
            reason="the call needs network host api.example.com, which rule commands-offline "
            "does not grant",
            rule="commands-offline",
            approver_roles=("approver", "admin"),
            expires_at=AT,
            permissions=(
                PermissionNeed(
                    kind="network",
                    name="api.example.com",
                    reason="rule commands-offline grants no network host",
                ),
            ),
        )


class ApprovalDecisionSubmitted(Payload, type="approval.decision_submitted", published_by=(API,)):
    """A person decided on an approval request (an intent, checked by the approval service)."""

    request_id: str = Field(min_length=1, max_length=128)
    """The request decided on."""
    decision: Literal["grant", "deny"]
    """The decision."""
    decided_by: Actor
    """Who decided, with their roles."""
    comment: str = ""
    """Why, in their words."""
    modified_arguments: Arguments | None = None
    """Arguments to use instead of the requested ones, when granting with changes."""
    similar_limit: int | None = Field(default=None, ge=1, le=1000)
    """With a grant: also approve, in this session, up to this many later calls of the same
    tool that the same policy rule sends to approval ("approve similar calls")."""
    similar_until: datetime | None = None
    """Until when that standing grant holds; an hour after the grant when not given."""
    similar_where: dict[str, ArgumentCondition] | None = None
    """With `similar_limit`: conditions on the later calls' arguments, by name, that each
    must meet to run under the grant (only this user's rows, only paths under `build/`)."""
    grant_scope: GrantScope | None = None
    """For a permission request: grant it for the step that asked, or for the session (every
    later call that needs the same permission); the step when not given."""
    grant_until: datetime | None = None
    """For a permission request: when the granted permission ends; the policy's
    `permission_requests.grant_expires_in` after the grant when not given."""

    @classmethod
    def example(cls) -> Self:
        return cls(request_id="count.1", decision="grant", decided_by=ANA, comment="fine")


class ApprovalGranted(Payload, type="approval.granted", published_by=(APPROVAL,)):
    """An approval request was granted."""

    request_id: str = Field(min_length=1, max_length=128)
    """The request granted."""
    decided_by: tuple[Actor, ...]
    """Everyone whose grant made the quorum."""
    comment: str = ""
    """The deciding comment."""
    modified_arguments: Arguments | None = None
    """Arguments the approvers substituted, if any."""
    similar_limit: int | None = Field(default=None, ge=1, le=1000)
    """How many later calls of the same tool, sent to approval by the same rule, this grant
    also approves in the session; None for this call only."""
    similar_until: datetime | None = None
    """When that standing grant ends."""
    similar_where: dict[str, ArgumentCondition] | None = None
    """Conditions on the later calls' arguments that the standing grant is limited to."""
    grant_scope: GrantScope | None = None
    """For a permission request: what the permissions granted stand for, the step that asked
    or the whole session; None for other requests."""
    grant_until: datetime | None = None
    """For a permission request: when the permissions granted end; the policy no longer
    counts them from then on."""

    @classmethod
    def example(cls) -> Self:
        return cls(request_id="count.1", decided_by=(ANA,), comment="fine")


class ApprovalDenied(Payload, type="approval.denied", published_by=(APPROVAL,)):
    """An approval request was denied by a person."""

    request_id: str = Field(min_length=1, max_length=128)
    """The request denied."""
    decided_by: Actor
    """Who denied it."""
    comment: str = ""
    """Why."""

    @classmethod
    def example(cls) -> Self:
        return cls(request_id="count.1", decided_by=ANA, comment="not now")


class ApprovalDecisionRefused(Payload, type="approval.decision_refused", published_by=(APPROVAL,)):
    """A person's decision changed nothing, and why: there is no such pending request, they
    hold none of the roles that may decide, or the arguments they substituted do not fit the
    tool's schema or the policy in force."""

    request_id: str = Field(min_length=1, max_length=128)
    """The request the decision named."""
    decided_by: Actor
    """Who tried to decide."""
    reason: str = Field(min_length=1)
    """Why the decision was refused, for that person."""

    @classmethod
    def example(cls) -> Self:
        return cls(
            request_id="count.1",
            decided_by=Actor(id="eve", kind="user", roles=("viewer",)),
            reason="eve holds none of the roles that may decide (approver)",
        )


class ApprovalVoteCounted(Payload, type="approval.vote_counted", published_by=(APPROVAL,)):
    """A grant counted towards a request's quorum; more distinct approvers are needed."""

    request_id: str = Field(min_length=1, max_length=128)
    """The request granted."""
    decided_by: Actor
    """Who granted."""
    grants: int = Field(ge=1)
    """Distinct approvers who granted the same thing so far."""
    quorum: int = Field(ge=2)
    """How many are needed."""

    @classmethod
    def example(cls) -> Self:
        return cls(request_id="count.1", decided_by=ANA, grants=1, quorum=2)


class ApprovalExpired(Payload, type="approval.expired", published_by=(APPROVAL,)):
    """Nobody decided in time; an expired request counts as a denial."""

    request_id: str = Field(min_length=1, max_length=128)
    """The request that expired."""

    @classmethod
    def example(cls) -> Self:
        return cls(request_id="count.1")
