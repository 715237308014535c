"""The session commands: start a playbook, watch, inspect and steer sessions.

Each turns its options into one call on the running stack's event log. Like the rest of the
CLI, the heavy modules (the NATS client, rich, YAML) are imported inside the command that
uses them, so `helmline serve` does not load them.
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import typer

from helmline.cli._errors import CliError
from helmline.cli._options import DEFAULT_TENANT, DataDir, Json, SessionId, Tenant, lasting
from helmline.cli._running import attempt, fail, nats_url, run_async

if TYPE_CHECKING:
    from helmline.cli._intents import Control, PermissionGrant, StandingGrant
    from helmline.cli._sessions import ArgumentChange
    from helmline.contracts import ArgumentCondition, SessionState

Comment = Annotated[str, typer.Option("--comment", "-m", help="Why, in your words.")]
Reason = Annotated[str, typer.Option("--reason", help="Why, in your words.")]
Request = Annotated[
    str | None, typer.Option("--request", "-r", help="The approval request to decide on.")
]
Every = Annotated[bool, typer.Option("--all", help="Decide every pending request.")]


Acting = Annotated[
    str | None,
    typer.Option("--as", help="Who acts [default: your login name].", show_default=False),
]
Roles = Annotated[
    list[str],
    typer.Option(
        "--role",
        help="A role you act in, or a permission a tool requires; repeat it "
        "[default: operator and approver].",
    ),
]


def run(
    goal: Annotated[
        str | None,
        typer.Argument(
            help="A goal in plain language, for the planner's model.", show_default=False
        ),
    ] = None,
    playbook: Annotated[
        Path | None,
        typer.Option(
            "--playbook", "-p", help="The playbook file (YAML).", dir_okay=False, show_default=False
        ),
    ] = None,
    mode: Annotated[
        Literal["plan", "act"],
        typer.Option(
            "--mode",
            envvar="HELMLINE_PLANNER_MODE",
            help="For a goal: plan then execute, or act one tool call at a time.",
        ),
    ] = "plan",
    tenant: Tenant = DEFAULT_TENANT,
    wait: Annotated[
        bool,
        typer.Option(
            "--wait",
            help="Follow the session until it ends or waits for a person; exit 0 completed, "
            "1 failed, 2 cancelled, 3 waiting for approval.",
        ),
    ] = False,
    acting: Acting = None,
    roles: Roles = [],  # noqa: B006 - Typer reads the default; it is never mutated
    as_json: Json = False,
    data_dir: DataDir = None,
) -> None:
    """Start a session for a goal (the planner's model plans it) or from a playbook, and
    print its id.

    A playbook is checked first (YAML, fields, tools, arguments, dependencies); nothing is
    started if anything is wrong with it (exit 2).
    """
    from helmline.cli._connection import connect
    from helmline.cli._display import stderr, stdout
    from helmline.cli._intents import Goal, check_identifiers, current_actor
    from helmline.cli._playbook_file import load_playbook
    from helmline.cli._session_view import decide_command
    from helmline.cli._sessions import EXIT_CODES, needs_a_person, start_session, watch
    from helmline.cli._tool_registry import known_tools
    from helmline.cli._watch import SessionProgress
    from helmline.contracts import Playbook

    if (goal is None) == (playbook is None):
        fail(
            CliError('give a goal (helmline run "GOAL") or --playbook FILE, not both', exit_code=2)
        )
    # MCP tools are known from the running stack's registry.
    loaded: Playbook | Goal = (
        attempt(lambda: load_playbook(playbook, known_tools(data_dir)))
        if playbook is not None
        else Goal(text=goal or "", mode=mode)
    )
    attempt(lambda: check_identifiers(tenant, "check"))
    requester = attempt(lambda: current_actor(acting, tuple(roles)))
    url = nats_url(data_dir)

    async def start_and_follow() -> tuple[str, SessionState | None]:
        async with connect(url) as log:
            session_id, _ = await start_session(log, loaded, tenant=tenant, actor=requester)
            if not wait:
                return session_id, None
            if not as_json:
                # The id first, so a person can act on it while the session runs.
                stdout().print(session_id, highlight=False)
            with SessionProgress(stderr()) as progress:
                return session_id, await watch(log, tenant, session_id, on_change=progress.update)

    session_id, final = run_async(
        start_and_follow(), interrupted="stopped following; the session goes on"
    )
    if final is None:
        if as_json:
            typer.echo(json.dumps({"session_id": session_id, "tenant": tenant}))
        else:
            stdout().print(session_id, highlight=False)
        return
    waiting = needs_a_person(final)
    if as_json:
        typer.echo(
            json.dumps(
                {
                    "session_id": session_id,
                    "tenant": tenant,
                    "status": final.status,
                    "pending_approvals": [a.request_id for a in final.pending_approvals],
                }
            )
        )
    elif waiting:
        stderr().print(
            f"waiting for approval; decide with: {decide_command(final)}", highlight=False
        )
    raise typer.Exit(EXIT_CODES["waiting" if waiting else final.status])


def sessions(
    tenant: Tenant = DEFAULT_TENANT,
    limit: Annotated[
        int,
        typer.Option(
            "--limit",
            "-n",
            min=0,
            help="List the sessions started last, this many (each is folded from its log); "
            "0 lists them all.",
        ),
    ] = 100,
    as_json: Json = False,
    data_dir: DataDir = None,
) -> None:
    """List the tenant's sessions with their status, oldest first."""
    from helmline.cli._display import stdout
    from helmline.cli._session_view import render_sessions, sessions_json

    states, started = _tenant_sessions(tenant, data_dir, latest=limit or None)
    if as_json:
        typer.echo(sessions_json(states))
    else:
        render_sessions(stdout(), states, tenant=tenant)
    if len(states) < started:
        typer.echo(
            f"the {len(states)} started last of {started} sessions; --limit 0 lists them all",
            err=True,
        )


def approvals(
    tenant: Tenant = DEFAULT_TENANT, as_json: Json = False, data_dir: DataDir = None
) -> None:
    """The approval queue: every request waiting for a person in the tenant's sessions, the
    soonest to expire first."""
    from helmline.cli._display import stdout
    from helmline.cli._session_view import (
        approval_queue,
        approval_queue_json,
        render_approval_queue,
    )

    # Only sessions not ended can wait for a person.
    queue = approval_queue(_tenant_sessions(tenant, data_dir, open_only=True)[0])
    if as_json:
        typer.echo(approval_queue_json(queue))
    else:
        render_approval_queue(stdout(), queue, tenant=tenant)


def _tenant_sessions(
    tenant: str, data_dir: Path | None, *, latest: int | None = None, open_only: bool = False
) -> tuple[list[SessionState], int]:
    """The tenant's sessions (the `latest` started last, or all, or those not ended), each
    folded from its log, oldest first; and how many the tenant has."""
    from helmline.cli._connection import connect
    from helmline.cli._intents import check_identifiers
    from helmline.cli._sessions import list_sessions

    attempt(lambda: check_identifiers(tenant, "check"))
    url = nats_url(data_dir)

    async def load() -> tuple[list[SessionState], int]:
        async with connect(url) as log:
            return await list_sessions(log, tenant, latest=latest, open_only=open_only)

    return run_async(load())


def show(
    session: SessionId,
    tenant: Tenant = DEFAULT_TENANT,
    at_seq: Annotated[
        int | None,
        typer.Option("--at-seq", min=1, help="The state as it was after this stream sequence."),
    ] = None,
    as_json: Json = False,
    data_dir: DataDir = None,
) -> None:
    """A session's state folded from its log: status, plan, steps, approvals, checkpoints.

    With --json, the whole state exactly as folding the log yields it; with --at-seq, as it
    was after that event (time travel: `helmline events` shows each event's sequence).
    """
    from helmline.cli._connection import connect
    from helmline.cli._display import stdout
    from helmline.cli._intents import check_identifiers
    from helmline.cli._session_view import render_session, state_json
    from helmline.cli._sessions import load_session
    from helmline.runtime import SessionSnapshot

    attempt(lambda: check_identifiers(tenant, session))
    url = nats_url(data_dir)

    async def load() -> SessionSnapshot:
        async with connect(url) as log:
            return await load_session(log, tenant, session, up_to_seq=at_seq)

    state = run_async(load()).state
    if as_json:
        typer.echo(state_json(state))
    else:
        render_session(stdout(), state)


def events(
    session: SessionId,
    tenant: Tenant = DEFAULT_TENANT,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new events until Ctrl-C.")
    ] = False,
    until_end: Annotated[
        bool, typer.Option("--until-end", help="With --follow: stop once the session has ended.")
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="One CloudEvents JSON object per line.")
    ] = False,
    data_dir: DataDir = None,
) -> None:
    """A session's events in log order, one per line."""
    from helmline.cli._connection import connect
    from helmline.cli._follow import following
    from helmline.cli._intents import check_identifiers
    from helmline.cli._session_view import event_json, event_line
    from helmline.contracts import SessionFold
    from helmline.runtime import StoredEvent

    attempt(lambda: check_identifiers(tenant, session))
    url = nats_url(data_dir)
    folding = SessionFold()

    def emit(stored: StoredEvent) -> None:
        folding.apply(stored.event)
        # Flushed per event: a follower piped into another program sees each as it comes.
        sys.stdout.write((event_json(stored.event) if as_json else event_line(stored)) + "\n")
        sys.stdout.flush()

    async def print_events() -> None:
        async with connect(url) as log:
            existing = await log.store.read_all(tenant, session)
            if not existing:
                raise CliError(f"no session {session} in tenant {tenant!r}")
            for stored in existing:
                emit(stored)
            if not follow or (until_end and folding.terminal):
                return
            async with following(log.js, tenant, session, after_seq=existing[-1].seq) as feed:
                async for stored in feed:
                    emit(stored)
                    if until_end and folding.terminal:
                        return

    run_async(print_events(), interrupted="")


