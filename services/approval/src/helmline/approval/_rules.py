"""A policy compiled for evaluation: what a tool call is, and which rule decides it. Pure.

Globs and regular expressions are compiled once, when the policy is loaded. The conditions
that depend only on tenant, tool and server are evaluated once per combination and the
surviving rules remembered, so a call is checked only against rules that could apply to it.
"""

from __future__ import annotations

import fnmatch
import itertools
import posixpath
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, time, timedelta
from types import MappingProxyType
from typing import Protocol
from zoneinfo import ZoneInfo

from cachetools import LRUCache
from pydantic import JsonValue

from helmline.approval._document import (
    MISSING_PERMISSION_RULE,
    NO_RULE_MATCHED,
    UNKNOWN_TOOL_RULE,
    WEEKDAYS,
    ApprovalTerms,
    CallsWithin,
    Effect,
    PolicyDocument,
    RuleDocument,
    TimeWindow,
)
from helmline.contracts import (
    BUILTIN_TOOLS_BY_NAME,
    Actor,
    ArgumentCondition,
    CallTaint,
    PermissionKey,
    PermissionKind,
    PermissionNeed,
    Risk,
    TaintKind,
    ToolAction,
    ToolEffect,
    ToolSpec,
)

RISK_ORDER: tuple[Risk, ...] = ("low", "medium", "high", "critical")
_CANDIDATE_CACHE_LIMIT = 4096
_SCREENED_BLOCK_MIN = 4
"""Fewer consecutive rules than this are cheaper to test one by one than to screen."""
NO_USES: Mapping[str, Sequence[datetime]] = MappingProxyType({})
"""No call of the session ran under any rule yet."""
PATH_ARGUMENT = "path"
"""The argument a rule's `paths` judge (the built-in file tools' argument)."""
_UNJOINABLE = re.compile(r"\\[1-9]|\(\?P=|\(\?\(|^\(\?[aiLmsux]+\)")
"""Backreferences and global flags change meaning (or fail) inside a joined pattern."""


@dataclass(frozen=True, slots=True)
class CallFacts:
    """What the policy knows about a tool call when it decides."""

    tenant: str
    tool: str
    server: str
    risk: Risk
    arguments: Mapping[str, JsonValue]
    requester: Actor | None
    """Who started the session, with their roles; None when unknown."""
    at: datetime
    """When the call is judged (time windows are read at this moment)."""
    permission: str | None
    """The permission the tool requires (its `required_permission`); None when it asks for
    none."""
    action: ToolAction | None
    """What kind of thing the tool does, as declared; None when nobody said."""
    rule_uses: Mapping[str, Sequence[datetime]]
    """When the session's earlier calls were authorised, oldest first, by the rule that
    let them run (`uses_by_rule`): what `at_most` conditions count. Only the span the policy's
    longest `at_most` counts in need be given."""
    hosts: tuple[str, ...] = ()
    """Network hosts the call's step declares it reaches."""
    granted: frozenset[PermissionKey] = frozenset()
    """Permissions people granted the session on request that hold for this call (see
    `SessionState.granted_permissions`): held as if the requester held them."""
    tool_effect: ToolEffect = "external"
    """What the tool's calls change, as declared."""
    taint: CallTaint | None = None
    """What untrusted content the model had read when it proposed the call; None when none
    (or no model proposed it)."""


