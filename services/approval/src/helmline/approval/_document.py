"""What a policy file may say: the pydantic model every policy document is validated against.

A policy is an ordered list of rules. A rule matches a tool call when every condition it
states holds (a condition left out matches anything); the first rule that matches decides.
"""

from __future__ import annotations

import re
from datetime import time, timedelta
from typing import Annotated, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from helmline.contracts import (
    ArgumentCondition,
    Patterns,
    Risk,
    TaintKind,
    ToolAction,
    ToolEffect,
    one_or_many,
)

DEFAULT_APPROVAL_EXPIRY = timedelta(minutes=10)
DEFAULT_APPROVER_ROLES = ("approver", "admin")

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> timedelta:
    """A duration as people write it, in a policy or on the command line: 90s, 10m, 2h, 1d."""
    match = _DURATION.match(text)
    if match is None:
        raise ValueError(f"{text!r} is not a duration such as 30s, 10m, 2h or 1d")
    return timedelta(seconds=float(match[1]) * _UNIT_SECONDS[match[2]])


def _duration(value: object) -> object:
    # A bare number is seconds, as pydantic reads it.
    return parse_duration(value) if isinstance(value, str) else value


Duration = Annotated[timedelta, BeforeValidator(_duration)]
Names = Patterns
Risks = Annotated[tuple[Risk, ...], BeforeValidator(one_or_many), Field(min_length=1)]
Actions = Annotated[tuple[ToolAction, ...], BeforeValidator(one_or_many), Field(min_length=1)]
ToolEffects = Annotated[tuple[ToolEffect, ...], BeforeValidator(one_or_many), Field(min_length=1)]
TaintKinds = Annotated[tuple[TaintKind, ...], BeforeValidator(one_or_many), Field(min_length=1)]
Effect = Literal["allow", "deny", "require_approval"]
MAX_COUNTED_SPAN = timedelta(days=30)
"""The longest span an `at_most` condition counts calls in: how far back the approval service
reads a session's authorisations."""


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


WEEKDAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_HOURS = re.compile(r"^\s*(\d{1,2}):(\d{2})\s*-\s*(\d{1,2}):(\d{2})\s*$")


def _weekdays(value: object) -> object:
    # `days: mon-fri`, `days: [mon-wed, sat]`: a range runs forward and may wrap (fri-mon).
    names = one_or_many(value)
    if not isinstance(names, list | tuple):
        return value
    days: list[str] = []
    for name in names:
        if not isinstance(name, str):
            raise ValueError(f"{name!r} is not a day such as mon or a range such as mon-fri")
        first, _, last = name.strip().lower().partition("-")
        for day in (first, last or first):
            if day not in WEEKDAYS:
                raise ValueError(f"{day!r} is not a day: use {', '.join(WEEKDAYS)}")
        start, end = WEEKDAYS.index(first), WEEKDAYS.index(last or first)
        days += [WEEKDAYS[(start + offset) % 7] for offset in range((end - start) % 7 + 1)]
    return tuple(dict.fromkeys(days))


def _hours_and_minutes(hours: str) -> tuple[int, int, int, int] | None:
    """`HH:MM-HH:MM` as its four numbers, or None when it is not written so."""
    match = _HOURS.match(hours)
    if match is None:
        return None
    start_h, start_m, end_h, end_m = (int(part) for part in match.groups())
    return start_h, start_m, end_h, end_m


