"""Events stored under an older schema version stay readable, and fold as the newest."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helmline.contracts import (
    Alternative,
    ThoughtRecorded,
    UnknownSchemaVersion,
    decode_event,
    encode_event,
    fold,
)

FIXTURES = Path(__file__).parent / "fixtures"


def test_a_stored_version_1_thought_reads_and_folds_as_version_2() -> None:
    raw = (FIXTURES / "thought.recorded.v1.json").read_bytes()

    event = decode_event(raw)

    assert isinstance(event.data, ThoughtRecorded)
    assert event.schema_version == ThoughtRecorded.SCHEMA_VERSION == 2
    expected = (Alternative(option="count in Python"), Alternative(option="ask a person"))
    assert event.data.alternatives == expected
    (thought,) = fold([event]).thoughts
    assert thought.alternatives == expected
    assert json.loads(encode_event(event))["schemaversion"] == 2


def test_a_future_version_is_refused_with_the_reason() -> None:
    document = json.loads((FIXTURES / "thought.recorded.v1.json").read_text())
    document["schemaversion"] = 3
    with pytest.raises(UnknownSchemaVersion, match="version 3 is newer than this build"):
        decode_event(json.dumps(document))
