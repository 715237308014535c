"""The tool catalogue's contract: inverses point into the original call."""

import pytest
from pydantic import ValidationError

from helmline.contracts import BUILTIN_TOOLS, ToolInverse, ToolSpec


def test_an_inverse_maps_arguments_from_the_original_call() -> None:
    spec = ToolSpec(
        name="tickets:create",
        description="Open a ticket.",
        parameters={"type": "object"},
        risk="medium",
        executor="gateway",
        inverse=ToolInverse(tool="tickets:delete", arguments={"id": "/result/id"}),
    )

    assert spec.inverse is not None
    assert spec.inverse.arguments == {"id": "/result/id"}
    assert not spec.idempotent


@pytest.mark.parametrize("pointer", ["result/id", "/output/id", "/result/~2", ""])
def test_an_inverse_argument_must_point_into_the_arguments_or_the_result(pointer: str) -> None:
    with pytest.raises(ValidationError, match=r"arguments\.id"):
        ToolInverse(tool="tickets:delete", arguments={"id": pointer})


def test_built_in_tools_declare_no_inverse_since_the_workspace_is_restored_from_snapshots() -> None:
    assert all(tool.inverse is None for tool in BUILTIN_TOOLS)


def test_an_inverse_resolves_its_arguments_from_the_call_and_its_result() -> None:
    inverse = ToolInverse(
        tool="tickets:delete",
        arguments={
            "id": "/result/ticket/id",
            "queue": "/arguments/queue",
            "first": "/result/tags/0",
        },
    )

    resolved = inverse.resolve({"queue": "ops"}, {"ticket": {"id": 7}, "tags": ["a", "b"]})

    assert resolved == {"id": 7, "queue": "ops", "first": "a"}


def test_an_inverse_names_the_pointer_that_finds_nothing() -> None:
    inverse = ToolInverse(tool="tickets:delete", arguments={"id": "/result/id"})

    with pytest.raises(LookupError, match="/result/id"):
        inverse.resolve({}, {"name": "no id here"})
