"""Upcasters of the catalogue: each turns one schema version of a payload into the next.

Registered on import of `helmline.contracts`, so every decoder reads the whole history.
"""

from __future__ import annotations

from typing import Any

from helmline.contracts._catalogue import ThoughtRecorded
from helmline.contracts._versions import UPCASTERS


@UPCASTERS.register(ThoughtRecorded.TYPE, from_version=1)
def thought_alternatives_with_reasons(data: dict[str, Any]) -> dict[str, Any]:
    """thought.recorded 1 → 2: bare alternative strings become options without a reason."""
    alternatives = data.get("alternatives") or []
    return {**data, "alternatives": [{"option": option, "reason": ""} for option in alternatives]}