Answer = Annotated[
    bool,
    typer.Option(
        "--wait/--no-wait", help="Wait for the approval service's answer, or only submit."
    ),
]


def approve(
    session: SessionId,
    request: Request = None,
    every: Every = False,
    comment: Comment = "",
    arguments: Annotated[
        str | None,
        typer.Option(
            "--arguments",
            help="Run the call with these arguments instead (a JSON object); "
            "they are checked against the tool's schema and the policy.",
            show_default=False,
        ),
    ] = None,
    set_fields: Annotated[
        list[str],
        typer.Option(
            "--set",
            help="Change one argument, FIELD=VALUE (VALUE is JSON, or else text); repeat it.",
        ),
    ] = [],  # noqa: B006 - Typer reads the default; it is never mutated
    similar: Annotated[
        int | None,
        typer.Option(
            "--similar",
            min=1,
            max=1000,
            help="Also approve up to N later calls of the same tool that the same policy "
            "rule sends to approval in this session.",
            show_default=False,
        ),
    ] = None,
    similar_for: Annotated[
        str | None,
        typer.Option(
            "--similar-for",
            help="With --similar: how long that standing grant holds, such as 30m or 4h "
            "[default: 1h].",
            show_default=False,
        ),
    ] = None,
    similar_where: Annotated[
        list[str],
        typer.Option(
            "--similar-where",
            help="With --similar: only later calls whose argument matches, NAME=GLOB (a path "
            "glob) or NAME~REGEX; repeat it for more arguments.",
        ),
    ] = [],  # noqa: B006
    grant_for: Annotated[
        str | None,
        typer.Option(
            "--for",
            help="A permission request: grant it for the step that asked, or for the "
            "session (every later call needing it) [default: step].",
            show_default=False,
        ),
    ] = None,
    expires_in: Annotated[
        str | None,
        typer.Option(
            "--expires-in",
            help="A permission request: how long the grant holds, such as 30m or 4h "
            "[default: the policy's grant_expires_in].",
            show_default=False,
        ),
    ] = None,
    acting: Acting = None,
    roles: Roles = [],  # noqa: B006
    wait: Answer = True,
    tenant: Tenant = DEFAULT_TENANT,
    data_dir: DataDir = None,
) -> None:
    """Grant a pending approval request (the only one, the one named, or --all); a
    permission request for the step or the session (--for), until a time (--expires-in).

    Waits for the approval service's answer: granted, counted towards a quorum, or refused
    with the reason (exit status 1).
    """
    change = _argument_change(arguments, set_fields)
    standing = _standing_grant(similar, similar_for, similar_where)
    grant = _permission_grant(grant_for, expires_in)
    identity = (acting, tuple(roles))
    _decide(
        "grant",
        session,
        request,
        every,
        comment,
        tenant,
        data_dir,
        identity,
        wait=wait,
        change=change,
        similar=standing,
        grant=grant,
    )


