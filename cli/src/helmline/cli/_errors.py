"""The CLI's root error: a failure the person at the terminal can act on."""

from __future__ import annotations

INVALID_INPUT = 2
"""Exit status for input a person must fix (usage errors share it)."""


class CliError(Exception):
    """A command failed; the message says what happened and what to do about it."""

    exit_code: int = 1

    def __init__(self, message: str, *, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class StartupError(CliError):
    """A component of the stack did not start or did not become ready in time."""