@dataclass(frozen=True, slots=True)
class Approval:
    """Who must approve a call, how many, and how long the request waits."""

    roles: tuple[str, ...]
    quorum: int
    expires_in: timedelta
    escalate_after: timedelta | None = None
    escalate_to: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the policy decided about a call, and which rule decided it."""

    effect: Effect
    rule: str
    reason: str
    risk: Risk
    approval: Approval | None = None
    sandbox_profile: str | None = None
    network: bool = False
    missing: tuple[PermissionNeed, ...] = ()
    """Permissions the call lacks, which people may grant on request: the verdict is what
    the rules decide once they are held (never a denial)."""


@dataclass(frozen=True, slots=True)
class RuleCheck:
    """One rule tried against a call: the condition that failed, or None if it matched."""

    rule: str
    failed: str | None
    held: tuple[str, ...]


class _Condition(Protocol):
    def holds(self, facts: CallFacts) -> bool: ...

    def describe(self) -> str: ...


def _glob_regex(patterns: tuple[str, ...]) -> re.Pattern[str]:
    return re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in patterns))


def _path_glob_regex(patterns: tuple[str, ...]) -> re.Pattern[str]:
    # fnmatch lets `*` cross folders; a path rule such as `src/*` must not reach `src/a/b`.
    def translate(glob: str) -> str:
        out, i = [], 0
        while i < len(glob):
            if glob.startswith("**/", i):
                out.append("(?:.*/)?")
                i += 3
            elif glob.startswith("**", i):
                out.append(".*")
                i += 2
            else:
                char = glob[i]
                out.append("[^/]*" if char == "*" else "[^/]" if char == "?" else re.escape(char))
                i += 1
        return "".join(out)

    return re.compile("(?:" + "|".join(translate(p) for p in patterns) + r")\Z")


def _quoted(patterns: tuple[str, ...]) -> str:
    return " or ".join(repr(p) for p in patterns)


@dataclass(frozen=True, slots=True)
class _TenantIs:
    patterns: tuple[str, ...]
    regex: re.Pattern[str]

    def holds(self, facts: CallFacts) -> bool:
        return self.regex.match(facts.tenant) is not None

    def describe(self) -> str:
        return f"tenant matches {_quoted(self.patterns)}"


@dataclass(frozen=True, slots=True)
class _ToolIs:
    patterns: tuple[str, ...]
    regex: re.Pattern[str]

    def holds(self, facts: CallFacts) -> bool:
        return self.regex.match(facts.tool) is not None

    def describe(self) -> str:
        return f"tool matches {_quoted(self.patterns)}"


@dataclass(frozen=True, slots=True)
class _ServerIs:
    patterns: tuple[str, ...]
    regex: re.Pattern[str]

    def holds(self, facts: CallFacts) -> bool:
        return self.regex.match(facts.server) is not None

    def describe(self) -> str:
        return f"server matches {_quoted(self.patterns)}"


@dataclass(frozen=True, slots=True)
class _UserIs:
    patterns: tuple[str, ...]
    regex: re.Pattern[str]

    def holds(self, facts: CallFacts) -> bool:
        return facts.requester is not None and self.regex.match(facts.requester.id) is not None

    def describe(self) -> str:
        return f"requester matches {_quoted(self.patterns)}"


@dataclass(frozen=True, slots=True)
class _RoleIs:
    roles: frozenset[str]

    def holds(self, facts: CallFacts) -> bool:
        return facts.requester is not None and not self.roles.isdisjoint(facts.requester.roles)

    def describe(self) -> str:
        return f"requester holds a role of {sorted(self.roles)}"


@dataclass(frozen=True, slots=True)
class _PermissionIs:
    patterns: tuple[str, ...]
    regex: re.Pattern[str]

    def holds(self, facts: CallFacts) -> bool:
        return facts.permission is not None and self.regex.match(facts.permission) is not None

    def describe(self) -> str:
        return f"the tool requires a permission matching {_quoted(self.patterns)}"


@dataclass(frozen=True, slots=True)
class _ActionIs:
    actions: frozenset[str]

    def holds(self, facts: CallFacts) -> bool:
        return facts.action is not None and facts.action in self.actions

    def describe(self) -> str:
        return f"the tool's action is {' or '.join(sorted(self.actions))}"


@dataclass(frozen=True, slots=True)
class _ToolEffectIs:
    effects: frozenset[str]

    def holds(self, facts: CallFacts) -> bool:
        return facts.tool_effect in self.effects

    def describe(self) -> str:
        return f"the tool's effect is {' or '.join(sorted(self.effects))}"


_TAINT_SAID: Mapping[TaintKind, str] = {
    "influenced_by_untrusted": "the model had read untrusted output",
    "after_injection_suspected": "the model had read a result flagged as a suspected injection",
    "arguments_from_untrusted": "arguments come from untrusted output",
    "destinations_from_untrusted": "where the call sends or reaches comes from untrusted output",
}


@dataclass(frozen=True, slots=True)
class _Tainted:
    kinds: tuple[TaintKind, ...]

    def holds(self, facts: CallFacts) -> bool:
        taint = facts.taint
        return taint is not None and any(taint.holds(kind) for kind in self.kinds)

    def describe(self) -> str:
        return " or ".join(_TAINT_SAID[kind] for kind in self.kinds)


@dataclass(frozen=True, slots=True)
class _RiskIs:
    risks: frozenset[str]

    def holds(self, facts: CallFacts) -> bool:
        return facts.risk in self.risks

    def describe(self) -> str:
        return f"risk is {' or '.join(r for r in RISK_ORDER if r in self.risks)}"


@dataclass(frozen=True, slots=True)
class _ArgumentMatchesPath:
    name: str
    patterns: tuple[str, ...]
    regex: re.Pattern[str]

    def holds(self, facts: CallFacts) -> bool:
        return self.meets(facts.arguments)

    def meets(self, arguments: Mapping[str, JsonValue]) -> bool:
        value = arguments.get(self.name)
        # Normalised, so that `src/../etc/passwd` is judged as the `etc/passwd` it reaches.
        return isinstance(value, str) and self.regex.match(posixpath.normpath(value)) is not None

    def describe(self) -> str:
        return f"argument {self.name} matches path {_quoted(self.patterns)}"


@dataclass(frozen=True, slots=True)
class _ArgumentContains:
    name: str
    regex: re.Pattern[str]

    def holds(self, facts: CallFacts) -> bool:
        return self.meets(facts.arguments)

    def meets(self, arguments: Mapping[str, JsonValue]) -> bool:
        value = arguments.get(self.name)
        return isinstance(value, str) and self.regex.search(value) is not None

    def describe(self) -> str:
        return f"argument {self.name} matches regex {self.regex.pattern!r}"


@dataclass(frozen=True, slots=True)
class _ArgumentWithin:
    name: str
    low: float | None
    high: float | None

    def holds(self, facts: CallFacts) -> bool:
        return self.meets(facts.arguments)

    def meets(self, arguments: Mapping[str, JsonValue]) -> bool:
        value = arguments.get(self.name)
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False
        return (self.low is None or value >= self.low) and (self.high is None or value <= self.high)

    def describe(self) -> str:
        bounds = [f">= {self.low:g}"] if self.low is not None else []
        bounds += [f"<= {self.high:g}"] if self.high is not None else []
        return f"argument {self.name} is a number {' and '.join(bounds)}"


@dataclass(frozen=True, slots=True)
class _During:
    window: TimeWindow
    zone: ZoneInfo
    days: frozenset[int]
    """Days the window opens on, as `datetime.weekday()` numbers."""
    start: time
    end: time | None
    """None: the end of the day."""

    @staticmethod
    def of(window: TimeWindow) -> _During:
        start, end = window.span()
        days = frozenset(WEEKDAYS.index(day) for day in window.days)
        return _During(window, ZoneInfo(window.timezone), days, start, end)

    def holds(self, facts: CallFacts) -> bool:
        local = facts.at.astimezone(self.zone)
        moment, day = local.time(), local.weekday()
        if self.end is None or self.start < self.end:
            return (
                day in self.days
                and self.start <= moment
                and (self.end is None or moment < self.end)
            )
        # Past midnight: the evening of a listed day, or the morning after one.
        return (day in self.days and moment >= self.start) or (
            (day - 1) % 7 in self.days and moment < self.end
        )

    def describe(self) -> str:
        days = ", ".join(self.window.days) if len(self.days) < 7 else "any day"
        return f"within {self.window.hours} {self.window.timezone} on {days}"


@dataclass(frozen=True, slots=True)
class _FewerCallsThan:
    rule: str
    limit: CallsWithin

    def holds(self, facts: CallFacts) -> bool:
        since = facts.at - self.limit.per
        for counted, authorised_at in enumerate(
            reversed(facts.rule_uses.get(self.rule, ())), start=1
        ):
            if authorised_at <= since:
                return True
            if counted >= self.limit.calls:
                return False
        return True

    def describe(self) -> str:
        return (
            f"fewer than {self.limit.calls} calls of the session ran under this rule in the "
            f"last {spoken(self.limit.per)}"
        )


def spoken(span: timedelta) -> str:
    """A span as a policy writes it: 90s, 10m, 2h, 1d."""
    seconds = span.total_seconds()
    for unit, length in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= length and seconds % length == 0:
            return f"{seconds // length:g}{unit}"
    return f"{seconds:g}s"


@dataclass(frozen=True, slots=True)
class _Rule:
    name: str
    verdict_template: RuleDocument
    approval: Approval | None
    hosts: re.Pattern[str] | None
    """The hosts the rule grants, compiled; None when it names none."""
    paths: re.Pattern[str] | None
    """The paths the rule grants, compiled; None when it names none (any path)."""
    static: tuple[_Condition, ...]
    """Conditions on tenant, tool and server: the same for every call of one tool."""
    dynamic: tuple[_Condition, ...]
    """Conditions on the requester, the risk, the tool's permission, the arguments, the
    time and the session's earlier calls (a published registry may change a tool's
    permission, so it is not cached per tool)."""

    def matches_call(self, facts: CallFacts) -> bool:
        # A plain loop: this runs for every candidate rule of every call, and all() over a
        # generator costs a frame per rule.
        for condition in self.dynamic:  # noqa: SIM110
            if not condition.holds(facts):
                return False
        return True

    def check(self, facts: CallFacts) -> RuleCheck:
        held: list[str] = []
        for condition in (*self.static, *self.dynamic):
            if not condition.holds(facts):
                return RuleCheck(self.name, f"not: {condition.describe()}", tuple(held))
            held.append(condition.describe())
        return RuleCheck(self.name, None, tuple(held))

    def verdict(self, facts: CallFacts) -> Verdict:
        rule = self.verdict_template
        hosts = () if rule.effect == "deny" else self.ungranted_hosts(facts)
        path = () if rule.effect == "deny" else self.ungranted_path(facts)
        missing = (*hosts, *path) if path else hosts
        return Verdict(
            effect=rule.effect,
            rule=self.name,
            reason=rule.reason or _default_reason(rule),
            risk=facts.risk,
            approval=self.approval,
            sandbox_profile=rule.sandbox_profile,
            # A call whose declared hosts are all granted needs a network to reach them.
            network=rule.network or (bool(facts.hosts) and not hosts),
            missing=missing,
        )

    def ungranted_path(self, facts: CallFacts) -> tuple[PermissionNeed, ...]:
        """The call's `path` argument, when this rule names the paths it grants, the path is
        not among them, and no grant lets the call reach it."""
        if self.paths is None:
            return ()
        value = facts.arguments.get(PATH_ARGUMENT)
        if not isinstance(value, str):
            return ()
        # Normalised, as path conditions judge it: `src/../etc` is the `etc` it reaches.
        path = posixpath.normpath(value)
        if self.paths.match(path) is not None or ("path", path) in facts.granted:
            return ()
        paths = self.verdict_template.paths or ()
        reason = f"rule {self.name} grants only paths matching {_quoted(paths)}"
        return (PermissionNeed(kind="path", name=path, reason=reason),)

    def ungranted_hosts(self, facts: CallFacts) -> tuple[PermissionNeed, ...]:
        """The hosts the call declares that neither this rule nor a grant lets it reach."""
        rule = self.verdict_template
        if not facts.hosts or (rule.network and self.hosts is None):
            return ()  # `network: true` alone grants any host.
        granted = (
            f"grants only hosts matching {_quoted(rule.hosts)}"
            if rule.hosts is not None
            else "grants no network host"
        )
        return tuple(
            PermissionNeed(kind="network", name=host, reason=f"rule {self.name} {granted}")
            for host in facts.hosts
            if not (self.hosts is not None and self.hosts.match(host))
            and ("network", host) not in facts.granted
        )


def _default_reason(rule: RuleDocument) -> str:
    match rule.effect:
        case "allow":
            return f"allowed by policy rule {rule.name}"
        case "deny":
            return f"denied by policy rule {rule.name}"
        case "require_approval":
            return f"policy rule {rule.name} asks a person to approve"


_ArgumentTest = _ArgumentMatchesPath | _ArgumentContains | _ArgumentWithin


def _argument_tests(conditions: Mapping[str, ArgumentCondition]) -> list[_ArgumentTest]:
    tests: list[_ArgumentTest] = []
    for name, condition in conditions.items():
        if condition.glob is not None:
            tests.append(
                _ArgumentMatchesPath(name, condition.glob, _path_glob_regex(condition.glob))
            )
        if condition.regex is not None:
            tests.append(_ArgumentContains(name, re.compile(condition.regex)))
        if condition.min is not None or condition.max is not None:
            tests.append(_ArgumentWithin(name, condition.min, condition.max))
    return tests


def arguments_meet(
    conditions: Mapping[str, ArgumentCondition], arguments: Mapping[str, JsonValue]
) -> bool:
    """Whether the arguments meet every condition, as a policy rule's `arguments` would."""
    return all(test.meets(arguments) for test in _argument_tests(conditions))


