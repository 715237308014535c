"""Policy files: YAML read into a compiled `Policy`, every problem named by line and field.

Composing the YAML keeps each node's position, which is how a validation error on the
plain data is traced back to the line a person must fix.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from helmline.approval._document import PolicyDocument
from helmline.approval._rules import Policy
from helmline.contracts import BUILTIN_TOOLS_BY_NAME, ToolSpec
from helmline.yamlfile import (
    Location,
    Problem,
    YamlFileError,
    compose,
    read_bounded,
    validation_problems,
)

BUILT_IN = "built-in"
"""The source name of the default policy, in force when no policy file is given."""


class PolicyFileError(Exception):
    """A policy file that cannot be used; the message lists every problem, line by line."""

    def __init__(self, source: str, problems: Sequence[Problem]) -> None:
        self.source = source
        self.problems = tuple(sorted(problems, key=lambda problem: problem.line))
        lines = [
            f"{source}:{p.line}: {p.field + ': ' if p.field else ''}{p.message}"
            for p in self.problems
        ]
        super().__init__("invalid policy\n" + "\n".join(lines))


def policy_hash(content: bytes) -> str:
    """How decisions name the policy they were made under."""
    return "sha256:" + hashlib.sha256(content).hexdigest()


def load_policy(path: Path, tools: Mapping[str, ToolSpec] = BUILTIN_TOOLS_BY_NAME) -> Policy:
    """The policy in `path`, or `PolicyFileError` naming each problem."""
    try:
        content = read_bounded(path, what="policy")
    except YamlFileError as error:
        raise PolicyFileError(str(path), error.problems) from error
    return parse_policy(content, source=str(path), tools=tools)


def default_policy(tools: Mapping[str, ToolSpec] = BUILTIN_TOOLS_BY_NAME) -> Policy:
    """The built-in policy: unknown tools denied, low and medium run, the rest need a person."""
    content = resources.files("helmline.approval").joinpath("default_policy.yaml").read_bytes()
    return parse_policy(content, source=BUILT_IN, tools=tools)


def parse_policy(
    content: bytes, *, source: str, tools: Mapping[str, ToolSpec] = BUILTIN_TOOLS_BY_NAME
) -> Policy:
    """Validate and compile a policy document."""
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError as error:
        raise PolicyFileError(source, [Problem(1, "", f"not UTF-8 text: {error}")]) from error
    root, document = _parse(source, text)
    try:
        validated = PolicyDocument.model_validate(document)
    except ValidationError as error:
        raise PolicyFileError(source, _problems(root, document, error)) from error
    return Policy(validated, policy_hash=policy_hash(content), source=source, tools=tools)


def _parse(source: str, text: str) -> tuple[yaml.Node, Any]:
    try:
        document = compose(text, source, expected="`rules`")
    except YamlFileError as error:
        raise PolicyFileError(source, error.problems) from error
    return document.root, document.data


def _problems(root: yaml.Node, document: dict[str, Any], error: ValidationError) -> list[Problem]:
    def place(message: str) -> Location:
        return _second_use_of_a_name(document) if "used twice" in message else ()

    return validation_problems(root, error, place_whole_document_error=place)


def _second_use_of_a_name(document: dict[str, Any]) -> Location:
    seen: set[object] = set()
    rules = document.get("rules") or []
    for index, rule in enumerate(rules):
        name = rule.get("name") if isinstance(rule, dict) else None
        if name in seen:
            return ("rules", index, "name")
        seen.add(name)
    return ("rules",)
