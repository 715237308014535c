"""Requests made from the API's own OpenAPI document, so that a new route is probed without
anyone listing it: each operation, the path filled with the ids a test gives, and a body
that the operation's schema accepts (the least one: required fields only)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from pydantic import JsonValue

WRITES = frozenset({"post", "put", "patch", "delete"})
_PARAMETER = re.compile(r"\{([^}]+)\}")


@dataclass(frozen=True, slots=True)
class Operation:
    method: str
    path: str
    """As the document spells it, `{name}` for each path parameter."""
    secured: bool
    """Whether the document asks for credentials (else the route is public)."""
    body_schema: dict[str, Any] | None
    event_stream: bool

    @property
    def writes(self) -> bool:
        return self.method in WRITES

    def url(self, ids: dict[str, str]) -> str:
        """The path with each parameter filled from `ids` (one it does not name: `x`)."""
        return _PARAMETER.sub(lambda match: ids.get(match.group(1), "x"), self.path)

    def __str__(self) -> str:
        return f"{self.method.upper()} {self.path}"


def operations(document: dict[str, Any]) -> list[Operation]:
    found = []
    global_security = document.get("security")
    for path, item in document["paths"].items():
        for method, operation in item.items():
            if method not in {"get", "head", *WRITES}:
                continue
            content = operation.get("requestBody", {}).get("content", {})
            schema = content.get("application/json", {}).get("schema")
            ok = operation.get("responses", {}).get("200", {}).get("content", {})
            found.append(
                Operation(
                    method,
                    path,
                    bool(operation.get("security", global_security)),
                    schema,
                    "text/event-stream" in ok,
                )
            )
    return found


def least_body(document: dict[str, Any], schema: dict[str, Any]) -> JsonValue:
    """The smallest value `schema` accepts, as far as simple schemas go: required fields
    only, the first choice of each union and enum, the shortest strings."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[1]
        return least_body(document, document["components"]["schemas"][name])
    for union in ("anyOf", "oneOf"):
        if union in schema:
            choices = [s for s in schema[union] if s.get("type") != "null"]
            return least_body(document, choices[0])
    if "allOf" in schema:
        return least_body(document, schema["allOf"][0])
    if "const" in schema:
        return schema["const"]  # type: ignore[no-any-return]
    if "enum" in schema:
        return schema["enum"][0]  # type: ignore[no-any-return]
    if "default" in schema:
        return schema["default"]  # type: ignore[no-any-return]
    match schema.get("type"):
        case "object":
            properties = schema.get("properties", {})
            return {
                name: least_body(document, properties[name]) for name in schema.get("required", [])
            }
        case "array":
            return [least_body(document, schema["items"])] * schema.get("minItems", 0)
        case "string":
            return "x" * max(1, schema.get("minLength", 1))
        case "integer" | "number":
            return max(1, schema.get("minimum", 1))
        case "boolean":
            return False
    return {}
