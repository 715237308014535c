"""Composing YAML keeps each node's position: how an error in the plain data finds its line."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

Location = tuple[str | int, ...]
"""A path into the document, as pydantic and jsonschema report it: ("steps", 1, "tool")."""


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with a file."""

    line: int
    """1-based line in the file."""
    field: str
    """Where in the document, as `steps[1].arguments.path`; empty for the whole file."""
    message: str
    """What is wrong."""


class YamlFileError(Exception):
    """A file that cannot be used; the message lists every problem, line by line."""

    def __init__(self, source: str, problems: Sequence[Problem], what: str = "file") -> None:
        self.source = source
        self.problems = tuple(sorted(problems, key=lambda problem: problem.line))
        lines = [
            f"{source}:{p.line}: {p.field + ': ' if p.field else ''}{p.message}"
            for p in self.problems
        ]
        super().__init__(f"invalid {what}\n" + "\n".join(lines))


MAX_BYTES = 1024 * 1024
"""The largest file a person writes that is read (playbook, policy, MCP servers file): a
playbook must fit in one event, which holds at most 1 MiB, and the others are smaller."""


def read_bounded(path: Path, *, what: str = "file", max_bytes: int = MAX_BYTES) -> bytes:
    """The file's bytes; a file larger than `max_bytes` is refused having read no more of
    it than that, and so is one that cannot be read, each as a `YamlFileError`."""
    source = str(path)
    try:
        with path.open("rb") as handle:
            content = handle.read(max_bytes + 1)
    except OSError as error:
        raise YamlFileError(source, [Problem(1, "", f"cannot read: {error}")], what) from error
    if len(content) > max_bytes:
        size = f"{path.stat().st_size} bytes" if path.is_file() else "more"
        too_large = f"this {what} is larger than the {max_bytes} bytes read of one ({size})"
        raise YamlFileError(source, [Problem(1, "", too_large)], what)
    return content


def read_text(path: Path, *, what: str = "file", max_bytes: int = MAX_BYTES) -> str:
    """`read_bounded`, decoded from UTF-8 (a file that is not UTF-8 is a `YamlFileError`)."""
    try:
        return read_bounded(path, what=what, max_bytes=max_bytes).decode("utf-8")
    except UnicodeDecodeError as error:
        problem = Problem(1, "", f"not UTF-8 text: {error}")
        raise YamlFileError(str(path), [problem], what) from error


@dataclass(frozen=True, slots=True)
class YamlDocument:
    """A file's top-level mapping, with the node tree that knows where each value stands."""

    root: yaml.Node
    data: dict[str, Any]


def compose(text: str, source: str, *, expected: str) -> YamlDocument:
    """Parse `text`; `expected` says what the top-level mapping should hold, for the error."""
    # libyaml's loader, where PyYAML has it, reads large files many times faster.
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)(text)
    try:
        root = loader.get_single_node()
        if root is None:
            raise YamlFileError(source, [Problem(1, "", "the file is empty")])
        data = loader.construct_document(root)
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        line = mark.line + 1 if mark is not None else 1
        reason = error.problem or error.context or "unreadable"
        raise YamlFileError(source, [Problem(line, "", f"invalid YAML: {reason}")]) from error
    except yaml.YAMLError as error:
        raise YamlFileError(source, [Problem(1, "", f"invalid YAML: {error}")]) from error
    finally:
        loader.dispose()
    if not isinstance(data, dict):
        raise YamlFileError(
            source, [Problem(line_of(root), "", f"expected a mapping with {expected} at the top")]
        )
    return YamlDocument(root, data)


def node_at(root: yaml.Node, location: Location) -> yaml.Node:
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


def line_of(node: yaml.Node) -> int:
    """The 1-based line a node starts on."""
    return int(node.start_mark.line) + 1


def field_of(location: Location) -> str:
    """A location as people read it: `rules[2].arguments.path`."""
    field = ""
    for part in location:
        field += f"[{part}]" if isinstance(part, int) else (f".{part}" if field else str(part))
    return field


def validation_problems(
    root: yaml.Node,
    error: ValidationError,
    *,
    place_whole_document_error: Callable[[str], Location] = lambda message: (),
) -> list[Problem]:
    """What pydantic found wrong with a composed document, each at its line and field.

    `place_whole_document_error` points an error of a check over the whole document (a model
    validator's, which pydantic reports at the root) at the part a person must fix.
    """
    problems = []
    details = error.errors(include_url=False)
    for detail in details:
        # Union members and wrappers add their own names (`function-before[...]`) to the
        # location; field names never hold brackets, so keep only the document's parts.
        location: Location = tuple(
            part for part in detail["loc"] if isinstance(part, int) or "[" not in part
        )
        if detail["type"] == "too_short" and any(
            other["loc"][: len(detail["loc"])] == detail["loc"]
            and len(other["loc"]) > len(detail["loc"])
            for other in details
        ):
            continue  # A list whose items are invalid is also counted short: say it once.
        message = detail["msg"].removeprefix("Value error, ")
        match detail["type"]:
            case "missing":
                *parent, name = location
                location = tuple(parent)
                message = f"missing field {name!r}"
            case "extra_forbidden":
                message = "unknown field"
            case "value_error" if not location:
                location = place_whole_document_error(message)
        problems.append(Problem(line_of(node_at(root, location)), field_of(location), message))
    return problems
