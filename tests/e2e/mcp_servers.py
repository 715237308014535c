"""Real MCP servers for the end-to-end tests: the npm `server-everything` over Streamable
HTTP, started by the tests; the PyPI servers run over stdio by the gateway itself."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from helmline.tool_gateway.testing import EVERYTHING_SCRIPT, server_everything

ROOT = Path(__file__).resolve().parents[2]


@contextmanager
def everything(log_dir: Path) -> Iterator[str]:
    """`server-everything` over Streamable HTTP; yields its MCP URL."""
    with server_everything(ROOT / EVERYTHING_SCRIPT, log_dir) as url:
        yield url


def git_repository(path: Path) -> Path:
    """A git repository with one commit."""
    path.mkdir(parents=True, exist_ok=True)
    environment = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.com",
    }
    (path / "README.md").write_text("hello\n")
    for command in (["init", "-q"], ["add", "README.md"], ["commit", "-q", "-m", "first"]):
        subprocess.run(["git", *command], cwd=path, env=environment, check=True)
    return path