def _approval(terms: ApprovalTerms) -> Approval:
    return Approval(
        terms.roles, terms.quorum, terms.expires_in, terms.escalate_after, terms.escalate_to or ()
    )


def _compile_rule(rule: RuleDocument, defaults: ApprovalTerms) -> _Rule:
    static: list[_Condition] = []
    dynamic: list[_Condition] = []
    if rule.tenant is not None:
        static.append(_TenantIs(rule.tenant, _glob_regex(rule.tenant)))
    if rule.tool is not None:
        static.append(_ToolIs(rule.tool, _glob_regex(rule.tool)))
    if rule.server is not None:
        static.append(_ServerIs(rule.server, _glob_regex(rule.server)))
    if rule.taint is not None:
        # First: most calls carry no taint, and this is the cheapest test that rules them out.
        dynamic.append(_Tainted(rule.taint))
    if rule.tool_effect is not None:
        dynamic.append(_ToolEffectIs(frozenset(rule.tool_effect)))
    if rule.risk is not None:
        dynamic.append(_RiskIs(frozenset(rule.risk)))
    if rule.action is not None:
        dynamic.append(_ActionIs(frozenset(rule.action)))
    if rule.user is not None:
        dynamic.append(_UserIs(rule.user, _glob_regex(rule.user)))
    if rule.role is not None:
        dynamic.append(_RoleIs(frozenset(rule.role)))
    if rule.permission is not None:
        dynamic.append(_PermissionIs(rule.permission, _glob_regex(rule.permission)))
    dynamic += _argument_tests(rule.arguments)
    if rule.during is not None:
        dynamic.append(_During.of(rule.during))
    if rule.at_most is not None:
        dynamic.append(_FewerCallsThan(rule.name, rule.at_most))
    approval = _approval(rule.approval or defaults) if rule.effect == "require_approval" else None
    hosts = _glob_regex(tuple(h.lower() for h in rule.hosts)) if rule.hosts is not None else None
    paths = _path_glob_regex(rule.paths) if rule.paths is not None else None
    return _Rule(rule.name, rule, approval, hosts, paths, tuple(static), tuple(dynamic))


