"""A policy of many rules against many calls: every effect, argument conditions, rule order."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from helmline.approval import CallFacts, Policy, RuleCheck, parse_policy
from helmline.contracts import BUILTIN_TOOLS_BY_NAME, Actor, Risk, ToolSpec

POLICY = parse_policy(
    b"""
version: 1
approval: {roles: [approver], quorum: 1, expires_in: 15m}
rules:
  - name: quarantined-tenant
    tenant: quarantine-*
    effect: deny
    reason: this tenant is quarantined
  - name: interns-read-only
    role: intern
    tool: [write_file, delete_file, run_command]
    effect: deny
    reason: interns may only read
  - name: guests-only-read
    role: guest
    action: [write, delete, execute]
    effect: deny
    reason: guests may only read
  - name: no-secrets
    tool: [read_file, write_file, delete_file]
    arguments:
      path: {glob: ['**/.env', 'secrets/**', '**/*.pem']}
    effect: deny
    reason: secrets stay where they are
  - name: no-force-push
    tool: run_command
    arguments:
      command: {regex: 'git\\s+push\\b.*(--force|-f\\b)'}
    effect: deny
    reason: force pushes rewrite shared history
  - name: short-tests-run
    tool: run_command
    arguments:
      command: {regex: '^(pytest|make test)\\b'}
      timeout_s: {min: 1, max: 120}
    effect: allow
    sandbox_profile: tests
  - name: installs-need-network-and-a-person
    tool: run_command
    arguments:
      command: {regex: '^pip install '}
    effect: require_approval
    network: true
    sandbox_profile: installer
  - name: deploys-need-two-sre
    tool: run_command
    user: [ci-*, ana]
    arguments:
      command: {regex: '^deploy\\b'}
    effect: require_approval
    approval: {roles: [sre], quorum: 2, expires_in: 1h}
  - name: sources-writable
    tool: write_file
    arguments:
      path: {glob: ['src/**', 'tests/*.py']}
    effect: allow
  - name: other-writes-need-a-person
    tool: [write_file, delete_file]
    effect: require_approval
  - name: echo-only-for-acme
    tool: echo
    tenant: acme
    effect: allow
  - name: builtin-low-risk
    server: builtin
    risk: low
    tool: '*_file*'
    effect: allow
  - name: releases-in-office-hours
    tool: run_command
    arguments:
      command: {regex: '^release\\b'}
    during: {days: mon-fri, hours: 09:00-17:00, timezone: Europe/Berlin}
    effect: allow
  - name: vacuum-on-saturday-night
    tool: run_command
    arguments:
      command: {regex: '^vacuum\\b'}
    during: {days: sat, hours: 22:00-04:00, timezone: America/New_York}
    effect: allow
  - name: greps-freely-at-first
    tool: run_command
    arguments:
      command: {regex: '^grep '}
    at_most: {calls: 3, per: 10m}
    effect: allow
  - name: critical-never
    risk: critical
    effect: deny
  - name: remaining-commands
    tool: run_command
    effect: require_approval
