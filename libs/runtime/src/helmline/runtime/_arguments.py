"""Tool arguments against their tool's JSON Schema: one check for every service that needs
it (the approval service before policy is asked, the gateway before a call is sent)."""

from __future__ import annotations

from collections.abc import Mapping

from jsonschema import Draft202012Validator

from helmline.contracts import ToolError, ToolSpec


class ArgumentChecker:
    """Compiled validators, one per tool, rebuilt when a tool's schema changes."""

    def __init__(self) -> None:
        self._compiled: dict[str, tuple[ToolSpec, Draft202012Validator]] = {}

    def problem(self, tool: ToolSpec, arguments: Mapping[str, object]) -> ToolError | None:
        """The first schema violation of a call's arguments, naming the field, or None."""
        known = self._compiled.get(tool.name)
        if known is None or known[0] is not tool:
            known = (tool, Draft202012Validator(tool.parameters))
            self._compiled[tool.name] = known
        errors = sorted(known[1].iter_errors(arguments), key=lambda e: list(e.absolute_path))
        if not errors:
            return None
        error = errors[0]
        field = "/" + "/".join(str(part) for part in error.absolute_path)
        return ToolError(
            kind="validation",
            message=f"argument {field} of {tool.name}: {error.message}",
            field=field,
            suggestion="fix the argument to match the tool's schema",
        )
