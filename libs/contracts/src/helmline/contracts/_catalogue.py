"""The catalogue: every event of a session's life, as frozen payload models.

Each payload is the CloudEvents `data` of one event type; its `TYPE` is the permanent CloudEvents
type string, carried in the envelope. Type strings never change; a breaking change bumps
`SCHEMA_VERSION` and registers an upcaster.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from functools import cached_property
from typing import Annotated, ClassVar, Literal

from pydantic import Field, JsonValue, StringConstraints, model_validator

from helmline.contracts._exchanges import CriterionResult, ModelReply, ModelRequestRecord
from helmline.contracts._plans import PlanStep, Playbook
from helmline.contracts._taint import CallTaint
from helmline.contracts._tools import ToolEffect, ToolSpec
from helmline.contracts._values import (
    Actor,
    ArgumentCondition,
    Arguments,
    ClassifierVerdict,
    Contract,
    FileChanges,
    Host,
    LimitHit,
    ResourceUsage,
    Risk,
    SandboxLimits,
    SessionId,
    StepId,
    TenantId,
    ToolError,
    ToolName,
)


class Payload(Contract):
    """Base of every event payload: the CloudEvents `data` of one event type."""

    TYPE: ClassVar[str]
    """The permanent CloudEvents type string; it never changes once published."""
    SCHEMA_VERSION: ClassVar[int] = 1
    """Bumped on a breaking change, with an upcaster from the previous version."""


# --- session ------------------------------------------------------------------------------


class ForkOrigin(Contract):
    """Where a forked session came from."""

    session_id: SessionId
    """The session that was forked."""
    at_seq: int = Field(ge=1)
    """Stream sequence of the origin session's last event included in the fork."""
    checkpoint_id: str | None = Field(default=None, min_length=1, max_length=128)
    """The origin's checkpoint the fork starts from."""
    snapshot_id: str | None = Field(default=None, min_length=1, max_length=128)
    """The origin's workspace snapshot the fork's workspace starts as; the fork runs no step
    before the sandbox has restored it (`workspace.restored`)."""
    completed_steps: tuple[StepId, ...] = ()
    """Steps the origin had completed at that point: the fork does not run them again."""


class SessionStarted(Payload):
    """A session was asked for: a goal, and optionally the playbook that achieves it."""

    TYPE = "session.started"
    goal: str = Field(min_length=1)
    """The goal in plain language."""
    mode: Literal["playbook", "plan", "act"] = "playbook"
    """How the planner works: a declared playbook, plan-then-execute, or one call at a time."""
    playbook: Playbook | None = None
    """The declared plan, for playbook sessions."""
    requested_by: Actor
    """Who started the session."""
    labels: dict[str, str] = Field(default_factory=dict)
    """Free-form labels for filtering."""
    fork_of: ForkOrigin | None = None
    """Set when this session is a fork of another."""


class SessionPauseRequested(Payload):
    """Someone asked that no new step start until the session is resumed."""

    TYPE = "session.pause_requested"
    requested_by: Actor
    """Who asked."""
    reason: str = ""
    """Why, if they said."""


class SessionPaused(Payload):
    """The planner stopped starting new steps; running steps finish."""

    TYPE = "session.paused"


class SessionResumeRequested(Payload):
    """Someone asked a paused session to continue."""

    TYPE = "session.resume_requested"
    requested_by: Actor
    """Who asked."""


class SessionResumed(Payload):
    """The planner continues scheduling steps."""

    TYPE = "session.resumed"


class SessionCancelRequested(Payload):
    """Someone asked to stop the session for good; running commands are killed."""

    TYPE = "session.cancel_requested"
    requested_by: Actor
    """Who asked."""
    reason: str = ""
    """Why, if they said."""


class SessionCancelled(Payload):
    """The session ended because it was cancelled."""

    TYPE = "session.cancelled"
    reason: str = ""
    """Why it was cancelled."""


class SessionCompleted(Payload):
    """The session reached its goal."""

    TYPE = "session.completed"
    summary: str = ""
    """What was achieved."""
    partial: bool = False
    """True when the session stopped with only some completion criteria met."""
    criteria: tuple[CriterionResult, ...] = ()
    """Each completion criterion as the planner checked it (goal sessions)."""


class SessionFailed(Payload):
    """The session ended without reaching its goal."""

    TYPE = "session.failed"
    reason: str
    """Why it failed."""
    step_id: StepId | None = None
    """The step whose failure ended the session, if one did."""


# --- thoughts and plans -------------------------------------------------------------------


class Alternative(Contract):
    """An option the planner considered and set aside."""

    option: str
    """What it could have done."""
    reason: str = ""
    """Why it did not."""


class ThoughtRecorded(Payload):
    """The planner's reasoning, streamed for people to follow.

    Version 2: each alternative carries why it was set aside (version 1 had bare strings).
    """

    TYPE = "thought.recorded"
    SCHEMA_VERSION = 2
    kind: Literal["observation", "reasoning", "decision", "action", "reflection"]
    """What sort of thought this is."""
    text: str
    """The thought itself."""
    confidence: float | None = Field(default=None, ge=0, le=1)
    """How sure the planner is, from 0 to 1."""
    alternatives: tuple[Alternative, ...] = ()
    """Options the planner considered and set aside, with why."""
    step_id: StepId | None = None
    """The step the thought is about, if any."""


