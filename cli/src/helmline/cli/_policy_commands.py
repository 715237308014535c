"""`helmline policy check` and `helmline policy explain`: the approval policy, from the CLI.

Both load policies with the approval service's own loader, so a file that passes `check` is
a file the service accepts, and `explain` reasons exactly as the service decides.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from helmline.cli._errors import CliError
from helmline.cli._options import DEFAULT_TENANT, DataDir, SessionId, Tenant
from helmline.cli._running import attempt, nats_url, run_async

if TYPE_CHECKING:
    from helmline.approval import Policy
    from helmline.contracts import Event, SessionState, ToolSpec

INVALID_POLICY = 2
"""Exit status of `check` for a file a person must fix."""

PolicyFile = Annotated[
    Path | None,
    typer.Option(
        "--policy",
        envvar="HELMLINE_POLICY",
        dir_okay=False,
        help="The policy file [env: HELMLINE_POLICY; default: the built-in policy]",
        show_default=False,
    ),
]


def check(
    file: Annotated[Path, typer.Argument(help="The policy file (YAML).", dir_okay=False)],
) -> None:
    """Validate a policy file; exit 2 and name each line at fault when it is invalid."""
    from helmline.cli._display import stdout

    policy = attempt(lambda: load_policy_file(file))
    stdout().print(
        f"{file}: valid, {len(policy)} rules, {policy.hash}", highlight=False, soft_wrap=True
    )


def explain(
    session: SessionId,
    step: Annotated[str, typer.Argument(help="The step id, as the playbook names it.")],
    policy_file: PolicyFile = None,
    tenant: Tenant = DEFAULT_TENANT,
    data_dir: DataDir = None,
) -> None:
    """Which rule decided a step's call, and why.

    Shows the decision recorded in the log (rule, policy hash) and each rule of the policy
    tried in order, with the condition that ruled it out, up to the one that matched.
    """
    from helmline.cli._connection import connect
    from helmline.cli._display import stdout
    from helmline.cli._intents import check_identifiers
    from helmline.cli._policy_explain import explain_step, explanation_lines
    from helmline.contracts import fold
    from helmline.runtime import latest_tool_registry, tools_of

    attempt(lambda: active_policy(policy_file))  # A broken file fails before connecting.
    attempt(lambda: check_identifiers(tenant, session))
    url = nats_url(data_dir)

    async def load() -> tuple[SessionState, list[Event], Mapping[str, ToolSpec]]:
        async with connect(url) as log:
            events = [stored.event for stored in await log.store.read_all(tenant, session)]
            # The service judges MCP tools by the registry the gateways publish.
            tools = tools_of(await latest_tool_registry(log.js))
        if not events:
            raise CliError(f"no session {session} in tenant {tenant!r}")
        return fold(events), events, tools

    state, events, tools = run_async(load())
    policy = attempt(lambda: active_policy(policy_file, tools))
    explanation = attempt(lambda: explain_step(state, events, step, policy, datetime.now(UTC)))
    for line in explanation_lines(explanation):
        stdout().print(line, highlight=False, markup=False, soft_wrap=True)


def load_policy_file(path: Path, tools: Mapping[str, ToolSpec] | None = None) -> Policy:
    """The policy in a file (over `tools`, else the built-in ones), or `CliError` listing
    each problem by line."""
    from helmline.approval import PolicyFileError, load_policy
    from helmline.contracts import BUILTIN_TOOLS_BY_NAME

    try:
        return load_policy(path, tools or BUILTIN_TOOLS_BY_NAME)
    except PolicyFileError as error:
        raise CliError(str(error), exit_code=INVALID_POLICY) from error


def active_policy(path: Path | None, tools: Mapping[str, ToolSpec] | None = None) -> Policy:
    """The policy of a file, or the built-in one, over `tools` (else the built-in ones)."""
    from helmline.approval import default_policy
    from helmline.contracts import BUILTIN_TOOLS_BY_NAME

    tools = tools or BUILTIN_TOOLS_BY_NAME
    return load_policy_file(path, tools) if path is not None else default_policy(tools)
