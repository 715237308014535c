"""The figures of the adversarial suite: each part records what it measured, and the run
prints them as one JSON line at its end and appends that line to a file, in the shape of
`make bench`'s lines (`bench`, then the figures), for the same tooling to read."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

FORM_VARIABLE = "HELMLINE_SAFETY_FORM"
"""`long` runs every case of each corpus; anything else, the short form CI runs."""
FILE_VARIABLE = "HELMLINE_SAFETY_FIGURES"
"""Where the line is appended; by default `bench-results-safety.jsonl` at the checkout's root."""
DEFAULT_FILE = Path(__file__).resolve().parents[2] / "bench-results-safety.jsonl"

_FIGURES: dict[str, dict[str, Any]] = {}


def long_form() -> bool:
    """Whether this run is the long form (every case of every corpus)."""
    return os.environ.get(FORM_VARIABLE) == "long"


def record(part: str, **figures: Any) -> None:
    """Note figures of one part (secrets, injection, authority, sandbox, api); a part that
    records twice adds to what it recorded (counts are summed)."""
    noted = _FIGURES.setdefault(part, {})
    for name, value in figures.items():
        if isinstance(value, int | float) and not isinstance(value, bool) and name in noted:
            noted[name] += value
        else:
            noted[name] = value


def line() -> str | None:
    """The JSON line of every figure recorded, or None if no part ran."""
    if not _FIGURES:
        return None
    return json.dumps(
        {"bench": "safety", "form": "long" if long_form() else "short", **_FIGURES},
        sort_keys=False,
    )


def write(text: str) -> Path:
    """Append the line to the figures file; its path."""
    path = Path(os.environ.get(FILE_VARIABLE) or DEFAULT_FILE)
    with path.open("a") as file:
        file.write(text + "\n")
    return path
