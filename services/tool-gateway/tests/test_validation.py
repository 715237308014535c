"""Arguments are checked against the tool's JSON Schema, and the error names the field."""

from __future__ import annotations

import pytest

from helmline.contracts import BUILTIN_TOOLS_BY_NAME, ToolCallAuthorized, ToolCallFailed, ToolSpec
from helmline.runtime import ArgumentChecker
from helmline.tool_gateway._calls import MAX_ARGUMENTS_BYTES, RunOnServer, route

SEARCH = ToolSpec(
    name="tickets__search",
    description="Search tickets.",
    parameters={
        "type": "object",
        "properties": {
            "query": {"type": "string", "maxLength": 20},
            "limit": {"type": "integer", "minimum": 1},
            "filters": {"type": "object", "properties": {"state": {"enum": ["open", "closed"]}}},
        },
        "required": ["query"],
        "additionalProperties": False,
    },
    risk="low",
    executor="mcp",
    server="tickets",
    remote_name="search",
)
TOOLS = {**BUILTIN_TOOLS_BY_NAME, SEARCH.name: SEARCH}


def _call(tool: str, **arguments: object) -> ToolCallAuthorized:
    return ToolCallAuthorized.model_validate(
        {"call_id": "c1", "step_id": "s1", "tool": tool, "arguments": arguments, "risk": "low"}
    )


@pytest.mark.parametrize(
    ("arguments", "field", "words"),
    [
        ({"query": "x", "colour": "red"}, "/", "Additional properties"),
        ({"query": 7}, "/query", "is not of type 'string'"),
        ({"query": "x" * 21}, "/query", "is too long"),
        ({"query": "x", "limit": 0}, "/limit", "less than the minimum"),
        ({"query": "x", "filters": {"state": "lost"}}, "/filters/state", "is not one of"),
        ({}, "/", "'query' is a required property"),
    ],
)
def test_a_call_that_does_not_fit_the_schema_fails_naming_the_field(
    arguments: dict[str, object], field: str, words: str
) -> None:
    outcome = route(_call(SEARCH.name, **arguments), TOOLS, ArgumentChecker())
    assert isinstance(outcome, ToolCallFailed)
    assert outcome.error.kind == "validation"
    assert outcome.error.field == field
    assert words in outcome.error.message
    assert not outcome.error.retryable
    assert outcome.error.suggestion


def test_an_oversized_payload_is_refused_before_its_schema_is_read() -> None:
    outcome = route(
        _call(SEARCH.name, query="x"),
        TOOLS,
        ArgumentChecker(),
        arguments_bytes=MAX_ARGUMENTS_BYTES + 1,
    )
    assert isinstance(outcome, ToolCallFailed)
    assert outcome.error.kind == "validation"
    assert "more than the" in outcome.error.message


def test_an_unknown_tool_fails_with_the_known_ones_suggested() -> None:
    outcome = route(_call("nope"), TOOLS, ArgumentChecker())
    assert isinstance(outcome, ToolCallFailed)
    assert outcome.error.kind == "not_found"
    assert outcome.error.suggestion is not None
    assert "tickets__search" in outcome.error.suggestion


def test_a_valid_mcp_call_goes_to_its_server() -> None:
    assert route(_call(SEARCH.name, query="x"), TOOLS, ArgumentChecker()) == RunOnServer(SEARCH)