class Policy:
    """A validated policy document, compiled, with the hash that identifies it in the log."""

    def __init__(
        self,
        document: PolicyDocument,
        *,
        policy_hash: str,
        source: str,
        tools: Mapping[str, ToolSpec] = BUILTIN_TOOLS_BY_NAME,
    ) -> None:
        self.document = document
        self.hash = policy_hash
        """`sha256:` and the hex digest of the policy file's bytes."""
        self.source = source
        """Where the policy came from: a file path, or `built-in`."""
        self.tools = tools
        self._rules = tuple(_compile_rule(rule, document.approval) for rule in document.rules)
        self.default_approval = _approval(document.approval)
        """Who approves a call no require_approval rule decided: one its plan asks about."""
        self.uses_requester = any(
            isinstance(condition, _UserIs | _RoleIs)
            for rule in self._rules
            for condition in rule.dynamic
        )
        """Whether any rule looks at who started the session (else it need not be looked up,
        unless the tool requires a permission: see `needs_requester`)."""
        # Screens are compiled here, once: the blocks of a call's candidates are cut from them.
        self._blocks = _blocks(self._rules)
        self._candidates: LRUCache[tuple[str, str, str], tuple[_Block, ...]] = LRUCache(
            _CANDIDATE_CACHE_LIMIT
        )
        self._counts_calls = any(rule.at_most is not None for rule in document.rules)
        self._times_or_counts = self._counts_calls or any(
            rule.during is not None for rule in document.rules
        )
        self._counted_spans: LRUCache[tuple[str, str], timedelta | None] = LRUCache(
            _CANDIDATE_CACHE_LIMIT
        )

    def __len__(self) -> int:
        return len(self._rules)

    def needs_requester(self, tool: str) -> bool:
        """Whether judging a call of `tool` needs who started the session: some rule looks
        at them, or the tool requires a permission they must hold."""
        if self.uses_requester:
            return True
        spec = self.tools.get(tool)
        return spec is not None and spec.required_permission is not None

    def counted_span_for(self, *, tenant: str, tool: str) -> timedelta | None:
        """How far back the `at_most` conditions of the rules that may decide a call of
        `tool` in `tenant` count the session's calls: the authorisations to read before
        judging it; None when none of those rules counts them (nothing need be read)."""
        if not self._counts_calls:
            return None  # Most policies: no read, and not even a lookup, on the steps' path.
        key = (tenant, tool)
        if key not in self._counted_spans:
            self._counted_spans[key] = max(
                (
                    rule.at_most.per
                    for rule in self._rules_for(tenant=tenant, tool=tool)
                    if rule.at_most is not None
                ),
                default=None,
            )
        return self._counted_spans[key]

    def judges_alike_whenever(self, *, tenant: str, tool: str) -> bool:
        """Whether a call of `tool` in `tenant` is judged the same at any time and after any
        other calls: no rule that may decide it has a time window (`during`) or counts the
        session's calls (`at_most`). Such a call's verdict, given with its plan, holds when
        it is scheduled."""
        if not self._times_or_counts:
            return True
        return not any(
            rule.during is not None or rule.at_most is not None
            for rule in self._rules_for(tenant=tenant, tool=tool)
        )

    def _rules_for(self, *, tenant: str, tool: str) -> list[RuleDocument]:
        """The rules that may decide a call of `tool` in `tenant` (those whose conditions on
        tenant, tool and server hold), in order."""
        # Only the conditions on tenant, tool and server are read: the rest may be anything.
        facts = self.facts(
            tenant=tenant,
            tool=tool,
            arguments={},
            declared_risk=None,
            requester=None,
            at=datetime.now(UTC),
        )
        candidates = self._candidates_for(facts) if facts is not None else ()
        return [rule.verdict_template for block in candidates for rule in block.rules]

    def approval_terms(self, rule: str | None) -> Approval | None:
        """The approval terms of requests made under a rule, by name: a require_approval
        rule's own; the policy's defaults for an allowing rule, whose calls are asked about
        only when their plan asks for a person."""
        found = next((r for r in self._rules if r.name == rule), None)
        if found is None or found.verdict_template.effect == "deny":
            return None
        return found.approval or self.default_approval

    def facts(
        self,
        *,
        tenant: str,
        tool: str,
        arguments: Mapping[str, JsonValue],
        declared_risk: Risk | None,
        requester: Actor | None,
        at: datetime,
        rule_uses: Mapping[str, Sequence[datetime]] = NO_USES,
        hosts: tuple[str, ...] = (),
        granted: frozenset[PermissionKey] = frozenset(),
        taint: CallTaint | None = None,
    ) -> CallFacts | None:
        """The facts of a call judged at `at`, after the session's earlier calls ran as
        `rule_uses` says, reaching `hosts`, with the permissions `granted` on request and the
        `taint` its proposal carries; or None for a tool the catalogue does not know."""
        spec = self.tools.get(tool)
        if spec is None:
            return None
        # A plan may raise a step's risk, never lower it below the tool's own.
        risk = max(spec.risk, declared_risk or spec.risk, key=RISK_ORDER.index)
        return CallFacts(
            tenant=tenant,
            tool=tool,
            server=spec.server,
            risk=risk,
            arguments=arguments,
            requester=requester,
            at=at,
            permission=spec.required_permission,
            action=spec.action,
            rule_uses=rule_uses,
            hosts=hosts,
            granted=granted,
            tool_effect=spec.effect,
            taint=taint,
        )

    def judge(
        self,
        *,
        tenant: str,
        tool: str,
        arguments: Mapping[str, JsonValue],
        at: datetime,
        declared_risk: Risk | None = None,
        requester: Actor | None = None,
        rule_uses: Mapping[str, Sequence[datetime]] = NO_USES,
        hosts: tuple[str, ...] = (),
        granted: frozenset[PermissionKey] = frozenset(),
        taint: CallTaint | None = None,
    ) -> Verdict:
        """The verdict on a call judged at `at` (see `facts`): unknown tools are denied,
        then the first matching rule."""
        facts = self.facts(
            tenant=tenant,
            tool=tool,
            arguments=arguments,
            declared_risk=declared_risk,
            requester=requester,
            at=at,
            rule_uses=rule_uses,
            hosts=hosts,
            granted=granted,
            taint=taint,
        )
        if facts is None:
            return unknown_tool_verdict(tool, declared_risk)
        return self.evaluate(facts)

    def evaluate(self, facts: CallFacts) -> Verdict:
        """The first matching rule's verdict; a call no rule matches is denied.

        A call that lacks a permission (the tool's, which the requester does not hold nor
        was granted; a declared host its rule does not grant) is denied, unless the policy
        takes `permission_requests`: then the verdict is the rules' as if it were held, with
        what it lacks in `missing` (a call the rules deny is denied: asking would not help).
        """
        lacks_permission = facts.permission is not None and not _holds_permission(facts)
        asks = self.document.permission_requests is not None
        if lacks_permission and not asks:
            return _missing_permission_verdict(facts)
        verdict = self._first_match(facts)
        if verdict.effect == "deny":
            return verdict
        missing = verdict.missing
        if lacks_permission:
            need = PermissionNeed(
                kind="tool", name=facts.permission or "", reason=_missing_permission_reason(facts)
            )
            missing = (need, *missing)
        if not missing:
            return verdict
        if asks:
            return replace(verdict, missing=missing)
        return replace(
            verdict,
            effect="deny",
            reason=f"the call needs what its rule does not grant: {described(missing)}",
            approval=None,
            network=False,
            missing=(),
        )

    def _first_match(self, facts: CallFacts) -> Verdict:
        for block in self._candidates_for(facts):
            rule = block.first_match(facts)
            if rule is not None:
                return rule.verdict(facts)
        return Verdict(
            effect="deny",
            rule=NO_RULE_MATCHED,
            reason="no policy rule allows this call (calls are denied unless a rule allows them)",
            risk=facts.risk,
        )

    def explain(self, facts: CallFacts) -> tuple[tuple[RuleCheck, ...], Verdict]:
        """Every rule tried, in order, up to the one that matched; and the verdict (no rule
        is tried for a requester who lacks the tool's permission, unless the policy takes
        permission requests)."""
        if (
            facts.permission is not None
            and not _holds_permission(facts)
            and self.document.permission_requests is None
        ):
            return (), _missing_permission_verdict(facts)
        checks = []
        for rule in self._rules:
            check = rule.check(facts)
            checks.append(check)
            if check.failed is None:
                break
        return tuple(checks), self.evaluate(facts)

    def _candidates_for(self, facts: CallFacts) -> tuple[_Block, ...]:
        key = (facts.tenant, facts.tool, facts.server)
        candidates = self._candidates.get(key)
        if candidates is None:
            kept = {rule.name for rule in self._rules if all(c.holds(facts) for c in rule.static)}
            candidates = tuple(
                narrowed
                for block in self._blocks
                if (narrowed := block.narrowed_to(kept)) is not None
            )
            self._candidates[key] = candidates
        return candidates


