"""Policy files: validated at load with the line and field at fault, hashed, reloaded."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from helmline.approval import (
    BUILT_IN,
    PolicyFileError,
    default_policy,
    load_policy,
    parse_policy,
    policy_hash,
)
from helmline.approval._policy_source import PolicySource

EXAMPLES = Path(__file__).parents[3] / "examples" / "policies"


def _problems(text: str) -> list[str]:
    with pytest.raises(PolicyFileError) as caught:
        parse_policy(text.encode(), source="p.yaml")
    return [f"{p.line}: {p.field}: {p.message}" for p in caught.value.problems]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("rules: [\n", "2: : invalid YAML"),
        ("", "1: : the file is empty"),
        ("- a\n- b\n", "1: : expected a mapping"),
        (
            "rules:\n  - name: a\n    effect: allow\n    colour: red\n",
            "4: rules[0].colour: unknown field",
        ),
        ("rules:\n  - name: a\n    effect: permit\n", "3: rules[0].effect: Input should be"),
        ("rules:\n  - name: a\n    tool: x\n", "2: rules[0]: missing field 'effect'"),
        (
            "rules:\n  - name: a\n    effect: deny\n  - name: b\n    effect: allow\n"
            "    arguments:\n      command: {regex: '(unclosed'}\n",
            "7: rules[1].arguments.command.regex: invalid regular expression",
        ),
        (
            "rules:\n  - name: a\n    effect: allow\n    arguments:\n      n: {min: 5, max: 1}\n",
            "5: rules[0].arguments.n: min (5.0) is above max (1.0)",
        ),
        (
            "rules:\n  - name: a\n    effect: allow\n    arguments:\n      n: {}\n",
            "5: rules[0].arguments.n: an argument condition needs glob, regex, min or max",
        ),
        (
            "rules:\n  - name: a\n    effect: allow\n    approval: {quorum: 2}\n",
            "2: rules[0]: `approval` only applies to require_approval",
        ),
        (
            "rules:\n  - name: a\n    effect: require_approval\n    approval:\n"
            "      expires_in: soon\n",
            "5: rules[0].approval.expires_in: 'soon' is not a duration",
        ),
        (
            "rules:\n  - name: a\n    effect: require_approval\n    approval: {quorum: 0}\n",
            "4: rules[0].approval.quorum: Input should be greater than or equal to 1",
        ),
        (
            "rules:\n  - name: a\n    effect: deny\n  - name: a\n    effect: allow\n",
            "4: rules[1].name: rule name 'a' is used twice",
        ),
        (
            "rules:\n  - name: a\n    effect: deny\n  - name: unknown-tool\n    effect: allow\n",
            "4: rules[1].name: rule name 'unknown-tool' is reserved",
        ),
        (
            "rules:\n  - name: a\n    effect: allow\n    risk: extreme\n",
            "4: rules[0].risk[0]: Input",
        ),
        ("version: 2\nrules: []\n", "1: version: Input should be 1"),
        (
            "rules:\n  - name: a\n    effect: require_approval\n    approval:\n"
            "      escalate_after: 5m\n",
            "5: rules[0].approval: escalate_after and escalate_to go together",
        ),
        (
            "rules:\n  - name: a\n    effect: require_approval\n    approval:\n"
            "      expires_in: 5m\n      escalate_after: 5m\n      escalate_to: [lead]\n",
            "5: rules[0].approval: escalate_after must come before expires_in",
        ),
        (
            "rules:\n  - name: a\n    effect: allow\n    during:\n      days: [mon, funday]\n",
            "5: rules[0].during.days: 'funday' is not a day: use mon, tue",
        ),
        (
            "rules:\n  - name: a\n    effect: allow\n    during:\n      hours: 9am-5pm\n",
            "5: rules[0].during.hours: '9am-5pm' is not a span of hours",
        ),
        (
            "rules:\n  - name: a\n    effect: allow\n    during: {hours: 10:30}\n",
            "4: rules[0].during.hours: hours are a span such as 09:00-17:30, from and to",
        ),
        (
            "rules:\n  - name: a\n    effect: allow\n    during: {hours: '08:00-24:30'}\n",
            "4: rules[0].during.hours: '08:00-24:30' names a time of day",
        ),
        (
            "rules:\n  - name: a\n    effect: allow\n    during:\n      timezone: Europe/Paname\n",
            "5: rules[0].during.timezone: unknown time zone 'Europe/Paname'",
        ),
        (
            "rules:\n  - name: a\n    effect: allow\n    at_most: {calls: 0, per: 1m}\n",
            "4: rules[0].at_most.calls: Input should be greater than or equal to 1",
        ),
        (
            "rules:\n  - name: a\n    effect: allow\n    at_most: {calls: 5, per: 0s}\n",
            "4: rules[0].at_most.per: per must be longer than zero and at most 30 days",
        ),
        (
            "rules:\n  - name: a\n    effect: allow\n    at_most: {calls: 5}\n",
            "4: rules[0].at_most: missing field 'per'",
        ),
        (
            "rules:\n  - name: a\n    effect: deny\n    at_most: {calls: 5, per: 1h}\n",
            "2: rules[0]: a deny rule lets no call run, so at_most would count none",
        ),
    ],
)
def test_every_problem_names_its_line_and_field(text: str, expected: str) -> None:
    problems = _problems(text)
    assert any(problem.startswith(expected) for problem in problems), problems


def test_the_message_lists_the_file_and_line() -> None:
    with pytest.raises(PolicyFileError) as caught:
        parse_policy(b"rules:\n  - name: a\n    effect: nope\n", source="team.yaml")
    assert "team.yaml:3: rules[0].effect:" in str(caught.value)


def test_the_hash_is_of_the_file_bytes() -> None:
    content = b"rules: [{name: a, effect: allow}]\n"
    assert parse_policy(content, source="x").hash == policy_hash(content)
    assert policy_hash(content).startswith("sha256:")
    assert policy_hash(content) != policy_hash(content + b"\n")


def test_the_built_in_policy_is_a_document_like_any_other() -> None:
    policy = default_policy()
    assert policy.source == BUILT_IN
    assert [rule.name for rule in policy.document.rules] == [
        "approve-effects-after-suspected-injection",
        "approve-destinations-from-untrusted-output",
        "allow-low-and-medium-risk",
        "approve-high-and-critical-risk",
    ]


@pytest.mark.parametrize("example", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_the_example_policies_are_valid(example: Path) -> None:
    assert len(load_policy(example)) >= 1


def test_a_changed_file_is_reloaded_and_an_invalid_edit_keeps_the_policy_in_force(
    tmp_path: Path,
) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text("rules: [{name: first, effect: allow}]\n")
    source = PolicySource(path, poll_s=0.01)
    first = source.current
    assert not source.reload_if_changed()

    path.write_text("rules: [{name: second, effect: deny}]\n")
    _touch_later(path)
    assert source.reload_if_changed()
    assert source.current.document.rules[0].name == "second"
    assert source.current.hash != first.hash

    path.write_text("rules: [{name: third, effect: explode}]\n")
    _touch_later(path)
    assert not source.reload_if_changed()
    assert source.current.document.rules[0].name == "second"


def test_a_service_does_not_start_with_an_invalid_policy_file(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text("rules: [{name: a}]\n")
    with pytest.raises(PolicyFileError, match="missing field 'effect'"):
        PolicySource(path)


def _touch_later(path: Path) -> None:
    # Two writes within one timestamp tick look alike by mtime; the size may not differ either.
    status = path.stat()
    os.utime(path, ns=(status.st_atime_ns, status.st_mtime_ns + 1_000_000))