"""
    b"",
    source="table.yaml",
)

DEV = Actor(id="dev", roles=("developer",))
INTERN = Actor(id="ian", roles=("intern",))
ANA = Actor(id="ana", roles=("developer",))
CI = Actor(id="ci-deploy", kind="service")
GUEST = Actor(id="gil", roles=("guest",))
WEDNESDAY_NOON = datetime(2026, 12, 2, 12, tzinfo=UTC)


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def call(
    tool: str,
    *,
    tenant: str = "acme",
    requester: Actor | None = DEV,
    risk: Risk | None = None,
    at: datetime = WEDNESDAY_NOON,
    earlier: Mapping[str, tuple[datetime, ...]] | None = None,
    **arguments: Any,
) -> dict[str, Any]:
    """A call's facts; `earlier`: when the session's earlier calls ran, by rule."""
    return {
        "tenant": tenant,
        "tool": tool,
        "arguments": arguments,
        "declared_risk": risk,
        "requester": requester,
        "at": at,
        "rule_uses": earlier or {},
    }


def minutes_ago(*minutes: float) -> tuple[datetime, ...]:
    """Moments before WEDNESDAY_NOON, oldest first."""
    return tuple(WEDNESDAY_NOON - timedelta(minutes=m) for m in sorted(minutes, reverse=True))


CASES: list[tuple[str, dict[str, Any], str, str]] = [
    (
        "a guest writes: the tool's action is write",
        call("write_file", requester=GUEST, path="src/a.py", content="x"),
        "deny",
        "guests-only-read",
    ),
    (
        "a guest deletes",
        call("delete_file", requester=GUEST, path="notes.txt"),
        "deny",
        "guests-only-read",
    ),
    (
        "a guest runs even the tests",
        call("run_command", requester=GUEST, command="pytest", timeout_s=5),
        "deny",
        "guests-only-read",
    ),
    (
        "a guest reads: read is not among the rule's actions",
        call("read_file", requester=GUEST, path="notes.txt"),
        "allow",
        "builtin-low-risk",
    ),
    # (what, call, effect, rule)
    (
        "quarantine first",
        call("echo", tenant="quarantine-1", message="x"),
        "deny",
        "quarantined-tenant",
    ),
    (
        "quarantine beats tests",
        call("run_command", tenant="quarantine-b", command="pytest"),
        "deny",
        "quarantined-tenant",
    ),
    (
        "quarantine glob needs dash",
        call("echo", tenant="quarantined", message="x"),
        "deny",
        "no-rule-matched",
    ),
    (
        "intern writes",
        call("write_file", requester=INTERN, path="src/a.py", content=""),
        "deny",
        "interns-read-only",
    ),
    (
        "intern runs",
        call("run_command", requester=INTERN, command="pytest"),
        "deny",
        "interns-read-only",
    ),
    (
        "intern reads",
        call("read_file", requester=INTERN, path="src/a.py"),
        "allow",
        "builtin-low-risk",
    ),
    (
        "intern reads secret",
        call("read_file", requester=INTERN, path="secrets/k"),
        "deny",
        "no-secrets",
    ),
    (
        "no requester is no role",
        call("write_file", requester=None, path="src/a.py", content=""),
        "allow",
        "sources-writable",
    ),
    ("dotenv at root", call("read_file", path=".env"), "deny", "no-secrets"),
    ("dotenv deep", call("read_file", path="app/config/.env"), "deny", "no-secrets"),
    ("pem file", call("write_file", path="certs/server.pem", content=""), "deny", "no-secrets"),
    ("secrets folder", call("delete_file", path="secrets/deep/key"), "deny", "no-secrets"),
    ("secrets via dotdot", call("read_file", path="src/../secrets/key"), "deny", "no-secrets"),
    ("secrets via dot slash", call("read_file", path="./secrets/key"), "deny", "no-secrets"),
    ("envrc is not env", call("read_file", path=".envrc"), "allow", "builtin-low-risk"),
    (
        "force push long",
        call("run_command", command="git push origin main --force"),
        "deny",
        "no-force-push",
    ),
    (
        "force push short",
        call("run_command", command="git  push -f origin"),
        "deny",
        "no-force-push",
    ),
    (
        "plain push",
        call("run_command", command="git push origin main"),
        "require_approval",
        "remaining-commands",
    ),
    (
        "force push beats tests rule",
        call("run_command", command="pytest && git push --force", timeout_s=5),
        "deny",
        "no-force-push",
    ),
    (
        "tests within bounds",
        call("run_command", command="pytest -q", timeout_s=60),
        "allow",
        "short-tests-run",
    ),
    (
        "tests at upper bound",
        call("run_command", command="make test", timeout_s=120),
        "allow",
        "short-tests-run",
    ),
    (
        "tests at lower bound",
        call("run_command", command="pytest", timeout_s=1),
        "allow",
        "short-tests-run",
    ),
    (
        "tests over bound",
        call("run_command", command="pytest", timeout_s=121),
        "require_approval",
        "remaining-commands",
    ),
    (
        "tests under bound",
        call("run_command", command="pytest", timeout_s=0.5),
        "require_approval",
        "remaining-commands",
    ),
    (
        "tests without timeout",
        call("run_command", command="pytest"),
        "require_approval",
        "remaining-commands",
    ),
    (
        "tests timeout not a number",
        call("run_command", command="pytest", timeout_s="60"),
        "require_approval",
        "remaining-commands",
    ),
    (
        "tests timeout bool",
        call("run_command", command="pytest", timeout_s=True),
        "require_approval",
        "remaining-commands",
    ),
    (
        "regex anchored",
        call("run_command", command="echo pytest", timeout_s=5),
        "require_approval",
        "remaining-commands",
    ),
    (
        "pip install",
        call("run_command", command="pip install requests"),
        "require_approval",
        "installs-need-network-and-a-person",
    ),
    (
        "deploy by ana",
        call("run_command", requester=ANA, command="deploy prod"),
        "require_approval",
        "deploys-need-two-sre",
    ),
    (
        "deploy by ci",
        call("run_command", requester=CI, command="deploy staging"),
        "require_approval",
        "deploys-need-two-sre",
    ),
    (
        "deploy by dev",
        call("run_command", command="deploy prod"),
        "require_approval",
        "remaining-commands",
    ),
    (
        "deploy word boundary",
        call("run_command", requester=ANA, command="deployer"),
        "require_approval",
        "remaining-commands",
    ),
    (
        "write src",
        call("write_file", path="src/pkg/mod.py", content=""),
        "allow",
        "sources-writable",
    ),
    (
        "write test top",
        call("write_file", path="tests/test_a.py", content=""),
        "allow",
        "sources-writable",
    ),
    (
        "write test nested",
        call("write_file", path="tests/unit/test_a.py", content=""),
        "require_approval",
        "other-writes-need-a-person",
    ),
    (
        "write src escaping",
        call("write_file", path="src/../setup.py", content=""),
        "require_approval",
        "other-writes-need-a-person",
    ),
    (
        "write readme",
        call("write_file", path="README.md", content=""),
        "require_approval",
        "other-writes-need-a-person",
    ),
    (
        "delete src",
        call("delete_file", path="src/a.py"),
        "require_approval",
        "other-writes-need-a-person",
    ),
    (
        "write without path",
        call("write_file", content=""),
        "require_approval",
        "other-writes-need-a-person",
    ),
    ("echo acme", call("echo", message="hi"), "allow", "echo-only-for-acme"),
    ("echo other tenant", call("echo", tenant="globex", message="hi"), "deny", "no-rule-matched"),
    ("list files", call("list_files", tenant="globex"), "allow", "builtin-low-risk"),
    (
        "read raised to medium",
        call("read_file", risk="medium", path="a"),
        "deny",
        "no-rule-matched",
    ),
    (
        "read raised to critical",
        call("read_file", risk="critical", path="a"),
        "deny",
        "critical-never",
    ),
    (
        "plan cannot lower",
        call("run_command", risk="low", command="ls"),
        "require_approval",
        "remaining-commands",
    ),
    (
        "command raised to critical",
        call("run_command", risk="critical", command="ls"),
        "deny",
        "critical-never",
    ),
    (
        "critical tests still allowed first",
        call("run_command", risk="critical", command="pytest", timeout_s=3),
        "allow",
        "short-tests-run",
    ),
    ("unknown tool", call("format_disk"), "deny", "unknown-tool"),
    (
        "unknown tool in quarantine",
        call("format_disk", tenant="quarantine-1"),
        "deny",
        "unknown-tool",
    ),
    ("unknown tool like a file tool", call("shred_file"), "deny", "unknown-tool"),
    (
        "echo critical",
        call("echo", tenant="globex", risk="critical", message="x"),
        "deny",
        "critical-never",
    ),
    # Time windows, read in the rule's zone: Berlin is UTC+1 in winter, +2 in summer.
    (
        "release at 10:00 in Berlin on a Wednesday",
        call("run_command", at=utc("2026-12-02T09:00"), command="release v2"),
        "allow",
        "releases-in-office-hours",
    ),
    (
        "release at 08:30 in Berlin, before the window",
        call("run_command", at=utc("2026-12-02T07:30"), command="release v2"),
        "require_approval",
        "remaining-commands",
    ),
    (
        "release at 09:30 in Berlin in summer, the same UTC time",
        call("run_command", at=utc("2026-07-01T07:30"), command="release v2"),
        "allow",
        "releases-in-office-hours",
    ),
    (
        "release at 17:00 in Berlin: the end is not in the window",
        call("run_command", at=utc("2026-12-02T16:00"), command="release v2"),
        "require_approval",
        "remaining-commands",
    ),
    (
        "release on a Saturday",
        call("run_command", at=utc("2026-12-05T10:00"), command="release v2"),
        "require_approval",
        "remaining-commands",
    ),
    (
        "vacuum at 23:00 on Saturday in New York",
        call("run_command", at=utc("2026-12-06T04:00"), command="vacuum db"),
        "allow",
        "vacuum-on-saturday-night",
    ),
    (
        "vacuum at 03:00 on Sunday in New York: the window runs past midnight",
        call("run_command", at=utc("2026-12-06T08:00"), command="vacuum db"),
        "allow",
        "vacuum-on-saturday-night",
    ),
    (
        "vacuum at 05:00 on Sunday in New York, after the window closed",
        call("run_command", at=utc("2026-12-06T10:00"), command="vacuum db"),
        "require_approval",
        "remaining-commands",
    ),
    (
        "vacuum at 23:00 on Friday in New York, already Saturday in UTC",
        call("run_command", at=utc("2026-12-05T04:00"), command="vacuum db"),
        "require_approval",
        "remaining-commands",
    ),
    (
        "the session's first grep",
        call("run_command", command="grep -r TODO src"),
        "allow",
        "greps-freely-at-first",
    ),
    (
        "a third grep within 10 minutes",
        call(
            "run_command",
            earlier={"greps-freely-at-first": minutes_ago(9, 1)},
            command="grep x",
        ),
        "allow",
        "greps-freely-at-first",
    ),
    (
        "a fourth grep within 10 minutes: past the rule's limit",
        call(
            "run_command",
            earlier={"greps-freely-at-first": minutes_ago(9, 5, 1)},
            command="grep x",
        ),
        "require_approval",
        "remaining-commands",
    ),
    (
        "a fourth grep, the first of them 10 minutes ago: it no longer counts",
        call(
            "run_command",
            earlier={"greps-freely-at-first": minutes_ago(30, 10, 5, 1)},
            command="grep x",
        ),
        "allow",
        "greps-freely-at-first",
    ),
    (
        "a grep after many calls under other rules: only the rule's own count",
        call(
            "run_command",
            earlier={
                "short-tests-run": minutes_ago(4, 3, 2, 1),
                "remaining-commands": minutes_ago(0),
            },
            command="grep x",
        ),
        "allow",
        "greps-freely-at-first",
    ),
]


@pytest.mark.parametrize(("what", "arguments", "effect", "rule"), CASES, ids=[c[0] for c in CASES])
def test_the_first_matching_rule_decides(
    what: str, arguments: dict[str, Any], effect: str, rule: str
) -> None:
    verdict = POLICY.judge(**arguments)
    assert (verdict.effect, verdict.rule) == (effect, rule)


def test_the_table_is_large_enough_to_mean_something() -> None:
    assert len(POLICY) >= 10
    assert len(CASES) >= 50
    assert {rule for *_, rule in CASES} >= {r.name for r in POLICY.document.rules}


def test_deny_reasons_and_grants_are_carried_by_the_verdict() -> None:
    denied = POLICY.judge(**call("run_command", command="git push --force"))
    assert denied.reason == "force pushes rewrite shared history"
    tests = POLICY.judge(**call("run_command", command="pytest", timeout_s=5))
    assert (tests.sandbox_profile, tests.network) == ("tests", False)
    install = POLICY.judge(**call("run_command", command="pip install x"))
    assert install.approval is not None
    assert (install.network, install.sandbox_profile) == (True, "installer")
    # Terms of the policy's `approval` block when the rule states none.
    assert (install.approval.roles, install.approval.quorum) == (("approver",), 1)
    assert install.approval.expires_in.total_seconds() == 15 * 60
    deploy = POLICY.judge(**call("run_command", requester=ANA, command="deploy x"))
    assert deploy.approval is not None
    assert (deploy.approval.roles, deploy.approval.quorum) == (("sre",), 2)


def test_explain_names_why_each_earlier_rule_did_not_match() -> None:
    facts = POLICY.facts(
        tenant="acme",
        tool="write_file",
        arguments={"path": "README.md", "content": ""},
        declared_risk=None,
        requester=DEV,
        at=WEDNESDAY_NOON,
    )
    assert facts is not None
    checks, verdict = POLICY.explain(facts)
    assert verdict.rule == "other-writes-need-a-person"
    assert [c.rule for c in checks][-1] == "other-writes-need-a-person"
    assert checks[-1].failed is None
    failed = {c.rule: c.failed for c in checks[:-1]}
    assert failed["quarantined-tenant"] == "not: tenant matches 'quarantine-*'"
    assert failed["sources-writable"] == "not: argument path matches path 'src/**' or 'tests/*.py'"
    assert failed["no-force-push"] == "not: tool matches 'run_command'"


def _first_match_one_by_one(policy: Policy, facts: CallFacts) -> str:
    checks, _ = policy.explain(facts)
    matched = [check.rule for check in checks if check.failed is None]
    return matched[0] if matched else "no-rule-matched"


def test_many_regex_rules_on_one_argument_decide_as_if_tried_one_by_one() -> None:
    # Long runs of regex rules are screened with their patterns joined; backreferences and
    # global flags cannot be joined and are tried one by one.
    patterns = [
        r"^ls\b",
        r"(a)\1",
        r"(?i)^DEPLOY",
        r"^git (push|pull)",
        r"rm\s+-rf",
        r"^make\b",
        r"^make test",
        r"(?P<x>y)(?P=x)",
        r"^cat ",
        r"\.sh$",
    ]
    lines = ["rules:"]
    for index, pattern in enumerate(patterns * 3):
        lines += [
            f"  - name: r{index}",
            "    tool: run_command",
            "    arguments:",
            f"      command: {{regex: '{pattern}'}}",
            f"      timeout_s: {{max: {index}}}" if index % 4 == 0 else "",
            f"    effect: {('allow', 'deny', 'require_approval')[index % 3]}",
        ]
    policy = parse_policy("\n".join(lines).encode(), source="regexes.yaml")
    commands = ["ls", "ls -l", "aa", "deploy x", "git pull", "rm  -rf /", "make test", "yy"]
    commands += ["cat x", "run.sh", "nothing", "MAKE", "git push", "xaa", "deployer"]
    for command in commands:
        for timeout in (None, 0, 5, 30):
            arguments: dict[str, Any] = {"command": command}
            if timeout is not None:
                arguments["timeout_s"] = timeout
            facts = policy.facts(
                tenant="t",
                tool="run_command",
                arguments=arguments,
                declared_risk=None,
                requester=None,
                at=WEDNESDAY_NOON,
            )
            assert facts is not None
            assert policy.evaluate(facts).rule == _first_match_one_by_one(policy, facts), arguments


def test_explain_names_the_time_window_a_call_fell_outside_of() -> None:
    facts = POLICY.facts(**call("run_command", at=utc("2026-12-05T10:00"), command="release v2"))
    assert facts is not None
    checks, verdict = POLICY.explain(facts)
    assert verdict.rule == "remaining-commands"
    failed = {c.rule: c.failed for c in checks}
    assert failed["releases-in-office-hours"] == (
        "not: within 09:00-17:00 Europe/Berlin on mon, tue, wed, thu, fri"
    )


def test_explain_names_the_rate_a_call_went_past() -> None:
    earlier = {"greps-freely-at-first": minutes_ago(8, 6, 2)}
    facts = POLICY.facts(**call("run_command", earlier=earlier, command="grep x"))
    assert facts is not None
    checks, verdict = POLICY.explain(facts)
    assert verdict.rule == "remaining-commands"
    failed = {c.rule: c.failed for c in checks}
    assert failed["greps-freely-at-first"] == (
        "not: fewer than 3 calls of the session ran under this rule in the last 10m"
    )


def test_an_action_rule_leaves_alone_a_tool_that_declares_no_action() -> None:
    lookup = ToolSpec(
        name="docs__lookup",
        description="Look a word up.",
        parameters={"type": "object"},
        risk="low",
        executor="mcp",
        server="docs",
    )
    policy = parse_policy(
        b"""
version: 1
rules:
  - {name: reads, action: read, effect: allow}
  - {name: the-rest, effect: require_approval}
""",
        source="actions.yaml",
        tools={**BUILTIN_TOOLS_BY_NAME, lookup.name: lookup},
    )
    assert policy.judge(**call("read_file", path="a")).rule == "reads"
    assert policy.judge(**call("docs__lookup")).rule == "the-rest"
    facts = policy.facts(**call("docs__lookup"))
    assert facts is not None
    checks, _ = policy.explain(facts)
    assert checks[0] == RuleCheck("reads", "not: the tool's action is read", ())