@dataclass(frozen=True, slots=True)
class _Block:
    """Consecutive candidate rules. When `screen` is set, each of them requires its regex to
    be found in `argument`, so one search of all their patterns joined rules them all out;
    a large screened block is split into screened halves, so that finding the rule that
    matches takes a few searches rather than one per rule."""

    rules: tuple[_Rule, ...]
    argument: str = ""
    screen: re.Pattern[str] | None = None
    halves: tuple[_Block, ...] = ()

    def narrowed_to(self, names: set[str]) -> _Block | None:
        """The block with only the named rules (its screen still holds: it rules out more)."""
        rules = tuple(rule for rule in self.rules if rule.name in names)
        if not rules:
            return None
        if len(rules) == len(self.rules):
            return self
        halves = tuple(
            narrowed for half in self.halves if (narrowed := half.narrowed_to(names)) is not None
        )
        return _Block(rules, self.argument, self.screen, halves)

    def first_match(self, facts: CallFacts) -> _Rule | None:
        if self.screen is not None:
            value = facts.arguments.get(self.argument)
            if not isinstance(value, str) or self.screen.search(value) is None:
                return None
        for half in self.halves:
            found = half.first_match(facts)
            if found is not None:
                return found
        if not self.halves:
            for rule in self.rules:
                if rule.matches_call(facts):
                    return rule
        return None