def deny(
    session: SessionId,
    request: Request = None,
    every: Every = False,
    comment: Comment = "",
    acting: Acting = None,
    roles: Roles = [],  # noqa: B006
    wait: Answer = True,
    tenant: Tenant = DEFAULT_TENANT,
    data_dir: DataDir = None,
) -> None:
    """Deny a pending approval request (the only one, the one named, or --all)."""
    identity = (acting, tuple(roles))
    _decide("deny", session, request, every, comment, tenant, data_dir, identity, wait=wait)


def pause(
    session: SessionId,
    reason: Reason = "",
    tenant: Tenant = DEFAULT_TENANT,
    data_dir: DataDir = None,
) -> None:
    """Ask that no new step start; a running step finishes."""
    _control("pause", session, reason, tenant, data_dir)


def resume(session: SessionId, tenant: Tenant = DEFAULT_TENANT, data_dir: DataDir = None) -> None:
    """Ask a paused session to continue."""
    _control("resume", session, "", tenant, data_dir)


def cancel(
    session: SessionId,
    reason: Reason = "",
    tenant: Tenant = DEFAULT_TENANT,
    data_dir: DataDir = None,
) -> None:
    """Ask that the session stop for good; a running command is killed."""
    _control("cancel", session, reason, tenant, data_dir)


