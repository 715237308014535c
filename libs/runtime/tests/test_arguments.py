"""The argument check's two validators agree: what the fast one passes, jsonschema passes."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from helmline.contracts import BUILTIN_TOOLS, ToolSpec
from helmline.runtime import ArgumentChecker
from helmline.runtime._arguments import _Validators

SCHEMAS: list[dict[str, Any]] = [
    *(tool.parameters for tool in BUILTIN_TOOLS),
    {
        "type": "object",
        "properties": {
            "query": {"type": "string", "minLength": 1, "maxLength": 8, "pattern": "^[a-z]+$"},
            "limit": {"type": "integer", "minimum": 1, "exclusiveMaximum": 100},
            "ratio": {"type": "number", "multipleOf": 0.5},
            "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
            "state": {"enum": ["open", "closed", None]},
            "when": {"type": "string", "format": "date-time"},
            "nested": {
                "type": "object",
                "properties": {"flag": {"type": "boolean"}},
                "required": ["flag"],
                "additionalProperties": False,
            },
        },
        "required": ["query"],
        "additionalProperties": False,
    },
    {"type": "object", "oneOf": [{"required": ["a"]}, {"required": ["b"]}]},
    {"type": "object", "patternProperties": {"^x-": {"type": "integer"}}},
]

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-200, 200)
    | st.floats(-200, 200, allow_nan=False)
    | st.sampled_from(["", "abc", "open", "closed", "x" * 9, "ABC", "2026-11-30T12:00:00Z"]),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(["query", "limit", "ratio", "tags", "state", "when", "nested", "flag"])
            | st.sampled_from(["a", "b", "x-one", "path", "content", "command", "message"]),
            inner,
            max_size=5,
        )
    ),
    max_leaves=12,
)
ARGUMENTS = st.dictionaries(
    st.sampled_from(["query", "limit", "ratio", "tags", "state", "when", "nested", "a", "b"])
    | st.sampled_from(["x-one", "x-two", "path", "content", "command", "message", "timeout_s"]),
    JSON,
    max_size=6,
)


def _tool(schema: dict[str, Any]) -> ToolSpec:
    return ToolSpec(name="t", description="t", parameters=schema, risk="low", executor="mcp")


@settings(max_examples=400, deadline=None)
@given(schema=st.sampled_from(SCHEMAS), arguments=ARGUMENTS)
def test_arguments_pass_exactly_when_jsonschema_finds_no_error(
    schema: dict[str, Any], arguments: dict[str, Any]
) -> None:
    problem = ArgumentChecker().problem(_tool(schema), arguments)
    errors = list(Draft202012Validator(schema).iter_errors(arguments))
    assert (problem is None) == (not errors), (problem, errors)


def test_a_schema_the_fast_validator_cannot_compile_is_judged_by_jsonschema() -> None:
    # A $ref to elsewhere: the fast validator would have to fetch it, and never does.
    tool = _tool(
        {
            "type": "object",
            "properties": {"n": {"type": "integer"}, "far": {"$ref": "https://example.com/s"}},
        }
    )
    checker = ArgumentChecker()
    assert checker.problem(tool, {"n": 1}) is None
    problem = checker.problem(tool, {"n": "one"})
    assert problem is not None
    assert problem.field == "/n"


def test_every_built_in_tool_is_checked_by_the_fast_validator() -> None:
    assert all(_Validators(tool).fast is not None for tool in BUILTIN_TOOLS)


def test_a_refused_value_is_quoted_by_its_first_200_bytes_only() -> None:
    tool = ToolSpec(
        name="search",
        description="",
        parameters={"type": "object", "properties": {"query": {"type": "string", "maxLength": 8}}},
        risk="low",
        executor="gateway",
    )
    problem = ArgumentChecker().problem(tool, {"query": "q" * 5000})

    assert problem is not None
    # repr adds a quote before the value: 199 of its bytes, and how many more there are.
    expected = f"argument /query of search: '{'q' * 199}… (4802 more bytes) is too long"
    assert problem.message == expected
