"""YAML files that people write (playbooks, policies), read so that every problem found in
the data, however late, is reported at the line and field a person must fix."""

from helmline.yamlfile._document import (
    MAX_BYTES,
    Location,
    Problem,
    YamlDocument,
    YamlFileError,
    compose,
    field_of,
    line_of,
    node_at,
    read_bounded,
    read_text,
    validation_problems,
)

__all__ = [
    "MAX_BYTES",
    "Location",
    "Problem",
    "YamlDocument",
    "YamlFileError",
    "compose",
    "field_of",
    "line_of",
    "node_at",
    "read_bounded",
    "read_text",
    "validation_problems",
]
