"""Playbook files: YAML read into a `Playbook`, every problem named by file, line and field.

Nothing is appended for a playbook that fails here, so all checks a person can fix in the
file run before a session starts: YAML syntax, the contract's own validation (fields, types,
dependencies), tools known to the registry, and each step's arguments against its tool's
JSON Schema.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft202012Validator
from pydantic import ValidationError

from helmline.cli._errors import CliError
from helmline.contracts import BUILTIN_TOOLS_BY_NAME, Playbook, ToolSpec

INVALID_INPUT = 2
"""Exit status for input a person must fix (usage errors share it)."""

Location = tuple[str | int, ...]


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a playbook file."""

    line: int
    """1-based line in the file."""
    field: str
    """Where in the document, as `steps[1].arguments.path`; empty for the whole file."""
    message: str


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
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise CliError(f"cannot read playbook {path}: {error}", exit_code=INVALID_INPUT) from error
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
    # Composing keeps every node's start mark, which is how errors found later in the
    # plain data are traced back to a line.
    loader = yaml.SafeLoader(text)
    try:
        root = loader.get_single_node()
        if root is None:
            raise PlaybookError(path, [Problem(1, "", "the file is empty")])
        document = loader.construct_document(root)
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        line = mark.line + 1 if mark is not None else 1
        reason = error.problem or error.context or "unreadable"
        raise PlaybookError(path, [Problem(line, "", f"invalid YAML: {reason}")]) from error
    except yaml.YAMLError as error:
        raise PlaybookError(path, [Problem(1, "", f"invalid YAML: {error}")]) from error
    finally:
        loader.dispose()
    if not isinstance(document, dict):
        raise PlaybookError(
            path,
            [Problem(_line(root), "", "expected a mapping with `goal` and `steps` at the top")],
        )
    return root, document


def _contract_problems(root: yaml.Node, document: Any, error: ValidationError) -> list[Problem]:
    problems = []
    details = error.errors(include_url=False)
    for detail in details:
        location: Location = tuple(detail["loc"])
        if detail["type"] == "too_short" and any(
            other["loc"][: len(location)] == location and len(other["loc"]) > len(location)
            for other in details
        ):
            continue  # A list whose items are invalid is also counted short: say it once.
        message = detail["msg"]
        match detail["type"]:
            case "missing":
                *parent, name = location
                location = tuple(parent)
                message = f"missing field {name!r}"
            case "extra_forbidden":
                message = "unknown field"
            case "value_error" if not location:
                # The playbook's own check of ids and dependencies, which spans all steps.
                location = _dependency_location(document)
                message = message.removeprefix("Value error, ")
        problems.append(Problem(_line(_node_at(root, location)), _field(location), message))
    return problems


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
    problems = []
    for index, step in enumerate(playbook.steps):
        spec = tools.get(step.tool)
        if spec is None:
            location: Location = ("steps", index, "tool")
            known = ", ".join(sorted(tools))
            problems.append(
                Problem(
                    _line(_node_at(root, location)),
                    _field(location),
                    f"unknown tool {step.tool!r} (known tools: {known})",
                )
            )
            continue
        validator = Draft202012Validator(spec.parameters)
        for failure in validator.iter_errors(step.arguments):
            location = ("steps", index, "arguments", *failure.absolute_path)
            if failure.validator == "additionalProperties" and isinstance(failure.instance, dict):
                # Point at the first unexpected key rather than at the whole mapping.
                allowed = (
                    failure.schema.get("properties", {}) if isinstance(failure.schema, dict) else {}
                )
                extra = next((key for key in failure.instance if key not in allowed), None)
                if extra is not None:
                    location = (*location, extra)
            problems.append(
                Problem(
                    _line(_node_at(root, location)),
                    _field(location),
                    f"{failure.message} (arguments of {step.tool})",
                )
            )
    return problems


def _node_at(root: yaml.Node, location: Location) -> yaml.Node:
    """The deepest node along `location`; a missing field is reported at its parent."""
    node = root
    for part in location:
        child: yaml.Node | None = None
        if isinstance(node, yaml.MappingNode):
            child = next((value for key, value in node.value if key.value == part), None)
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
            child = node.value[part] if 0 <= part < len(node.value) else None
        if child is None:
            break
        node = child
    return node


def _line(node: yaml.Node) -> int:
    return int(node.start_mark.line) + 1


def _field(location: Location) -> str:
    field = ""
    for part in location:
        field += f"[{part}]" if isinstance(part, int) else (f".{part}" if field else str(part))
    return field