def _screened_argument(rule: _Rule) -> str | None:
    for condition in rule.dynamic:
        if isinstance(condition, _ArgumentContains) and not _UNJOINABLE.search(
            condition.regex.pattern
        ):
            return condition.name
    return None


def _screened(group: tuple[_Rule, ...], argument: str) -> _Block:
    patterns = (
        condition.regex.pattern
        for rule in group
        for condition in rule.dynamic
        if isinstance(condition, _ArgumentContains) and condition.name == argument
    )
    try:
        screen = re.compile("|".join(f"(?:{pattern})" for pattern in patterns))
    except re.error:
        return _Block(group)  # Say, one group name in two rules: test them one by one.
    halves: tuple[_Block, ...] = ()
    if len(group) > 2 * _SCREENED_BLOCK_MIN:
        middle = len(group) // 2
        halves = (_screened(group[:middle], argument), _screened(group[middle:], argument))
    return _Block(group, argument, screen, halves)


def _blocks(rules: tuple[_Rule, ...]) -> tuple[_Block, ...]:
    blocks: list[_Block] = []
    for argument, grouped in itertools.groupby(rules, key=_screened_argument):
        group = tuple(grouped)
        if argument is not None and len(group) >= _SCREENED_BLOCK_MIN:
            blocks.append(_screened(group, argument))
        else:
            blocks.append(_Block(group))
    return tuple(blocks)