class PlanProposed(Payload):
    """The planner proposed a plan (or a new revision of it after a replan)."""

    TYPE = "plan.proposed"
    revision: int = Field(ge=1)
    """1 for the first plan, then one more for each replan."""
    steps: tuple[PlanStep, ...]
    """The plan's steps."""
    reasoning: str = ""
    """Why this plan."""
    confidence: float | None = Field(default=None, ge=0, le=1)
    """How likely the planner thinks the plan is to succeed."""
    estimated_duration_s: float | None = Field(default=None, ge=0)
    """Expected duration of the whole plan: its longest chain of step estimates, when every
    step has one."""
    permissions: tuple[str, ...] = ()
    """Permissions the plan needs, shown up front."""
    completion_criteria: tuple[str, ...] = ()
    """What must hold for the goal to be met; the planner checks and reports each one."""
    criteria_required: int | None = Field(default=None, ge=1)
    """How many of the completion criteria must be met for the goal to count as reached
    (say 3 of 4); all of them when absent."""

    @model_validator(mode="after")
    def _requires_no_more_criteria_than_declared(self) -> PlanProposed:
        if self.criteria_required is not None and self.criteria_required > len(
            self.completion_criteria
        ):
            raise ValueError(
                f"criteria_required is {self.criteria_required}, but the plan declares "
                f"{len(self.completion_criteria)} completion criteria"
            )
        return self


class StepAuthorization(Contract):
    """Policy's verdict on a step's call, given with its plan: the call may run when it is
    scheduled as the plan declares it, without being judged again (one durable decision
    fewer on each step's path). Given only where the verdict cannot change before then: it
    depends on no time window, no count of the session's calls, no taint and no person."""

    step_id: StepId
    """The step."""
    call_digest: str = Field(pattern=r"^[0-9a-f]{64}$")
    """`call_digest` of the tool and arguments the plan declares: a call scheduled with any
    others is not authorised by this."""
    risk: Risk
    """The risk the decision was made at."""
    rule: str = Field(min_length=1, max_length=256)
    """The policy rule that allows the call."""
    sandbox_profile: str | None = None
    """Sandbox profile granted by the rule."""
    network: bool = False
    """Whether the call may use the network."""


