"""Playbook files through `helmline run`: every problem is named by file, line and field,
and nothing reaches the log while any remains."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError
from typer.testing import CliRunner, Result

from helmline.cli import app
from helmline.cli._playbook_file import load_playbook
from helmline.contracts import BUILTIN_TOOLS_BY_NAME, EVENTS_STREAM, tenant_filter
from helmline.yamlfile import MAX_BYTES

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "playbooks"

STEP = "  - id: a\n    tool: echo\n    arguments: {message: hi}\n"

CASES = {
    "invalid YAML": (
        "goal: g\nsteps:\n  - id: a\n   tool: echo\n",
        ["4: invalid YAML"],
    ),
    "empty file": ("", ["1: the file is empty"]),
    "not a mapping": ("- goal: g\n", ["1: expected a mapping"]),
    "missing goal": ("steps:\n" + STEP, ["1: missing field 'goal'"]),
    "missing tool": (
        "goal: g\nsteps:\n  - id: a\n    arguments: {}\n",
        ["3: steps[0]: missing field 'tool'"],
    ),
    "wrong type": (
        "goal: g\nsteps:\n" + STEP + "  - id: b\n    tool: echo\n    depends_on: a\n",
        ["8: steps[1].depends_on: Input should be a valid tuple"],
    ),
    "unknown field": (
        "goal: g\nsteps:\n" + STEP + "    retries: 3\n",
        ["6: steps[0].retries: unknown field"],
    ),
    "bad risk": (
        "goal: g\nsteps:\n" + STEP + "    risk: extreme\n",
        ["6: steps[0].risk: Input should be 'low', 'medium', 'high' or 'critical'"],
    ),
    "unknown tool": (
        "goal: g\nsteps:\n" + STEP + "  - id: b\n    tool: format_disk\n",
        ["7: steps[1].tool: unknown tool 'format_disk'"],
    ),
    "dependency cycle": (
        "goal: g\nsteps:\n"
        "  - id: a\n    tool: echo\n    arguments: {message: hi}\n    depends_on: [b]\n"
        "  - id: b\n    tool: echo\n    arguments: {message: hi}\n    depends_on: [a]\n",
        ["6: steps[0].depends_on: dependency cycle among steps: a -> b -> a"],
    ),
    "unknown dependency": (
        "goal: g\nsteps:\n" + STEP + "    depends_on: [a, nowhere]\n",
        ["6: steps[0].depends_on[1]: step 'a' depends on unknown step 'nowhere'"],
    ),
    "duplicate id": (
        "goal: g\nsteps:\n" + STEP + STEP,
        ["6: steps[1].id: step id 'a' is used twice"],
    ),
    "arguments against the tool's schema": (
        "goal: g\nsteps:\n"
        "  - id: w\n    tool: write_file\n    arguments:\n      path: 7\n"
        "  - id: r\n    tool: run_command\n    arguments:\n      command: ls\n      shell: bash\n",
        [
            "6: steps[0].arguments.path: 7 is not of type 'string'",
            "6: steps[0].arguments: 'content' is a required property",
            "11: steps[1].arguments.shell: Additional properties are not allowed",
        ],
    ),
}


async def _run(playbook: Path, nats_url: str, tenant: str) -> Result:
    return await asyncio.to_thread(
        CliRunner().invoke,
        app,
        ["run", "--playbook", str(playbook), "--tenant", tenant],
        env={"HELMLINE_NATS_URL": nats_url},
    )


async def _assert_nothing_appended(js: JetStreamContext, tenant: str) -> None:
    with pytest.raises(NotFoundError):
        await js.get_last_msg(EVENTS_STREAM.name, tenant_filter(tenant))


@pytest.mark.parametrize("case", CASES)
async def test_an_invalid_playbook_is_refused_before_anything_is_appended(
    case: str, tmp_path: Path, nats_url: str, js: JetStreamContext, tenant: str
) -> None:
    text, expected = CASES[case]
    playbook = tmp_path / "playbook.yaml"
    playbook.write_text(text)

    result = await _run(playbook, nats_url, tenant)

    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    for problem in expected:
        assert f"{playbook}:{problem}" in result.stderr
    await _assert_nothing_appended(js, tenant)


async def test_a_playbook_too_large_for_the_log_is_refused_before_anything_is_appended(
    tmp_path: Path, nats_url: str, js: JetStreamContext, tenant: str
) -> None:
    message = "x" * 60_000  # As long as echo takes; twenty of them outgrow an event.
    # Written once and named (a YAML alias) twenty times: a small file, a large playbook.
    steps = "".join(
        f"  - id: s{i}\n    tool: echo\n    arguments: {{message: *m}}\n" for i in range(1, 20)
    )
    first = f"  - id: s0\n    tool: echo\n    arguments: {{message: &m {message}}}\n"
    playbook = tmp_path / "playbook.yaml"
    playbook.write_text(f"goal: g\nsteps:\n{first}{steps}")

    result = await _run(playbook, nats_url, tenant)

    assert result.exit_code == 2, result.output
    assert "is larger than the log takes" in result.stderr
    assert "nothing was appended" in result.stderr
    await _assert_nothing_appended(js, tenant)


def test_a_playbook_file_past_its_size_limit_is_refused_unread(tmp_path: Path) -> None:
    playbook = tmp_path / "playbook.yaml"
    playbook.write_text("goal: g\nsteps:\n" + "# " + "s" * MAX_BYTES)

    result = CliRunner().invoke(app, ["run", "--playbook", str(playbook)])

    assert result.exit_code == 2
    assert (
        f"{playbook}:1: this playbook is larger than the 1048576 bytes read of one "
        f"({MAX_BYTES + 17} bytes)"
    ) in result.stderr
    assert "sss" not in result.stderr
    assert len(result.stderr) < 500


def test_a_missing_playbook_file_is_named(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["run", "--playbook", str(tmp_path / "nope.yaml")])

    assert result.exit_code == 2
    assert f"{tmp_path / 'nope.yaml'}:1: cannot read: " in result.stderr


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_playbook_is_valid(path: Path) -> None:
    playbook = load_playbook(path)

    assert all(step.tool in BUILTIN_TOOLS_BY_NAME for step in playbook.steps)


def test_the_sample_playbook_stops_at_an_approval() -> None:
    playbook = load_playbook(EXAMPLES / "hello.yaml")

    risks = [step.risk or BUILTIN_TOOLS_BY_NAME[step.tool].risk for step in playbook.steps]
    assert "high" in risks
