"""The planner's work: its thoughts, its plans and their approval, its exchanges with models."""

from __future__ import annotations

import hashlib
import json
from functools import cached_property
from typing import Any, Literal, Self

from pydantic import Field, model_validator

from helmline.contracts._exchanges import (
    ModelMessage,
    ModelReply,
    ModelRequestRecord,
    ModelToolCall,
    ModelUsage,
)
from helmline.contracts._payload import Payload
from helmline.contracts._plans import PlanStep
from helmline.contracts._services import APPROVAL, PLANNER
from helmline.contracts._values import Actor, Arguments, Contract, Risk, StepId
from helmline.contracts.events._samples import COUNT, POLICY, WRITE


class Alternative(Contract):
    """An option the planner considered and set aside."""

    option: str
    """What it could have done."""
    reason: str = ""
    """Why it did not."""


class ThoughtRecorded(Payload, type="thought.recorded", version=2, published_by=(PLANNER,)):
    """The planner's reasoning, streamed for people to follow.

    Version 2: each alternative carries why it was set aside (version 1 had bare strings).
    """

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

    @staticmethod
    def upcast_v1_v2(data: dict[str, Any]) -> dict[str, Any]:
        """Bare alternative strings become options without a reason."""
        alternatives = data.get("alternatives") or []
        return {
            **data,
            "alternatives": [{"option": option, "reason": ""} for option in alternatives],
        }

    @classmethod
    def example(cls) -> Self:
        return cls(
            kind="decision",
            text="Count the bytes with wc",
            confidence=0.9,
            alternatives=(
                Alternative(
                    option="read the file and count in Python", reason="wc is simpler and auditable"
                ),
            ),
        )


class PlanProposed(Payload, type="plan.proposed", published_by=(PLANNER,)):
    """The planner proposed a plan (or a new revision of it after a replan)."""

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

    @classmethod
    def example(cls) -> Self:
        return cls(
            revision=1,
            steps=(WRITE, COUNT),
            reasoning="declared playbook",
            confidence=1.0,
            permissions=("run_command", "write_file"),
        )


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


class PlanApproved(Payload, type="plan.approved", published_by=(APPROVAL,)):
    """A plan revision may be executed, by policy or by a person."""

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

    @classmethod
    def example(cls) -> Self:
        return cls(
            revision=1,
            approved_by=POLICY,
            policy_hash="sha256:9f2c",
            authorized_steps=(
                StepAuthorization(
                    step_id="write",
                    call_digest=call_digest(WRITE.tool, WRITE.arguments),
                    risk="medium",
                    rule="workspace-writes",
                ),
            ),
        )


class PlanRejected(Payload, type="plan.rejected", published_by=(APPROVAL,)):
    """A plan revision may not be executed."""

    revision: int = Field(ge=1)
    """The rejected revision."""
    reason: str
    """Why, shown to the planner."""
    rejected_by: Actor
    """The policy rule or person that rejected it."""
    policy_hash: str | None = None
    """Hash of the policy in force when deciding."""

    @classmethod
    def example(cls) -> Self:
        return cls(revision=1, reason="plans touching production need a person", rejected_by=POLICY)


class ModelExchangeRecorded(Payload, type="model.exchange.recorded", published_by=(PLANNER,)):
    """The planner asked a model and got an answer; recorded before the planner acts on it.

    The record of a goal session: a restarted planner reuses it instead of asking again, and
    a shadow replay answers from it.
    """

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

    @classmethod
    def example(cls) -> Self:
        return cls(
            turn=1,
            purpose="plan",
            provider="openai",
            request=ModelRequestRecord(
                model="gpt-4o-mini",
                system="You are Helmline's planner.",
                messages=(
                    ModelMessage(role="user", content="Goal: write a note and count its bytes"),
                ),
                tools=("create_plan", "write_file", "run_command"),
            ),
            reply=ModelReply(
                content="Two steps: write, then count.",
                tool_calls=(
                    ModelToolCall(
                        id="call_1",
                        name="create_plan",
                        arguments='{"steps": [], "reasoning": "..."}',
                    ),
                ),
                stop_reason="tool_calls",
                usage=ModelUsage(input_tokens=812, output_tokens=95),
            ),
            cost_usd=0.000179,
            duration_ms=640.0,
        )


class ContextCompacted(Payload, type="context.compacted", published_by=(PLANNER,)):
    """Older turns of a goal session's conversation were replaced by a summary to stay in budget."""

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

    @classmethod
    def example(cls) -> Self:
        return cls(
            turn=12,
            budget_tokens=8000,
            tokens_before=7100,
            tokens_after=2300,
            dropped_messages=18,
            kept=("step read (read_file): succeeded", "plan revision 2: write then count"),
        )


class LoopDetected(Payload, type="loop.detected", published_by=(PLANNER,)):
    """The model kept asking for the same call, or the same cycle of calls; the planner stopped."""

    calls: tuple[str, ...] = Field(min_length=1)
    """The repeating call or cycle, each as `tool {arguments}`."""
    repeats: int = Field(ge=2)
    """How many times it came in a row."""

    @classmethod
    def example(cls) -> Self:
        return cls(calls=('read_file {"path": "notes.txt"}',), repeats=3)