class TimeWindow(_Strict):
    """When a rule applies: on some days of the week, between two times of day, in a time
    zone. A window whose end is not after its start runs past midnight into the next day."""

    days: Annotated[tuple[str, ...], BeforeValidator(_weekdays), Field(min_length=1)] = WEEKDAYS
    """Days the window opens on: `mon` ... `sun`, or ranges such as `mon-fri`."""
    hours: str = "00:00-24:00"
    """`HH:MM-HH:MM`, from (inclusive) to (exclusive); `24:00` is the end of the day."""
    timezone: str = "UTC"
    """IANA time zone the days and hours are read in, such as `Europe/Berlin`."""

    @field_validator("hours", mode="before")
    @classmethod
    def _reads_as_hours(cls, hours: object) -> str:
        if not isinstance(hours, str):
            # YAML reads an unquoted 10:30 as the number 630 (minutes in base 60).
            raise ValueError("hours are a span such as 09:00-17:30, from and to")
        parts = _hours_and_minutes(hours)
        if parts is None:
            raise ValueError(f"{hours!r} is not a span of hours such as 09:00-17:30")
        start_h, start_m, end_h, end_m = parts
        if start_h > 23 or start_m > 59 or end_m > 59 or end_h > 24 or (end_h == 24 and end_m):
            raise ValueError(f"{hours!r} names a time of day that does not exist")
        if (start_h, start_m) == (end_h, end_m):
            raise ValueError(f"{hours!r} is empty: a whole day is 00:00-24:00")
        return hours

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, timezone: str) -> str:
        try:
            ZoneInfo(timezone)
        except (ZoneInfoNotFoundError, ValueError) as error:
            raise ValueError(
                f"unknown time zone {timezone!r} (use a name such as UTC or Europe/Berlin)"
            ) from error
        return timezone

    def span(self) -> tuple[time, time | None]:
        """The hours as times of day; an end of `24:00` is None (the end of the day)."""
        parts = _hours_and_minutes(self.hours)
        assert parts is not None  # Checked when read.
        start_h, start_m, end_h, end_m = parts
        return time(start_h, start_m), None if end_h == 24 else time(end_h, end_m)


class CallsWithin(_Strict):
    """How many calls a rule lets run in one session within a sliding time span."""

    calls: int = Field(ge=1, le=10_000)
    """At most this many calls of the session run under the rule within `per`."""
    per: Duration
    """The span, such as 10m or 1h; the oldest call counted drops out once it is older."""

    @field_validator("per")
    @classmethod
    def _a_span_to_count_in(cls, per: timedelta) -> timedelta:
        if not timedelta(0) < per <= MAX_COUNTED_SPAN:
            raise ValueError("per must be longer than zero and at most 30 days")
        return per


class ApprovalTerms(_Strict):
    """Who must approve, how many of them, and for how long the request waits."""

    roles: Names = DEFAULT_APPROVER_ROLES
    """Roles whose holders may decide (any one of them)."""
    quorum: int = Field(default=1, ge=1, le=20)
    """How many distinct people holding one of the roles must grant."""
    expires_in: Duration = DEFAULT_APPROVAL_EXPIRY
    """How long the request waits before it becomes a denial."""

    escalate_after: Duration | None = None
    """If nobody decided by then, the request is asked again of the `escalate_to` roles."""
    escalate_to: Names | None = None
    """Roles that may decide once the request is escalated (instead of `roles`)."""

    @field_validator("expires_in", "escalate_after")
    @classmethod
    def _positive(cls, duration: timedelta | None) -> timedelta | None:
        if duration is not None and duration <= timedelta(0):
            raise ValueError("a duration must be longer than zero")
        return duration

    @model_validator(mode="after")
    def _escalation_is_complete(self) -> ApprovalTerms:
        if (self.escalate_after is None) != (self.escalate_to is None):
            raise ValueError("escalate_after and escalate_to go together")
        if self.escalate_after is not None and self.escalate_after >= self.expires_in:
            raise ValueError("escalate_after must come before expires_in")
        return self


DEFAULT_GRANT_EXPIRY = timedelta(hours=1)
DEFAULT_GRANT_LIMIT = timedelta(days=1)


class PermissionTerms(_Strict):
    """Who may grant a permission a call lacks, and for how long, when calls ask for it
    (`permission.requested`) instead of being denied."""

    roles: Names = DEFAULT_APPROVER_ROLES
    """Roles whose holders may grant or deny (any one of them)."""
    quorum: int = Field(default=1, ge=1, le=20)
    """How many distinct people holding one of the roles must grant."""
    expires_in: Duration = DEFAULT_APPROVAL_EXPIRY
    """How long a request waits before it becomes a denial of the call."""
    grant_expires_in: Duration = DEFAULT_GRANT_EXPIRY
    """How long a grant holds when the person granting gives no end."""
    grant_at_most: Duration = DEFAULT_GRANT_LIMIT
    """The longest a grant may hold: a person cannot grant for longer."""

    @field_validator("expires_in", "grant_expires_in", "grant_at_most")
    @classmethod
    def _positive(cls, duration: timedelta) -> timedelta:
        if duration <= timedelta(0):
            raise ValueError("a duration must be longer than zero")
        return duration

    @model_validator(mode="after")
    def _default_within_limit(self) -> PermissionTerms:
        if self.grant_expires_in > self.grant_at_most:
            raise ValueError("grant_expires_in must not be longer than grant_at_most")
        return self