def _argument_change(arguments: str | None, set_fields: list[str]) -> ArgumentChange | None:
    from helmline.cli._sessions import ArgumentChange

    if arguments is None and not set_fields:
        return None
    replace = None
    if arguments is not None:
        try:
            replace = json.loads(arguments)
        except json.JSONDecodeError as error:
            fail(CliError(f"--arguments is not JSON: {error}", exit_code=2))
        if not isinstance(replace, dict):
            fail(CliError("--arguments must be a JSON object", exit_code=2))
    fields: dict[str, Any] = {}
    for assignment in set_fields:
        name, equals, text = assignment.partition("=")
        if not equals or not name:
            fail(CliError(f"--set {assignment!r}: write FIELD=VALUE", exit_code=2))
        try:
            fields[name] = json.loads(text)
        except json.JSONDecodeError:
            fields[name] = text
    return ArgumentChange(replace, fields)


def _standing_grant(
    similar: int | None, similar_for: str | None, similar_where: list[str]
) -> StandingGrant | None:
    from helmline.cli._intents import StandingGrant

    if similar is None:
        if similar_for is not None or similar_where:
            fail(CliError("--similar-for and --similar-where go with --similar N", exit_code=2))
        return None
    until = None
    if similar_for is not None:
        until = datetime.now(UTC) + lasting("--similar-for", similar_for)
    return StandingGrant(similar, until, _argument_conditions(similar_where) or None)


def _permission_grant(grant_for: str | None, expires_in: str | None) -> PermissionGrant | None:
    from helmline.cli._intents import PermissionGrant

    if grant_for is None and expires_in is None:
        return None
    if grant_for not in (None, "step", "session"):
        fail(CliError(f"--for {grant_for!r}: write step or session", exit_code=2))
    until = None
    if expires_in is not None:
        until = datetime.now(UTC) + lasting("--expires-in", expires_in)
    return PermissionGrant("session" if grant_for == "session" else "step", until)


