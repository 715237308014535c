"""The `helmline` command where no stack has to come up: schema export, and the answers
given when nothing runs or an external server is missing."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from helmline.contracts import export_schemas

HELMLINE = Path(sys.executable).parent / "helmline"


def helmline(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("HELMLINE_")}
    return subprocess.run(
        [str(HELMLINE), *args],
        env={**clean, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_schema_export_writes_every_schema_and_removes_stale_ones(tmp_path: Path) -> None:
    (tmp_path / "events").mkdir()
    (tmp_path / "events" / "session.renamed.json").write_text("{}\n")
    (tmp_path / "gone" / "deeper").mkdir(parents=True)
    (tmp_path / "gone" / "deeper" / "old.json").write_text("{}\n")
    (tmp_path / "README.md").write_text("kept\n")

    result = helmline("schema", "export", "--out", str(tmp_path))

    assert result.returncode == 0, result.stderr
    schemas = export_schemas()
    assert f"Wrote {len(schemas)} schemas" in result.stdout
    for name, schema in schemas.items():
        assert (tmp_path / name).read_text() == json.dumps(schema, indent=2, sort_keys=True) + "\n"
    on_disk = {str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*.json")}
    assert on_disk == set(schemas)
    assert not (tmp_path / "gone").exists()
    assert (tmp_path / "README.md").read_text() == "kept\n"


def test_status_and_down_when_nothing_runs(tmp_path: Path) -> None:
    status = helmline("status", "--json", "--data-dir", str(tmp_path))
    assert status.returncode == 3
    assert json.loads(status.stdout)["running"] is False

    down = helmline("down", "--data-dir", str(tmp_path))
    assert down.returncode == 0, down.stderr
    assert "Nothing is running" in down.stdout


def test_up_stops_at_an_external_nats_that_does_not_answer(tmp_path: Path) -> None:
    # Bound but not listening: connections to the port are refused while the test holds it.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        url = f"nats://127.0.0.1:{silent.getsockname()[1]}"
        with_password = url.replace("://", "://admin:hunter2-secret@")
        result = helmline(
            "up", "--data-dir", str(tmp_path), env={"HELMLINE_NATS_URL": with_password}
        )

    assert result.returncode == 1
    assert f"nats at {url} does not answer" in result.stderr
    assert "hunter2-secret" not in result.stdout + result.stderr
    assert not (tmp_path / "stack.json").exists()
    assert not (tmp_path / "postgres").exists()


def test_help_reflows_each_paragraph_and_shows_the_settings_in_brackets() -> None:
    result = helmline("up", "--help", env={"COLUMNS": "200"})

    assert result.returncode == 0, result.stderr
    # One paragraph of the docstring, wrapped in the source, is one line at this width.
    assert (
        "With HELMLINE_NATS_URL or HELMLINE_DATABASE_URL set, those servers are used instead "
        "of starting embedded ones." in result.stdout
    )
    # Square brackets are text, not markup that swallows them.
    assert "[env: HELMLINE_DATA_DIR; default: .helmline]" in result.stdout
    assert "[env: HELMLINE_API_PORT; default: free]" in result.stdout
