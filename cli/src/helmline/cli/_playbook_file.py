"""Playbook files: YAML read into a `Playbook`, every problem named by file, line and field.

Nothing is appended for a playbook that fails here, so all checks a person can fix in the
file run before a session starts: YAML syntax, the contract's own validation (fields, types,
dependencies), tools known to the registry, and each step's arguments against its tool's
JSON Schema.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from helmline.cli._errors import INVALID_INPUT, CliError
from helmline.contracts import BUILTIN_TOOLS_BY_NAME, Playbook, ToolSpec
from helmline.runtime import playbook_problems
from helmline.yamlfile import (
    Location,
    Problem,
    YamlFileError,
    compose,
    field_of,
    line_of,
    node_at,
    read_text,
    validation_problems,
)


class PlaybookError(CliError):
    """A playbook file that cannot be run; the message lists every problem found."""

    def __init__(self, path: Path, problems: Sequence[Problem]) -> None:
        self.path = path
        self.problems = tuple(sorted(problems, key=lambda problem: problem.line))
        lines = [
            f"{path}:{p.line}: {p.field + ': ' if p.field else ''}{p.message}"
            for p in self.problems
        ]
        super().__init__("invalid playbook\n" + "\n".join(lines), exit_code=INVALID_INPUT)


def load_playbook(path: Path, tools: Mapping[str, ToolSpec] = BUILTIN_TOOLS_BY_NAME) -> Playbook:
    """The playbook in `path`, or `PlaybookError` naming each problem."""
    try:
        text = read_text(path, what="playbook")
    except YamlFileError as error:
        raise PlaybookError(path, error.problems) from error
    root, document = _parse(path, text)
    try:
        playbook = Playbook.model_validate(document)
    except ValidationError as error:
        raise PlaybookError(path, _contract_problems(root, document, error)) from error
    problems = _tool_problems(root, playbook, tools)
    if problems:
        raise PlaybookError(path, problems)
    return playbook


def _parse(path: Path, text: str) -> tuple[yaml.Node, Any]:
    try:
        document = compose(text, str(path), expected="`goal` and `steps`")
    except YamlFileError as error:
        raise PlaybookError(path, error.problems) from error
    return document.root, document.data


def _contract_problems(root: yaml.Node, document: Any, error: ValidationError) -> list[Problem]:
    # The playbook's own check of ids and dependencies spans all steps: point at the first
    # step involved.
    return validation_problems(
        root, error, place_whole_document_error=lambda message: _dependency_location(document)
    )


def _dependency_location(document: dict[str, Any]) -> Location:
    """Where a duplicate id, an unknown dependency or a cycle shows in the steps.

    The contract says what is wrong; this only points at the first step involved.
    """
    steps: list[dict[str, Any]] = document["steps"]
    ids = [step["id"] for step in steps]
    for index, step_id in enumerate(ids):
        if step_id in ids[:index]:
            return ("steps", index, "id")
    for index, step in enumerate(steps):
        for position, dependency in enumerate(step.get("depends_on", ())):
            if dependency not in ids:
                return ("steps", index, "depends_on", position)
    depends = {step["id"]: tuple(step.get("depends_on", ())) for step in steps}
    for index, step_id in enumerate(ids):
        if _reaches(depends, start=step_id, target=step_id):
            return ("steps", index, "depends_on")
    return ("steps",)


def _reaches(depends: Mapping[str, tuple[str, ...]], *, start: str, target: str) -> bool:
    seen: set[str] = set()
    stack = list(depends[start])
    while stack:
        current = stack.pop()
        if current == target:
            return True
        if current not in seen:
            seen.add(current)
            stack.extend(depends.get(current, ()))
    return False


def _tool_problems(
    root: yaml.Node, playbook: Playbook, tools: Mapping[str, ToolSpec]
) -> list[Problem]:
    return [
        Problem(line_of(node_at(root, found.location)), field_of(found.location), found.message)
        for found in playbook_problems(playbook, tools)
    ]