def _argument_conditions(written: list[str]) -> dict[str, ArgumentCondition]:
    """`NAME=GLOB` and `NAME~REGEX`, as conditions by argument name (both on one name: both
    must hold)."""
    from pydantic import ValidationError

    from helmline.contracts import ArgumentCondition

    tests: dict[str, dict[str, str]] = {}
    for condition in written:
        # Whichever sign comes first ends the name (a glob may hold `~`, a regex `=`).
        signs = [at for at in (condition.find("="), condition.find("~")) if at > 0]
        at = min(signs, default=-1)
        name, value = condition[:at].strip(), condition[at + 1 :]
        if at < 0 or not name or not value:
            fail(
                CliError(
                    f"--similar-where {condition!r}: write NAME=GLOB or NAME~REGEX", exit_code=2
                )
            )
        tests.setdefault(name, {})["glob" if condition[at] == "=" else "regex"] = value
    try:
        return {name: ArgumentCondition.model_validate(test) for name, test in tests.items()}
    except ValidationError as error:
        problem = error.errors()[0]["msg"].removeprefix("Value error, ")
        fail(CliError(f"--similar-where: {problem}", exit_code=2))


def _decide(
    decision: Literal["grant", "deny"],
    session: str,
    request: str | None,
    every: bool,
    comment: str,
    tenant: str,
    data_dir: Path | None,
    identity: tuple[str | None, tuple[str, ...]],
    *,
    wait: bool,
    change: ArgumentChange | None = None,
    similar: StandingGrant | None = None,
    grant: PermissionGrant | None = None,
) -> None:
    from helmline.cli._connection import connect
    from helmline.cli._display import stdout
    from helmline.cli._intents import check_identifiers, current_actor
    from helmline.cli._sessions import ANSWER_TIMEOUT_S, Decided, decide
    from helmline.contracts import (
        ApprovalDecisionRefused,
        ApprovalDenied,
        ApprovalGranted,
        ApprovalVoteCounted,
    )

    if request is not None and every:
        fail(CliError("give either --request or --all, not both", exit_code=2))
    attempt(lambda: check_identifiers(tenant, session))
    actor = attempt(lambda: current_actor(*identity))
    url = nats_url(data_dir)

    async def submit() -> list[Decided]:
        async with connect(url) as log:
            return await decide(
                log,
                tenant,
                session,
                decision=decision,
                request_id=request,
                every=every,
                comment=comment,
                actor=actor,
                arguments=change,
                similar=similar,
                grant=grant,
                wait_s=ANSWER_TIMEOUT_S if wait else 0,
            )

    refused = False
    for decided in run_async(submit()):
        asked = decided.request
        what = f"step {asked.step_id} ({asked.tool})" if asked.step_id else "the plan"
        match decided.answer:
            case ApprovalGranted(grant_scope=str(scope), grant_until=until):
                needs = ", ".join(f"{need.kind} {need.name}" for need in asked.permissions)
                ends = f" until {until:%Y-%m-%d %H:%M:%S} UTC" if until else ""
                stdout().print(
                    f"granted {asked.request_id}: {needs} for the {scope}{ends} ({what})",
                    highlight=False,
                )
            case ApprovalGranted():
                stdout().print(f"approved {asked.request_id}: {what}", highlight=False)
            case ApprovalDenied():
                stdout().print(f"denied {asked.request_id}: {what}", highlight=False)
            case ApprovalVoteCounted(grants=grants, quorum=quorum):
                stdout().print(
                    f"grant counted for {asked.request_id}: {grants} of {quorum} approvers",
                    highlight=False,
                )
            case ApprovalDecisionRefused(reason=reason):
                refused = True
                typer.echo(f"error: {asked.request_id} refused: {reason}", err=True)
            case None if not wait:
                verb = "grant" if decision == "grant" else "denial"
                stdout().print(f"submitted {verb} of {asked.request_id}: {what}", highlight=False)
            case None:
                typer.echo(
                    f"warning: decision on {asked.request_id} recorded, but the approval "
                    f"service has not answered within {ANSWER_TIMEOUT_S:g} s (is it running?)",
                    err=True,
                )
    if refused:
        raise typer.Exit(1)


def _control(
    control: Control, session: str, reason: str, tenant: str, data_dir: Path | None
) -> None:
    from helmline.cli._connection import connect
    from helmline.cli._display import stdout
    from helmline.cli._intents import check_identifiers
    from helmline.cli._sessions import request_control

    attempt(lambda: check_identifiers(tenant, session))
    url = nats_url(data_dir)

    async def submit() -> None:
        async with connect(url) as log:
            await request_control(log, control, tenant, session, reason=reason)

    run_async(submit())
    stdout().print(f"{control} requested for session {session}", highlight=False)
