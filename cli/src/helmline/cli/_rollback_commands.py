"""`helmline checkpoints`, `rollback` and `fork`: go back to a checkpoint, or start afresh
from one, without losing any of the log."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from helmline.cli._options import DEFAULT_TENANT, DataDir, Json, SessionId, Tenant
from helmline.cli._running import attempt, nats_url, run_async

if TYPE_CHECKING:
    from helmline.contracts import RollbackState, SessionState

WAITING = 3
"""Exit status of `rollback` when an undo call waits for a person's approval."""

Checkpoint = Annotated[
    str,
    typer.Option("--at", help="The checkpoint: its id, or its number in `helmline checkpoints`."),
]


def checkpoints(
    session: SessionId,
    tenant: Tenant = DEFAULT_TENANT,
    as_json: Json = False,
    data_dir: DataDir = None,
) -> None:
    """The session's checkpoints: each with its step, time, and whether it can be undone."""
    from helmline.cli._display import stdout
    from helmline.cli._session_view import checkpoints_table

    state = _load(session, tenant, data_dir)
    if as_json:
        typer.echo(
            json.dumps(
                [
                    {
                        "number": number,
                        "checkpoint_id": c.checkpoint_id,
                        "step_id": c.step_id,
                        "at_seq": c.at_seq,
                        "created_at": c.created_at.isoformat(),
                        "reversible": c.reversible,
                        "compensation": c.compensation,
                        "snapshot_id": c.snapshot_id,
                    }
                    for number, c in enumerate(state.checkpoints, start=1)
                ]
            )
        )
    elif state.checkpoints:
        stdout().print(checkpoints_table(state))
    else:
        stdout().print(f"session {session} has no checkpoints yet")


def rollback(
    session: SessionId,
    to: Annotated[
        str | None,
        typer.Option(
            "--to", help="The checkpoint: its id, or its number in `helmline checkpoints`."
        ),
    ] = None,
    to_step: Annotated[
        str | None,
        typer.Option("--to-step", help="The step whose (latest) checkpoint to return to."),
    ] = None,
    accept_partial: Annotated[
        bool,
        typer.Option(
            "--accept-partial",
            help="Undo what can be undone even if some steps cannot be, and report them.",
        ),
    ] = False,
    reason: Annotated[str, typer.Option("--reason", help="Why, in your words.")] = "",
    tenant: Tenant = DEFAULT_TENANT,
    as_json: Json = False,
    data_dir: DataDir = None,
) -> None:
    """Roll the session back to a checkpoint: its workspace, and its outside effects through
    the tools' inverses, as new events; the log keeps everything that happened.

    Waits for the end and exits 0 rolled back, 1 refused or failed, 3 when an undo call waits
    for approval. The session is then paused: `helmline resume` runs the undone steps again.
    """
    from helmline.cli._connection import connect
    from helmline.cli._rollbacks import choose_checkpoint, follow_rollback, request_rollback

    state = _load(session, tenant, data_dir)
    checkpoint = attempt(lambda: choose_checkpoint(state, to=to, to_step=to_step))
    url = nats_url(data_dir)

    async def roll_back() -> tuple[RollbackState, SessionState]:
        async with connect(url) as log:
            rollback_id = await request_rollback(
                log, tenant, session, checkpoint, accept_partial=accept_partial, reason=reason
            )
            return await follow_rollback(log, tenant, session, rollback_id)

    outcome, now = run_async(roll_back(), interrupted="stopped following; the rollback goes on")
    _report(outcome, now, as_json=as_json)


def _report(outcome: RollbackState, state: SessionState, *, as_json: bool) -> None:
    from helmline.cli._display import stderr, stdout
    from helmline.cli._session_view import decide_command

    if as_json:
        typer.echo(
            json.dumps(
                {
                    "rollback_id": outcome.rollback_id,
                    "checkpoint_id": outcome.checkpoint_id,
                    "status": outcome.status,
                    "reason": outcome.reason,
                    "undone_steps": list(outcome.undone_steps),
                    "not_undone_steps": list(outcome.not_undone_steps),
                    "blocking_steps": list(outcome.blocking_steps),
                }
            )
        )
    match outcome.status:
        case "completed":
            if not as_json:
                undone = ", ".join(outcome.undone_steps) or "nothing"
                stdout().print(
                    f"rolled back to {outcome.checkpoint_id}: undid {undone}", highlight=False
                )
                if outcome.not_undone_steps:
                    stdout().print(
                        f"left as they were: {', '.join(outcome.not_undone_steps)}",
                        highlight=False,
                    )
                stdout().print(
                    f"the session is paused; continue with: helmline resume {state.session_id}",
                    highlight=False,
                )
        case "refused" | "failed":
            if not as_json:
                stderr().print(f"rollback {outcome.status}: {outcome.reason}", highlight=False)
                if outcome.not_undone_steps:
                    stderr().print(
                        f"undone: {', '.join(outcome.undone_steps) or 'nothing'}; not undone: "
                        f"{', '.join(outcome.not_undone_steps)}",
                        highlight=False,
                    )
            raise typer.Exit(1)
        case _:
            if not as_json:
                stderr().print(
                    f"an undo call waits for approval; decide with: {decide_command(state)}",
                    highlight=False,
                )
            raise typer.Exit(WAITING)


ForkPoint = Annotated[
    str | None,
    typer.Option(
        "--at",
        help="The checkpoint: its id, or its number in `helmline checkpoints`; the latest "
        "when left out (to retry what failed after it).",
    ),
]


def fork(
    session: SessionId,
    at: ForkPoint = None,
    tenant: Tenant = DEFAULT_TENANT,
    as_json: Json = False,
    data_dir: DataDir = None,
) -> None:
    """Start a new session from a checkpoint of this one: its workspace as it was there, its
    completed steps not run again. The session forked from is left as it is."""
    from helmline.cli._connection import connect
    from helmline.cli._display import stdout
    from helmline.cli._rollbacks import choose_checkpoint, forkable, latest_checkpoint, start_fork

    state = _load(session, tenant, data_dir)
    checkpoint = attempt(
        lambda: forkable(
            state,
            latest_checkpoint(state)
            if at is None
            else choose_checkpoint(state, to=at, to_step=None),
        )
    )
    url = nats_url(data_dir)

    async def start() -> str:
        async with connect(url) as log:
            return await start_fork(log, tenant, session, checkpoint)

    fork_id = run_async(start())
    if as_json:
        typer.echo(json.dumps({"session_id": fork_id, "tenant": tenant, "fork_of": session}))
    else:
        stdout().print(fork_id, highlight=False)


def _load(session: str, tenant: str, data_dir: Path | None) -> SessionState:
    from helmline.cli._connection import connect
    from helmline.cli._intents import check_identifiers
    from helmline.cli._sessions import load_session

    attempt(lambda: check_identifiers(tenant, session))
    url = nats_url(data_dir)

    async def load() -> SessionState:
        async with connect(url) as log:
            return (await load_session(log, tenant, session)).state

    return run_async(load())
