"""The adversarial suite (`make safety`): its figures, printed as one JSON line at the end."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.safety import figures
from tests.safety.stack import Stack, running_stack


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    text = figures.line()
    if text is not None:
        path = figures.write(text)
        terminalreporter.write_line(f"safety figures (also in {path}):")
        terminalreporter.write_line(text)


@pytest.fixture(scope="package")
async def stack(
    database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Stack]:
    """One stack for the parts that attack it (started once: six processes take a while)."""
    async with running_stack(tmp_path_factory.mktemp("safety-stack"), database_url) as running:
        yield running
