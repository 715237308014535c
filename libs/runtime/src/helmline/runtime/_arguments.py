"""Tool arguments against their tool's JSON Schema: one check for every service that needs
it (the approval service before policy is asked, the gateway before a call is sent), the
check of a playbook's steps before its session starts (the CLI, the API), and of the
arguments a person's decision names (the API at once, the approval service for good)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import jsonschema_rs
from jsonschema import Draft202012Validator
from jsonschema import ValidationError as JsonSchemaError

from helmline.contracts import Playbook, ToolError, ToolSpec, bounded_message, quoted
from helmline.runtime._secrets import has_references, references_shown


class ArgumentChecker:
    """Compiled validators, one per tool, rebuilt when a tool's schema changes."""

    def __init__(self) -> None:
        self._compiled: dict[str, _Validators] = {}

    def problem(self, tool: ToolSpec, arguments: Mapping[str, object]) -> ToolError | None:
        """The first schema violation of a call's arguments, naming the field, or None. A
        reference to a secret stands for a text: it is checked as `[secret:NAME]`."""
        if has_references(arguments):
            arguments = _shown(arguments)
        validators = self._compiled.get(tool.name)
        if validators is None or validators.tool is not tool:
            validators = _Validators(tool)
            self._compiled[tool.name] = validators
        if validators.passes(arguments):
            return None
        errors = sorted(
            validators.explaining.iter_errors(arguments), key=lambda e: list(e.absolute_path)
        )
        if not errors:
            return None
        error = errors[0]
        path = "/" + "/".join(str(part) for part in error.absolute_path)
        return ToolError(
            kind="validation",
            message=f"argument {path} of {tool.name}: {_said(error)}",
            field=path,
            suggestion="fix the argument to match the tool's schema",
        )


def unknown_arguments(tool: ToolSpec, names: Iterable[str]) -> list[str]:
    """Those of `names` that name none of the tool's arguments, sorted."""
    properties = tool.parameters.get("properties", {})
    return sorted(name for name in names if name not in properties)


@dataclass(frozen=True, slots=True)
class StepProblem:
    """Something wrong with the tool or the arguments of a playbook's step."""

    location: tuple[str | int, ...]
    """Where in the playbook: `("steps", 0, "tool")`, `("steps", 1, "arguments", "path")`."""
    message: str


def playbook_problems(playbook: Playbook, tools: Mapping[str, ToolSpec]) -> list[StepProblem]:
    """Each step naming a tool that `tools` lacks, and each of a step's arguments that its
    tool's schema refuses; none for a playbook that can run."""
    problems = []
    for index, step in enumerate(playbook.steps):
        spec = tools.get(step.tool)
        if spec is None:
            known = ", ".join(sorted(tools))
            problems.append(
                StepProblem(
                    ("steps", index, "tool"),
                    f"unknown tool {quoted(step.tool)} (known tools: {known})",
                )
            )
            continue
        arguments = _shown(step.arguments) if has_references(step.arguments) else step.arguments
        for failure in Draft202012Validator(spec.parameters).iter_errors(arguments):
            location = ("steps", index, "arguments", *failure.absolute_path)
            if failure.validator == "additionalProperties" and isinstance(failure.instance, dict):
                # Point at the first unexpected key rather than at the whole mapping.
                allowed = (
                    failure.schema.get("properties", {}) if isinstance(failure.schema, dict) else {}
                )
                extra = next((key for key in failure.instance if key not in allowed), None)
                if extra is not None:
                    location = (*location, extra)
            problems.append(StepProblem(location, f"{_said(failure)} (arguments of {step.tool})"))
    return problems


def _shown(arguments: Mapping[str, object]) -> Mapping[str, object]:
    shown = references_shown(dict(arguments))  # type: ignore[arg-type]
    assert isinstance(shown, dict)
    return shown


def _said(error: JsonSchemaError) -> str:
    """What the schema refused, quoting at most the start of the value it refused."""
    return bounded_message(error.message, error.instance)


@dataclass
class _Validators:
    """A tool's schema compiled twice: jsonschema-rs says at once whether arguments pass
    (a call's check costs ~0.4 us instead of 25-45), jsonschema says what is wrong when they
    do not, in the words the tests and people know, and has the last word then."""

    tool: ToolSpec
    explaining: Draft202012Validator = field(init=False)
    fast: jsonschema_rs.Draft202012Validator | None = field(init=False)

    def __post_init__(self) -> None:
        self.explaining = Draft202012Validator(self.tool.parameters)
        try:
            # Formats only annotate, as for jsonschema; a $ref is never fetched.
            self.fast = jsonschema_rs.Draft202012Validator(
                self.tool.parameters, validate_formats=False, offline=True
            )
        except ValueError:
            self.fast = None  # A schema it cannot compile: jsonschema alone judges.

    def passes(self, arguments: Mapping[str, object]) -> bool:
        """Whether the arguments surely fit (False: ask `explaining`)."""
        if self.fast is None:
            return False
        try:
            return bool(self.fast.is_valid(arguments))
        except ValueError:
            return False  # A value it cannot read (not JSON): jsonschema judges.