def call_digest(tool: str, arguments: Arguments) -> str:
    """Identifies a call by its tool and arguments (in any key order): the SHA-256 of their
    canonical JSON."""
    canonical = json.dumps([tool, arguments], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


class PlanApproved(Payload):
    """A plan revision may be executed, by policy or by a person."""

    TYPE = "plan.approved"
    revision: int = Field(ge=1)
    """The approved revision."""
    approved_by: Actor
    """The policy rule or person that approved it."""
    policy_hash: str | None = None
    """Hash of the policy in force when deciding."""
    authorized_steps: tuple[StepAuthorization, ...] = ()
    """The steps whose calls the policy allowed with the plan: each runs when scheduled
    unchanged (`StepScheduled.authorized_by_plan`), without a `tool.call.authorized`. The
    others are judged one by one when scheduled."""

    @model_validator(mode="after")
    def _authorizes_each_step_once(self) -> PlanApproved:
        ids = [authorization.step_id for authorization in self.authorized_steps]
        if len(ids) != len(set(ids)):
            raise ValueError("authorized_steps names a step more than once")
        return self

    def authorization_of(
        self, step_id: str, tool: str, arguments: Arguments
    ) -> StepAuthorization | None:
        """The plan's authorisation of the step's call with exactly this tool and these
        arguments, if it gave one."""
        authorization = self._authorizations_by_step.get(step_id)
        if authorization is None or authorization.call_digest != call_digest(tool, arguments):
            return None
        return authorization

    @cached_property
    def _authorizations_by_step(self) -> dict[str, StepAuthorization]:
        # Looked up once per step: a scan would make a long plan's steps cost its length.
        return {authorization.step_id: authorization for authorization in self.authorized_steps}


class PlanRejected(Payload):
    """A plan revision may not be executed."""

    TYPE = "plan.rejected"
    revision: int = Field(ge=1)
    """The rejected revision."""
    reason: str
    """Why, shown to the planner."""
    rejected_by: Actor
    """The policy rule or person that rejected it."""
    policy_hash: str | None = None
    """Hash of the policy in force when deciding."""


# --- model exchanges and context -----------------------------------------------------------


class ModelExchangeRecorded(Payload):
    """The planner asked a model and got an answer; recorded before the planner acts on it.

    The record of a goal session: a restarted planner reuses it instead of asking again, and
    a shadow replay answers from it.
    """

    TYPE = "model.exchange.recorded"
    turn: int = Field(ge=1)
    """1 for the session's first model call, then one more per call."""
    purpose: Literal["plan", "replan", "act", "verify", "repair", "summarise", "classify"]
    """Why the model was asked: a first plan, a new plan after a failure or denial, the next
    action, a check of the completion criteria, or a re-ask after an unusable answer (each
    asked of the planning model); a summary of older turns for a compaction (the summarising
    model); or the goal's intent and the tools relevant to it (the classifying model)."""
    provider: str = Field(min_length=1)
    """`openai` (Chat Completions and compatible servers) or `anthropic` (Messages)."""
    request: ModelRequestRecord
    """What was sent."""
    reply: ModelReply
    """What came back."""
    cost_usd: float | None = Field(default=None, ge=0)
    """What the call cost, when a price for the model is configured."""
    duration_ms: float = Field(default=0.0, ge=0)
    """From sending the first attempt to the complete answer."""
    attempts: int = Field(default=1, ge=1)
    """Requests made, counting retries after rate limits and server errors."""
    redacted_by: dict[str, int] = Field(default_factory=dict[str, int])
    """How many values each output-safety rule redacted from the reply (its text and the
    arguments of its calls) before it was recorded, by rule name; never the values."""
    neutralised_by: dict[str, int] = Field(default_factory=dict[str, int])
    """How many places of the reply each injection rule neutralised, by rule name."""
    spotlight_marker: str | None = Field(default=None, pattern=r"^[0-9a-f]{16,64}$")
    """The marker that delimits every tool result in the request (`<<untrusted-data
    MARKER>>` ... `<</untrusted-data MARKER>>`, the system prompt saying the enclosed text
    is data, never instructions). Random, chosen for the session's first turn and read
    back from the log for every later one. None for a classification (its request shows
    no tool result) and in exchanges recorded before spotlighting."""
    spotlight_flagged: tuple[StepId, ...] = ()
    """Steps whose result, new in this request, held the session's marker or a tag of the
    delimiters' form: text trying to end its block early, or a marker that leaked (a
    model led to repeat it in a call). Escaped in the context, so it ends nothing."""
    untrusted_read: tuple[str, ...] = ()
    """Calls whose results, new in this request, are outside content: from untrusted tools
    (`untrusted` on `tool.call.completed`), or from the workspace's own tools once a call
    let use the network (`network` on `tool.call.authorized`) filled it from outside. With
    the earlier turns', every untrusted result the model had in its context when it
    answered, and so what taints the calls it proposed."""


class ContextCompacted(Payload):
    """Older turns of a goal session's conversation were replaced by a summary to stay in budget."""

    TYPE = "context.compacted"
    turn: int = Field(ge=1)
    """The model call whose request is the first to carry the summary."""
    budget_tokens: int = Field(ge=1)
    """The session's context budget."""
    tokens_before: int = Field(ge=0)
    """Estimated size of the request before compaction."""
    tokens_after: int = Field(ge=0)
    """Estimated size after."""
    dropped_messages: int = Field(ge=0)
    """Messages replaced by the summary."""
    kept: tuple[str, ...]
    """The facts and decisions the summary keeps, one per line of the summary."""
    summarised_by: str | None = None
    """The model whose account of the dropped turns the summary carries after the facts
    (the summarising model's `model.exchange.recorded` just before); None when the summary
    is the facts alone."""


class LoopDetected(Payload):
    """The model kept asking for the same call, or the same cycle of calls; the planner stopped."""

    TYPE = "loop.detected"
    calls: tuple[str, ...] = Field(min_length=1)
    """The repeating call or cycle, each as `tool {arguments}`."""
    repeats: int = Field(ge=2)
    """How many times it came in a row."""


# --- approvals ----------------------------------------------------------------------------


class ApprovalRequested(Payload):
    """A person must decide before something runs."""

    TYPE = "approval.requested"
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


PermissionKind = Literal["tool", "network", "path"]
"""What sort of permission a call needs: a tool's required permission, a network host, or a
workspace path."""

GrantScope = Literal["step", "session"]
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


class PermissionRequested(ApprovalRequested):
    """A call needs a permission the session lacks; instead of being denied it waits for a
    person to grant it, for the step or for the session, until a time they choose (or to
    deny it).

    An approval request of a new kind: it waits in the same queue, is decided with the same
    `approval.decision_submitted` (with `grant_scope` and `grant_until`), and ends in the
    same `approval.granted`, `approval.denied` or `approval.expired`. Once granted the call is
    judged again with the permission held, so the policy's rules still decide it (they may
    allow it, send it to approval or deny it).
    """

    TYPE = "permission.requested"
    permissions: tuple[PermissionNeed, ...] = Field(min_length=1)
    """Every permission the call lacks; one grant grants them all."""


class ApprovalDecisionSubmitted(Payload):
    """A person decided on an approval request (an intent, checked by the approval service)."""

    TYPE = "approval.decision_submitted"
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


class ApprovalGranted(Payload):
    """An approval request was granted."""

    TYPE = "approval.granted"
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


class ApprovalDenied(Payload):
    """An approval request was denied by a person."""

    TYPE = "approval.denied"
    request_id: str = Field(min_length=1, max_length=128)
    """The request denied."""
    decided_by: Actor
    """Who denied it."""
    comment: str = ""
    """Why."""


class ApprovalDecisionRefused(Payload):
    """A person's decision changed nothing, and why: there is no such pending request, they
    hold none of the roles that may decide, or the arguments they substituted do not fit the
    tool's schema or the policy in force."""

    TYPE = "approval.decision_refused"
    request_id: str = Field(min_length=1, max_length=128)
    """The request the decision named."""
    decided_by: Actor
    """Who tried to decide."""
    reason: str = Field(min_length=1)
    """Why the decision was refused, for that person."""


class ApprovalVoteCounted(Payload):
    """A grant counted towards a request's quorum; more distinct approvers are needed."""

    TYPE = "approval.vote_counted"
    request_id: str = Field(min_length=1, max_length=128)
    """The request granted."""
    decided_by: Actor
    """Who granted."""
    grants: int = Field(ge=1)
    """Distinct approvers who granted the same thing so far."""
    quorum: int = Field(ge=2)
    """How many are needed."""


class ApprovalExpired(Payload):
    """Nobody decided in time; an expired request counts as a denial."""

    TYPE = "approval.expired"
    request_id: str = Field(min_length=1, max_length=128)
    """The request that expired."""


# --- steps and tool calls -----------------------------------------------------------------


class InverseCall(Contract):
    """A call that undoes an earlier call of a tool with a declared inverse."""

    tool: ToolName
    """The inverse tool."""
    arguments: Arguments = Field(default_factory=dict)
    """Its arguments, taken from the original call's arguments and result."""


class StepScheduled(Payload):
    """The planner wants a step to run now; it becomes a tool call."""

    TYPE = "step.scheduled"
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
    """The approved plan revision whose `authorized_steps` allowed this call: the tool
    gateway runs it on this event, once it has checked that authorisation against the
    call, and the approval service does not judge it. None: the call is judged when
    scheduled (`tool.call.authorized` or another decision follows)."""

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


class StepSkipped(Payload):
    """A step will not run (it was denied and the plan continues, or a dependency failed)."""

    TYPE = "step.skipped"
    step_id: StepId
    """The step."""
    reason: str
    """Why it will not run."""


class StepRetryDeferred(Payload):
    """A step whose call failed is tried again later, not at once: a call now would fail
    without doing anything (the failure said when a retry may succeed, or its MCP server's
    circuit breaker is open)."""

    TYPE = "step.retry_deferred"
    step_id: StepId
    """The step."""
    call_id: str
    """The call that failed."""
    retry_at: datetime
    """When the next attempt is scheduled: when a retry may succeed."""
    reason: str
    """Why it waits."""


class ToolCallAuthorized(Payload):
    """Policy (and a person where needed) allowed a tool call."""

    TYPE = "tool.call.authorized"
    call_id: str = Field(min_length=1, max_length=128)
    """The call."""
    step_id: StepId
    """Its step."""
    tool: ToolName
    """The tool."""
    arguments: Arguments = Field(default_factory=dict)
    """The arguments to run with (modified by an approver, if they did)."""
    risk: Risk
    """The risk the decision was made at."""
    rule: str | None = None
    """The policy rule that allowed it."""
    policy_hash: str | None = None
    """Hash of the policy in force."""
    approval_request_id: str | None = None
    """The approval that allowed it, when a person did."""
    sandbox_profile: str | None = None
    """Sandbox profile granted by policy."""
    network: bool = False
    """Whether the call may use the network."""


class ToolCallDenied(Payload):
    """Policy or a person refused a tool call; it will not run."""

    TYPE = "tool.call.denied"
    call_id: str = Field(min_length=1, max_length=128)
    """The call."""
    step_id: StepId
    """Its step."""
    tool: ToolName
    """The tool."""
    reason: str
    """Why, shown to the planner."""
    rule: str | None = None
    """The policy rule that denied it."""
    policy_hash: str | None = None
    """Hash of the policy in force."""
    approval_request_id: str | None = None
    """The approval that was denied or expired, when a person was asked."""


class ToolCallStarted(Payload):
    """A tool call began executing."""

    TYPE = "tool.call.started"
    call_id: str = Field(min_length=1, max_length=128)
    """The call."""
    step_id: StepId
    """Its step."""
    tool: ToolName
    """The tool."""
    server: str = "builtin"
    """What serves the tool: `builtin` or an MCP server id."""


class ToolCallCompleted(Payload):
    """A tool call returned a result."""

    TYPE = "tool.call.completed"
    call_id: str = Field(min_length=1, max_length=128)
    """The call."""
    step_id: StepId
    """Its step."""
    tool: ToolName
    """The tool."""
    output: JsonValue = None
    """The result, after size caps and redaction."""
    duration_ms: float = Field(default=0.0, ge=0)
    """How long the call took."""
    truncated: bool = False
    """Whether the output was cut to its size cap."""
    redactions: int = Field(default=0, ge=0)
    """How many secrets or sensitive values were redacted from the output."""
    inverse: InverseCall | None = None
    """The call that would undo this one, when the tool declares an inverse: set by the tool
    gateway, which resolves the declared argument pointers against this call's arguments and
    its full result. Rollback calls it; a tool with outside effects and no inverse cannot be
    rolled back."""
    exit_code: int | None = None
    """The command's exit status (128 + N when signal N ended it), for run_command."""
    usage: ResourceUsage | None = None
    """What a sandboxed command used (wall time, CPU time, peak memory), where measured."""
    injection_suspected: bool = False
    """Whether the output held text that tries to instruct a model (role markers, previous
    instructions set aside, text addressed to a model, fake system or important-message
    blocks, commands to send or transfer, hidden control characters); such text arrives
    neutralised. Patterns, not a proof: an attack in plain words can pass unflagged, unless
    the configured classifier (`classifier`) judges it one."""
    neutralised: int = Field(default=0, ge=0)
    """How many instruction-like passages or hidden characters were neutralised."""
    redacted_by: dict[str, int] = Field(default_factory=dict[str, int])
    """How many values each output-safety rule redacted, by rule name (`aws_access_key_id`,
    `github_token`, `credential_assignment`, `card_number`, ..., and `secret:NAME` for a
    registered secret, which reads `[secret:NAME]` in the output); never the values."""
    neutralised_by: dict[str, int] = Field(default_factory=dict[str, int])
    """How many places each injection rule neutralised, by rule name: `instruction`
    (previous instructions set aside, "you are now"), `fake_system_block`,
    `important_message`, `addressed_to_model`, `task_hijack`, `tool_command` (a command to
    call a tool, or to send or transfer to an address the text names), `role_marker`,
    `hidden_characters`; and `classifier` (1) when the configured classifier judged the
    output an injection, which flags it but changes none of its text."""
    raw_output: str | None = None
    """When the output was changed (cut, redacted or neutralised): the name of the object in
    the tool-outputs store that holds it unchanged, for people allowed to see it."""
    attempts: int = Field(default=1, ge=1)
    """How many times the call was sent; each earlier try is a `tool.call.attempt_failed`."""
    cached_from: str | None = Field(default=None, min_length=1, max_length=128)
    """The earlier call of the session whose result this is, when the tool is declared pure
    and was called with the same arguments before: it was not called again."""
    untrusted: bool = False
    """Whether the tool is not declared trusted (an MCP tool, unless its server's
    configuration says `trust: trusted`): its output may be anyone's words, and calls a
    model proposes after reading it carry a taint (`CallTaint`). False in logs written
    before tools declared trust."""
    classifier: ClassifierVerdict | None = None
    """What the injection classifier said of the output, when one is configured: its
    `injection` sets `injection_suspected` as a pattern hit does (rule `classifier`); an
    error or a timeout is recorded and changes nothing else. None without a classifier,
    and in logs written before there was one."""


class ToolCallFailed(Payload):
    """A tool call ended with an error."""

    TYPE = "tool.call.failed"
    call_id: str = Field(min_length=1, max_length=128)
    """The call."""
    step_id: StepId
    """Its step."""
    tool: ToolName
    """The tool."""
    error: ToolError
    """What went wrong and whether retrying can help; its message has passed output safety."""
    redacted_by: dict[str, int] = Field(default_factory=dict[str, int])
    """How many values each output-safety rule redacted from the message, by rule name
    (`aws_access_key_id`, `github_token`, `credential_assignment`, `card_number`, ..., and
    `secret:NAME` for a registered secret); never the values."""
    neutralised_by: dict[str, int] = Field(default_factory=dict[str, int])
    """How many places each injection rule neutralised, by rule name: `instruction`
    (previous instructions set aside, "you are now"), `fake_system_block`,
    `important_message`, `addressed_to_model`, `task_hijack`, `tool_command` (a command to
    call a tool, or to send or transfer to an address the text names), `role_marker`,
    `hidden_characters`."""
    duration_ms: float = Field(default=0.0, ge=0)
    """How long the call took before failing."""
    usage: ResourceUsage | None = None
    """What a sandboxed command used before it failed, where measured."""
    attempts: int = Field(default=1, ge=1)
    """How many times the call was sent (0 sends still count as one attempt)."""
    retry_at: datetime | None = None
    """For a retryable error that knows it (a rate limit refused the call: its window frees
    a slot then, or the server's Retry-After ends then), the earliest time trying again may
    succeed. The planner does not retry before it."""


class ToolCallAttemptFailed(Payload):
    """One try of a call failed with a retryable error; the gateway tries again after a pause."""

    TYPE = "tool.call.attempt_failed"
    call_id: str = Field(min_length=1, max_length=128)
    """The call."""
    step_id: StepId
    """Its step."""
    tool: ToolName
    """The tool."""
    attempt: int = Field(ge=1)
    """Which try failed: 1 for the first."""
    error: ToolError
    """Why it failed."""
    retry_in_s: float = Field(ge=0)
    """The pause before the next try (exponential backoff with full jitter)."""


# --- tool registry (gateway-wide, on the tools stream, not in a session's log) -------------


ServerHealth = Literal["healthy", "degraded", "unresponsive", "dead"]
"""How a federated MCP server is doing, in one word (see `ToolServerStatus.health`)."""


class ToolServerStatus(Contract):
    """How a federated MCP server is doing, as the gateway that publishes the registry sees it."""

    server: str = Field(min_length=1, max_length=64)
    """The server's id, as configured."""
    transport: Literal["stdio", "http"]
    """How the gateway talks to it."""
    available: bool
    """Whether its tools could be listed; an unavailable server is retried in the background."""
    error: str | None = None
    """Why it is unavailable."""
    tools: int = Field(default=0, ge=0)
    """How many tools it contributes."""
    circuit: Literal["closed", "open", "half_open"] = "closed"
    """The state of its circuit breaker."""
    health: ServerHealth = "healthy"
    """In one word: `dead` when not connected; `unresponsive` when connected but its
    heartbeats go unanswered or its breaker is open; `degraded` while calls fail (or a probe
    is under way); else `healthy`."""
    failures: int = Field(default=0, ge=0)
    """Consecutive failures counted against it: calls, and heartbeats unanswered."""


class ToolRegistryPublished(Payload):
    """The tools a gateway can call now: the built-in ones and every federated MCP server's.

    Published at the gateway's start, whenever a server's tool list changes and whenever a
    server becomes available or unavailable. The newest one is the registry.
    """

    TYPE = "tool.registry.published"
    tools: tuple[ToolSpec, ...]
    """Every tool, built-in first; MCP tools are named `<server>__<tool>`."""
    servers: tuple[ToolServerStatus, ...] = ()
    """Every configured MCP server, available or not."""


class ToolCircuitChanged(Payload):
    """A server's circuit breaker changed state (closed → open → half-open → closed)."""

    TYPE = "tool.circuit.changed"
    server: str = Field(min_length=1, max_length=64)
    """The MCP server."""
    state: Literal["closed", "open", "half_open"]
    """The new state: open fails calls at once without reaching the server."""
    previous: Literal["closed", "open", "half_open"]
    """The state before."""
    failures: int = Field(default=0, ge=0)
    """Consecutive failures that led here."""
    reason: str = ""
    """What happened (the last error, or the probe that closed it)."""
    retry_at: datetime | None = None
    """When an open breaker lets a probe through."""


class ToolServerHealthChanged(Payload):
    """A federated MCP server's health moved (see `ToolServerStatus.health`), as one gateway
    process sees it: its stdio process exited, its heartbeats went unanswered, its calls
    began to fail, or it was started anew and answers again.

    Each gateway process runs its own stdio servers and its own connections, so replicas of
    the gateway publish their own changes, each naming itself in `gateway`.
    """

    TYPE = "tool.server.health_changed"
    server: str = Field(min_length=1, max_length=64)
    """The MCP server's id, as configured."""
    transport: Literal["stdio", "http"]
    """How the gateway talks to it: over stdio, the gateway runs its process."""
    health: ServerHealth
    """Its health now."""
    previous: ServerHealth | None = None
    """Its health before; None for the first the gateway process tells after it starts."""
    reason: str = ""
    """Why (the process exited, heartbeats unanswered, the last error); empty when healthy."""
    restarts: int = Field(default=0, ge=0)
    """How many times this gateway process started it anew (a new process over stdio, a new
    connection over HTTP) after it had been up."""
    retry_at: datetime | None = None
    """For a dead server, when the gateway next tries to start it (growing pauses, capped)."""
    gateway: str = Field(min_length=1, max_length=256)
    """The gateway process that saw it: host name and process id."""


# --- sandbox ------------------------------------------------------------------------------


class SandboxExecutionRequested(Payload):
    """The tool gateway hands an authorised built-in call to the sandbox."""

    TYPE = "sandbox.execution.requested"
    call_id: str = Field(min_length=1, max_length=128)
    """The call."""
    step_id: StepId
    """Its step."""
    tool: ToolName
    """The built-in tool."""
    arguments: Arguments = Field(default_factory=dict)
    """Validated arguments."""
    limits: SandboxLimits = Field(default_factory=SandboxLimits)
    """Resource limits for the call."""
    network: bool = False
    """Whether the sandbox gets a network."""
    profile: str | None = None
    """Sandbox profile (backend, image) to use."""


class SandboxLimitExceeded(Payload):
    """A sandboxed call hit a resource limit and was stopped."""

    TYPE = "sandbox.limit_exceeded"
    call_id: str = Field(min_length=1, max_length=128)
    """The call."""
    step_id: StepId
    """Its step."""
    hit: LimitHit
    """Which limit, its value and the command."""
    usage: ResourceUsage = Field(default_factory=ResourceUsage)
    """What the call had used when stopped."""


class SandboxLimitApproached(Payload):
    """A running sandboxed call has used 90 % of a resource limit; it goes on running."""

    TYPE = "sandbox.limit_approached"
    call_id: str = Field(min_length=1, max_length=128)
    """The call."""
    step_id: StepId
    """Its step."""
    limit: LimitHit
    """Which limit, its value and the command."""
    used: float = Field(ge=0)
    """How much of it the call had used when warned, in the limit's unit."""
    usage: ResourceUsage = Field(default_factory=ResourceUsage)
    """What the call had used so far."""


class WorkspaceSnapshotted(Payload):
    """The sandbox stored a snapshot of the session workspace."""

    TYPE = "workspace.snapshotted"
    snapshot_id: str = Field(min_length=1, max_length=128)
    """Names the snapshot in the object store."""
    call_id: str | None = None
    """The call after which it was taken."""
    files: int = Field(default=0, ge=0)
    """Number of files in the workspace."""
    bytes: int = Field(default=0, ge=0)
    """Total size of the workspace."""
    digest: str = ""
    """Digest of the workspace manifest."""
    changes: FileChanges | None = None
    """What the call changed in the workspace (set for a snapshot taken after a call)."""
    irreversible_reason: str | None = None
    """Set when the snapshot's contents could not be stored (above the size cap, or files
    changing while read): the workspace cannot be restored to it, and the step is
    irreversible for that reason."""


class WorkspaceRestored(Payload):
    """The sandbox restored the session workspace to a snapshot."""

    TYPE = "workspace.restored"
    snapshot_id: str = Field(min_length=1, max_length=128)
    """The snapshot restored."""
    compensation_id: str | None = None
    """The compensation this restore carries out, during a rollback."""


class WorkspaceSnapshotsPruned(Payload):
    """Snapshots of older checkpoints are no longer kept: the sandbox deletes them, and the
    workspace cannot return to them. The log keeps every checkpoint and what it says."""

    TYPE = "workspace.snapshots_pruned"
    snapshot_ids: tuple[str, ...] = Field(min_length=1)
    """The snapshots dropped."""
    reason: str = Field(min_length=1)
    """Why (the number of checkpoints whose snapshots a session keeps)."""


# --- checkpoints and rollback -------------------------------------------------------------


class CheckpointCreated(Payload):
    """A point the session can be rolled back to, after a completed step."""

    TYPE = "checkpoint.created"
    checkpoint_id: str = Field(min_length=1, max_length=128)
    """Identifies the checkpoint."""
    step_id: StepId
    """The step just completed."""
    call_id: str | None = None
    """The call that completed it."""
    at_seq: int = Field(ge=1)
    """Stream sequence of the event the checkpoint captures the state at."""
    snapshot_id: str | None = None
    """Workspace snapshot taken at that point, if any."""
    reversible: bool = True
    """Whether everything since the previous checkpoint can be undone."""
    compensation: str | None = None
    """How the step is undone (restore the workspace, an inverse tool), or why it cannot be."""
    tool: ToolName | None = None
    """The tool the step called."""
    effect: ToolEffect | None = None
    """What the call changed: nothing, the workspace, or something outside Helmline."""
    inverse: InverseCall | None = None
    """The call that undoes the step, for a tool with a declared inverse."""
    changes: FileChanges | None = None
    """What the step changed in the workspace, when the sandbox ran it."""


class RollbackRequested(Payload):
    """Someone asked to roll the session back to a checkpoint."""

    TYPE = "rollback.requested"
    rollback_id: str = Field(min_length=1, max_length=128)
    """Identifies this rollback."""
    checkpoint_id: str = Field(min_length=1, max_length=128)
    """The checkpoint to return to."""
    requested_by: Actor
    """Who asked."""
    accept_partial: bool = False
    """Roll back what can be undone even if some steps are irreversible."""
    reason: str = ""
    """Why."""


class RollbackRefused(Payload):
    """A rollback was refused up front; nothing was undone."""

    TYPE = "rollback.refused"
    rollback_id: str = Field(min_length=1, max_length=128)
    """The rollback refused."""
    reason: str
    """Why."""
    blocking_steps: tuple[StepId, ...] = ()
    """Irreversible steps that stand in the way."""


class CompensationScheduled(Payload):
    """One undo action of a rollback is to run."""

    TYPE = "compensation.scheduled"
    rollback_id: str = Field(min_length=1, max_length=128)
    """The rollback it belongs to."""
    compensation_id: str = Field(min_length=1, max_length=128)
    """Identifies this compensation."""
    step_id: StepId
    """The step it undoes."""
    kind: Literal["restore_workspace", "inverse_tool"]
    """Restore a workspace snapshot, or call the tool's declared inverse."""
    snapshot_id: str | None = None
    """The snapshot to restore, for `restore_workspace`."""
    tool: ToolName | None = None
    """The inverse tool, for `inverse_tool`."""
    arguments: Arguments | None = None
    """The inverse tool's arguments."""
    steps: tuple[StepId, ...] = ()
    """Every step it undoes, when more than `step_id`: one workspace restore undoes every
    workspace change after the checkpoint."""


class CompensationCompleted(Payload):
    """An undo action finished."""

    TYPE = "compensation.completed"
    rollback_id: str = Field(min_length=1, max_length=128)
    """The rollback it belongs to."""
    compensation_id: str = Field(min_length=1, max_length=128)
    """The compensation."""
    step_id: StepId
    """The step undone."""
    steps: tuple[StepId, ...] = ()
    """Every step undone, when more than `step_id` (see `compensation.scheduled`)."""


class CompensationFailed(Payload):
    """An undo action failed."""

    TYPE = "compensation.failed"
    rollback_id: str = Field(min_length=1, max_length=128)
    """The rollback it belongs to."""
    compensation_id: str = Field(min_length=1, max_length=128)
    """The compensation."""
    step_id: StepId
    """The step that could not be undone."""
    error: ToolError
    """What went wrong."""


class RollbackCompleted(Payload):
    """The session is back at the checkpoint (plus the record of the rollback)."""

    TYPE = "rollback.completed"
    rollback_id: str = Field(min_length=1, max_length=128)
    """The rollback."""
    checkpoint_id: str = Field(min_length=1, max_length=128)
    """The checkpoint returned to."""
    undone_steps: tuple[StepId, ...] = ()
    """Steps undone, in the order they were undone."""
    not_undone_steps: tuple[StepId, ...] = ()
    """Irreversible steps left as they were, in a partial rollback the requester accepted."""


class RollbackFailed(Payload):
    """A rollback stopped before reaching its checkpoint."""

    TYPE = "rollback.failed"
    rollback_id: str = Field(min_length=1, max_length=128)
    """The rollback."""
    checkpoint_id: str = Field(min_length=1, max_length=128)
    """The checkpoint it aimed for."""
    reason: str
    """Why it stopped."""
    undone_steps: tuple[StepId, ...] = ()
    """Steps that were undone."""
    not_undone_steps: tuple[StepId, ...] = ()
    """Steps that were not."""


# --- operations (stream-wide, on the ops stream, not in a session's log) --------------------


class StreamLimitApproaching(Payload):
    """A stream holds at least the warning share of one of its limits (age or bytes): its
    oldest events will soon be removed. Export what must be kept first (`helmline export`)."""

    TYPE = "stream.limit_approaching"
    stream: str = Field(min_length=1, max_length=64)
    """The JetStream stream, e.g. HELMLINE_EVENTS."""
    limit: Literal["age", "bytes"]
    """Which limit: how long events are kept, or how many bytes the stream may hold."""
    used: float = Field(ge=0)
    """The share of the limit in use: 0.8 is 80 %."""
    limit_value: float = Field(gt=0)
    """The limit: seconds for age, bytes for bytes."""
    current_value: float = Field(ge=0)
    """Where the stream stands: the age of its oldest event in seconds, or its bytes."""
    oldest_at: datetime | None = None
    """When the oldest event still in the stream was stored."""


# --- API keys -----------------------------------------------------------------------------
# Facts about credentials, which belong to no session: they live on the keys stream, where
# every API replica follows them. The secret is never in an event (only its holder has it;
# the key bucket keeps its SHA-256).

ApiKeyId = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{16}$")]
"""The public part of an API key (`hlk_<key id>_<secret>`): it names the key, grants nothing."""


class ApiKeyCreated(Payload):
    """An API key was made for a tenant, with roles, until an expiry."""

    TYPE = "api.key.created"
    key_id: ApiKeyId
    """The key."""
    tenant: TenantId
    """The tenant it acts in."""
    roles: tuple[str, ...] = Field(min_length=1)
    """The API roles it holds."""
    permissions: tuple[str, ...] = ()
    """Tool permissions it holds beside its roles."""
    name: str = Field(default="", max_length=200)
    """Who or what holds it, for the record."""
    expires_at: datetime | None = None
    """When it stops working; None: never."""
    by: Actor
    """Who made it."""


class ApiKeyRotated(Payload):
    """An API key was given a new secret: the old one is refused from now on."""

    TYPE = "api.key.rotated"
    key_id: ApiKeyId
    """The key, which keeps its id, tenant and roles."""
    tenant: TenantId
    """The tenant it acts in."""
    expires_at: datetime | None = None
    """When the new secret stops working; None: never."""
    by: Actor
    """Who rotated it."""


class ApiKeyRevoked(Payload):
    """An API key was revoked: every API replica refuses it from now on, for good."""

    TYPE = "api.key.revoked"
    key_id: ApiKeyId
    """The key."""
    tenant: TenantId
    """The tenant it acted in."""
    reason: str = Field(default="", max_length=2000)
    """Why, in the person's words."""
    by: Actor
    """Who revoked it."""


PAYLOAD_CLASSES: tuple[type[Payload], ...] = (
    SessionStarted,
    SessionPauseRequested,
    SessionPaused,
    SessionResumeRequested,
    SessionResumed,
    SessionCancelRequested,
    SessionCancelled,
    SessionCompleted,
    SessionFailed,
    ThoughtRecorded,
    PlanProposed,
    PlanApproved,
    PlanRejected,
    ModelExchangeRecorded,
    ContextCompacted,
    LoopDetected,
    ApprovalRequested,
    PermissionRequested,
    ApprovalDecisionSubmitted,
    ApprovalGranted,
    ApprovalDenied,
    ApprovalDecisionRefused,
    ApprovalVoteCounted,
    ApprovalExpired,
    StepScheduled,
    StepSkipped,
    StepRetryDeferred,
    ToolCallAuthorized,
    ToolCallDenied,
    ToolCallStarted,
    ToolCallCompleted,
    ToolCallFailed,
    ToolCallAttemptFailed,
    ToolRegistryPublished,
    ToolCircuitChanged,
    ToolServerHealthChanged,
    SandboxExecutionRequested,
    SandboxLimitApproached,
    SandboxLimitExceeded,
    WorkspaceSnapshotted,
    WorkspaceRestored,
    WorkspaceSnapshotsPruned,
    CheckpointCreated,
    RollbackRequested,
    RollbackRefused,
    CompensationScheduled,
    CompensationCompleted,
    CompensationFailed,
    RollbackCompleted,
    RollbackFailed,
    StreamLimitApproaching,
    ApiKeyCreated,
    ApiKeyRotated,
    ApiKeyRevoked,
)
"""Every payload of the catalogue, in declaration order."""