UNKNOWN_TOOL_RULE = "unknown-tool"
"""The rule named by the refusal of a call of a tool nobody describes."""
MISSING_PERMISSION_RULE = "required-permission"
"""The rule named by the refusal of a call whose requester lacks the tool's permission."""
NO_RULE_MATCHED = "no-rule-matched"
"""The rule named by a decision no rule of the policy made."""
PLAN_APPROVAL_RULE = "plan-approval"
"""The rule named by the calls of a plan approved as a whole."""
STEERED_REPLAN_RULE = "replan-after-suspected-injection"
"""The rule named by the request that a revised plan waits on when, after the model read
content flagged as a suspected injection, it adds steps that change something."""
RESERVED_RULE_NAMES = frozenset(
    (
        UNKNOWN_TOOL_RULE,
        MISSING_PERMISSION_RULE,
        NO_RULE_MATCHED,
        PLAN_APPROVAL_RULE,
        STEERED_REPLAN_RULE,
    )
)
"""Names decisions give when no rule of the policy decided: a rule of that name would make
them ambiguous in the log and in `helmline policy explain`."""


class RuleDocument(_Strict):
    """One rule: conditions on the call, and the effect when they all hold."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")
    """Unique within the policy; recorded in every decision the rule makes."""
    description: str = ""
    """Why the rule exists, for the people who read the policy."""
    tenant: Patterns | None = None
    """Globs of tenants the rule applies to."""
    user: Patterns | None = None
    """Globs of the ids of people whose sessions the rule applies to (the session's requester)."""
    role: Names | None = None
    """Roles of the session's requester; the rule applies if they hold any of them."""
    tool: Patterns | None = None
    """Globs of tool names."""
    server: Patterns | None = None
    """Globs of the server a tool lives on (`builtin` for the built-in tools)."""
    permission: Patterns | None = None
    """Globs of the permission the tool requires (its `required_permission` in the MCP
    servers file); a tool that requires none does not match. Only calls whose requester
    holds that permission reach the rules at all."""
    risk: Risks | None = None
    """Risk levels of the call (the tool's own risk, raised by the plan if it says so)."""
    action: Actions | None = None
    """Kinds of action of the tool (read, write, execute, delete), as the tool or its
    server's configuration declares it; a tool that declares none does not match."""
    tool_effect: ToolEffects | None = None
    """What the tool's calls change, as it declares it (`none`, `workspace`, `external`:
    an MCP tool changes something outside unless its configuration says otherwise)."""
    taint: TaintKinds | None = None
    """Facts of taint the call carries, any of which makes the rule apply:
    `influenced_by_untrusted` (the model had read an untrusted tool's result when it proposed
    the call), `after_injection_suspected` (it had read a result flagged as a suspected
    injection), `arguments_from_untrusted` (an argument repeats text of untrusted output that
    neither the goal nor a person wrote), `destinations_from_untrusted` (such an argument
    says where the call sends or reaches: an e-mail address, a URL, a recipient). A
    playbook's calls carry none."""
    arguments: dict[str, ArgumentCondition] = Field(default_factory=dict)
    """Conditions on arguments by name; a call without the argument does not match."""
    during: TimeWindow | None = None
    """When the rule applies, judged at the time the call is judged (when it is scheduled,
    or when a person decides on it)."""
    at_most: CallsWithin | None = None
    """A rate limit: the rule applies only while fewer than `calls` calls of the session
    were authorised under it within the last `per`; further calls fall to the rules below
    (ask a person, say, or deny) until the oldest counted call is older than `per`."""
    effect: Effect
    """What happens to a matching call."""
    reason: str | None = None
    """Why, in words: shown to the planner on deny, to approvers on require_approval."""
    approval: ApprovalTerms | None = None
    """Who approves, for require_approval (the policy's `approval` defaults otherwise)."""
    sandbox_profile: str | None = None
    """Sandbox profile the call runs under, when it runs."""
    network: bool = False
    """Whether the call may use the network, when it runs (any host: see `hosts` to grant
    only some)."""
    hosts: Patterns | None = None
    """Globs of the network hosts a matching call may reach (`api.example.com`,
    `*.internal`): a call whose step declares only such hosts runs with a network; one that
    declares others asks for them (see `permission_requests`) or is denied."""
    paths: Patterns | None = None
    """Globs of the workspace paths a matching call's `path` argument may name (`src/**`):
    a call naming another path asks for it (see `permission_requests`) or is denied. Unset:
    any path (unlike `arguments: {path: ...}`, which makes other calls fall to later rules)."""

    @field_validator("permission")
    @classmethod
    def _names_a_permission(cls, patterns: tuple[str, ...] | None) -> tuple[str, ...] | None:
        # A blank glob matches no permission: the rule would never apply, silently.
        if patterns is not None and any(not pattern.strip() for pattern in patterns):
            raise ValueError("a permission glob must not be blank")
        return patterns

    @model_validator(mode="after")
    def _fits_its_effect(self) -> RuleDocument:
        if self.approval is not None and self.effect != "require_approval":
            raise ValueError(f"`approval` only applies to require_approval, not {self.effect}")
        if self.effect == "deny" and (
            self.sandbox_profile is not None
            or self.network
            or self.hosts is not None
            or self.paths is not None
        ):
            raise ValueError(
                "a deny rule grants nothing: drop sandbox_profile, network, hosts and paths"
            )
        if self.effect == "deny" and self.at_most is not None:
            raise ValueError("a deny rule lets no call run, so at_most would count none: drop it")
        return self

    @field_validator("name")
    @classmethod
    def _not_reserved(cls, name: str) -> str:
        if name in RESERVED_RULE_NAMES:
            raise ValueError(f"rule name {name!r} is reserved for decisions no rule makes")
        return name


class WebhookDocument(_Strict):
    """Where to announce new approval requests of some tenants (chat, paging tools)."""

    tenant: Patterns = ("*",)
    """Globs of the tenants whose requests are announced."""
    url: str = Field(pattern=r"^https?://\S+$")
    """Receives a POST of the `approval.requested` CloudEvent (JSON) for each request."""
    secret: str = Field(min_length=1)
    """Name of the signing secret in HELMLINE_WEBHOOK_SECRETS (never the secret itself)."""


class PolicyDocument(_Strict):
    """A policy file: ordered rules, first match wins; anything unmatched is denied."""

    version: Literal[1] = 1
    """Version of the policy file format."""
    description: str = ""
    """What the policy is for."""
    approval: ApprovalTerms = Field(default_factory=ApprovalTerms)
    """Default approval terms of require_approval rules that state none."""
    rules: tuple[RuleDocument, ...] = ()
    """The rules, in the order they are tried."""
    webhooks: tuple[WebhookDocument, ...] = ()
    """Webhooks told about every new approval request of their tenants."""
    permission_requests: PermissionTerms | None = None
    """When set, a call that lacks a permission (its tool's required permission, which the
    requester does not hold; a network host its rule does not grant) asks people for it
    (`permission.requested`) instead of being denied, if the rules would let it run (or ask
    about it) with the permission held; a path its rule's `paths` do not grant likewise.
    Unset: such calls are denied."""
    plan_approval: ApprovalTerms | None = None
    """When set, a plan with steps that would need approval is approved once, as a whole,
    with those steps listed; its calls then run without asking again (unless their arguments
    differ from the plan's). Unset: plans are approved and each risky step is asked about."""

    @model_validator(mode="after")
    def _names_are_unique(self) -> PolicyDocument:
        seen: set[str] = set()
        for rule in self.rules:
            if rule.name in seen:
                raise ValueError(f"rule name {rule.name!r} is used twice")
            seen.add(rule.name)
        return self