_NEED_KINDS: Mapping[PermissionKind, str] = MappingProxyType(
    {"tool": "the permission", "network": "network host", "path": "path"}
)


def described(needs: Sequence[PermissionNeed]) -> str:
    """What a call lacks, in words: each permission, host or path, and why it is needed."""
    return "; ".join(f"{_NEED_KINDS[need.kind]} {need.name} ({need.reason})" for need in needs)


def _holds_permission(facts: CallFacts) -> bool:
    # A permission is held as a role of the same name by the person who started the session,
    # or granted to the session by people on request.
    if facts.permission is None:
        return True
    if ("tool", facts.permission) in facts.granted:
        return True
    return facts.requester is not None and facts.permission in facts.requester.roles


def _missing_permission_reason(facts: CallFacts) -> str:
    requester = facts.requester
    needed = f"tool {facts.tool!r} requires the permission {facts.permission!r}"
    return (
        f"{needed}, which the requester {requester.id} (roles: "
        f"{', '.join(requester.roles) or 'none'}) does not hold"
        if requester is not None
        else f"{needed}, and who started the session is unknown"
    )


def _missing_permission_verdict(facts: CallFacts) -> Verdict:
    """Least privilege: a tool that requires a permission runs only for a requester holding
    it, whatever the rules say (unless the policy lets people grant it on request)."""
    return Verdict(
        effect="deny",
        rule=MISSING_PERMISSION_RULE,
        reason=_missing_permission_reason(facts),
        risk=facts.risk,
    )


def unknown_tool_verdict(tool: str, declared_risk: Risk | None) -> Verdict:
    """Tools outside the catalogue are denied whatever the rules say: nothing can run them."""
    return Verdict(
        effect="deny",
        rule=UNKNOWN_TOOL_RULE,
        reason=f"unknown tool {tool!r}: only registered tools may run",
        risk=declared_risk or "critical",
    )
