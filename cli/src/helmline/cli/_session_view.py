"""How sessions and their events look: rich tables for people, JSON for programs."""

from __future__ import annotations

import itertools
import json
from datetime import datetime

from pydantic import JsonValue, TypeAdapter
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from helmline.contracts import (
    ApprovalState,
    CheckpointState,
    Event,
    SessionState,
    StepState,
    encode_event,
)
from helmline.runtime import StoredEvent

_STATE_JSON: TypeAdapter[SessionState] = TypeAdapter(SessionState)

SESSION_STYLE = {
    "pending": "dim",
    "planning": "cyan",
    "executing": "cyan",
    "waiting": "yellow",
    "paused": "yellow",
    "completed": "green",
    "failed": "red",
    "cancelled": "magenta",
}
STEP_STYLE = {
    "pending": "dim",
    "scheduled": "cyan",
    "authorized": "cyan",
    "running": "bold cyan",
    "succeeded": "green",
    "failed": "red",
    "denied": "red",
    "skipped": "dim",
    "undone": "magenta",
}
CELL_WIDTH = 60


def state_json(state: SessionState) -> str:
    """The whole folded state, exactly as the contracts define it."""
    return _STATE_JSON.dump_json(state).decode()


def event_json(event: Event) -> str:
    """The event as CloudEvents structured JSON, on one line."""
    return encode_event(event).decode()


def sessions_json(states: list[SessionState]) -> str:
    return json.dumps([_summary(state) for state in states], indent=2)


def _summary(state: SessionState) -> dict[str, JsonValue]:
    return {
        "session_id": state.session_id,
        "tenant": state.tenant,
        "status": state.status,
        "goal": state.goal,
        "steps": len(state.steps),
        "steps_succeeded": sum(1 for step in state.steps.values() if step.status == "succeeded"),
        "pending_approvals": [request.request_id for request in state.pending_approvals],
        "started_at": _iso(state.started_at),
        "ended_at": _iso(state.ended_at),
    }


def event_line(stored: StoredEvent) -> str:
    """One readable line: sequence, time, type, and the payload's fields in brief."""
    event = stored.event
    fields = event.data.model_dump(mode="json", exclude_defaults=True)
    brief = " ".join(f"{name}={_brief(value, 40)}" for name, value in fields.items())
    return f"{stored.seq:>7}  {event.time:%H:%M:%S.%f}"[:-3] + f"  {event.type:<28} {brief}"


def render_sessions(console: Console, states: list[SessionState], *, tenant: str) -> None:
    if not states:
        console.print(f"No sessions in tenant {tenant!r}. Start one with `helmline run`.")
        return
    table = Table(title=f"sessions of tenant {tenant!r}", title_justify="left")
    table.add_column("session", no_wrap=True)
    table.add_column("status", no_wrap=True)
    table.add_column("steps", justify="right", no_wrap=True)
    table.add_column("waiting", justify="right", no_wrap=True)
    table.add_column("started", no_wrap=True)
    table.add_column("goal")
    for state in states:
        done = sum(1 for step in state.steps.values() if step.status == "succeeded")
        table.add_row(
            state.session_id,
            _status(state),
            f"{done}/{len(state.steps)}",
            str(len(state.pending_approvals) or ""),
            _time(state.started_at),
            Text(state.goal),
        )
    console.print(table)


def render_session(console: Console, state: SessionState) -> None:
    console.print(session_panel(state, full=True))
    pending = state.pending_approvals
    if pending:
        console.print(approvals_table(pending))
        console.print(f"decide with: {decide_command(state)}  (or helmline deny ...)")
    standing = [a for a in state.approvals.values() if a.status == "granted" and a.similar_limit]
    if standing:
        console.print(standing_grants_table(standing))
    granted = [a for a in state.approvals.values() if a.status == "granted" and a.permissions]
    if granted:
        console.print(permission_grants_table(granted))
    if state.checkpoints:
        console.print(checkpoints_table(state))


def checkpoints_table(state: SessionState) -> Table:
    """The session's checkpoints, numbered as `rollback --to` and `fork --at` accept them."""
    table = Table(title="checkpoints", title_justify="left")
    for column in ("#", "checkpoint", "step", "seq", "reversible", "files", "snapshot", "at"):
        table.add_column(column, no_wrap=column != "checkpoint")
    for number, checkpoint in enumerate(state.checkpoints, start=1):
        table.add_row(
            str(number),
            checkpoint.checkpoint_id,
            checkpoint.step_id,
            str(checkpoint.at_seq),
            Text("yes" if checkpoint.reversible else f"no ({checkpoint.compensation or '-'})"),
            Text(_files_changed(checkpoint)),
            Text(checkpoint.snapshot_id or ""),
            _time(checkpoint.created_at),
        )
    return table


def _files_changed(checkpoint: CheckpointState) -> str:
    """`+created ~modified -deleted`, with the paths when there are few; "none" also for a
    step whose tool cannot change the workspace (a read, a tool outside Helmline), and
    nothing when nobody looked (the sandbox took no snapshots)."""
    changes = checkpoint.changes
    if changes is None:
        return "none" if checkpoint.effect in ("none", "external") else ""
    if changes.total == 0:
        return "none"
    unlisted = changes.unlisted
    counts = f"+{len(changes.created)} ~{len(changes.modified)} -{len(changes.deleted)}"
    if unlisted:
        return f"{counts} and {unlisted} more"
    listed = [
        *(f"+{p}" for p in changes.created),
        *(f"~{p}" for p in changes.modified),
        *(f"-{p}" for p in changes.deleted),
    ]
    return " ".join(listed) if 0 < len(listed) <= 3 else counts


def session_panel(state: SessionState, *, full: bool, rows: int | None = None) -> RenderableType:
    """Goal, status and the plan's steps (all, or as many as `rows`, see `listed_steps`):
    what `show` prints, and what `run --wait` updates."""
    header = Text.assemble(
        ("session ", "bold"),
        state.session_id,
        f"  (tenant {state.tenant})  ",
        Text.from_markup(_status(state)),
    )
    lines: list[RenderableType] = [header, Text(f"goal: {state.goal}")]
    if full:
        requested = state.requested_by.id if state.requested_by else "?"
        lines.append(
            Text(
                f"requested by {requested} at {_time(state.started_at)}"
                + (f", ended {_time(state.ended_at)}" if state.ended_at else "")
            )
        )
    if state.outcome:
        lines.append(Text(f"outcome: {state.outcome}"))
    if full and state.plan_revision:
        lines.append(Text(plan_line(state)))
    if full and state.model_calls:
        cost = f", ${state.cost_usd:.4f}" if state.cost_usd else ""
        lines.append(
            Text(
                f"model ({state.mode} mode): {state.model_calls} calls, "
                f"{state.tokens_used} tokens{cost}"
            )
        )
        for tally in state.model_usage if len(state.model_usage) > 1 else ():
            spent = f", ${tally.cost_usd:.4f}" if tally.cost_usd else ""
            tokens = tally.input_tokens + tally.output_tokens
            lines.append(Text(f"  {tally.model}: {tally.calls} calls, {tokens} tokens{spent}"))
    for result in state.criteria if full else ():
        mark = "met" if result.met else "NOT met"
        lines.append(Text(f"criterion {mark}: {result.criterion}  ({result.evidence or '-'})"))
    if state.pause_requested and state.status != "paused":
        lines.append(Text("pause requested", style="yellow"))
    if state.cancel_requested and not state.is_terminal:
        lines.append(Text("cancel requested", style="magenta"))
    if state.steps:
        listed = listed_steps(state, rows)
        lines.append(_steps_table(state, listed, full=full))
        if len(listed) < len(state.steps):
            lines.append(Text(_not_listed(state, listed), style="dim"))
    else:
        lines.append(Text("no steps" if state.is_terminal else "no steps yet", style="dim"))
    return Group(*lines)


def plan_line(state: SessionState) -> str:
    """What the latest plan says of itself up front: confidence, duration, needs, criteria."""
    parts = []
    if state.plan_confidence is not None:
        parts.append(f"confidence {state.plan_confidence:.0%}")
    if state.plan_estimated_duration_s is not None:
        parts.append(f"about {_duration(state.plan_estimated_duration_s)}")
    if state.plan_permissions:
        parts.append("needs " + ", ".join(state.plan_permissions))
    if state.completion_criteria:
        count = len(state.completion_criteria)
        required = state.criteria_required or count
        parts.append(f"{required} of {count} completion criteria must be met")
    return "plan: " + ("; ".join(parts) or "no estimates")


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:g} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def decide_command(state: SessionState) -> str:
    """The `helmline approve` that decides the session's pending request."""
    tenant = "" if state.tenant == "default" else f" --tenant {state.tenant}"
    which = "" if len(state.pending_approvals) == 1 else " --request <id>"
    grant = f" [{GRANT_OPTIONS}]" if any(r.permissions for r in state.pending_approvals) else ""
    return f"helmline approve {state.session_id}{tenant}{which}{grant}"


def approval_queue(states: list[SessionState]) -> list[tuple[SessionState, ApprovalState]]:
    """Every pending request of the sessions, the soonest to expire first."""
    queue = [(state, request) for state in states for request in state.pending_approvals]
    return sorted(queue, key=lambda item: item[1].expires_at)


def approval_queue_json(queue: list[tuple[SessionState, ApprovalState]]) -> str:
    return json.dumps(
        [
            {
                "session_id": state.session_id,
                "tenant": state.tenant,
                "request_id": request.request_id,
                "scope": request.scope,
                "step_id": request.step_id,
                "tool": request.tool,
                "arguments": request.arguments,
                "risk": request.risk,
                "reason": request.reason,
                "rule": request.rule,
                "permissions": [need.model_dump(mode="json") for need in request.permissions],
                "taint": request.taint.model_dump(mode="json") if request.taint else None,
                "approver_roles": list(request.approver_roles),
                "quorum": request.quorum,
                "expires_at": _iso(request.expires_at),
            }
            for state, request in queue
        ],
        indent=2,
    )


def render_approval_queue(
    console: Console, queue: list[tuple[SessionState, ApprovalState]], *, tenant: str
) -> None:
    if not queue:
        console.print(f"No approval request waits in tenant {tenant!r}.")
        return
    table = Table(title=f"approval requests waiting in tenant {tenant!r}", title_justify="left")
    for column in ("expires", "session", "request", "step", "tool", "risk", "asks for"):
        table.add_column(column, no_wrap=True)
    table.add_column("may decide", no_wrap=True)
    table.add_column("reason")
    for state, request in queue:
        roles = ", ".join(request.approver_roles) or "approver, admin"
        table.add_row(
            _time(request.expires_at),
            state.session_id,
            request.request_id,
            request.step_id or "(the plan)",
            request.tool or "",
            request.risk,
            Text(_asks_for(request)),
            f"{roles}" + (f" ({request.quorum} people)" if request.quorum > 1 else ""),
            Text(request.reason),
        )
    console.print(table)
    console.print("decide with: helmline approve SESSION --request REQUEST (or helmline deny ...)")
    if any(request.permissions for _, request in queue):
        console.print(f"a permission for the step or the session: ... {GRANT_OPTIONS}")


GRANT_OPTIONS = "--for step|session --expires-in 1h"
"""How `helmline approve` grants a permission request, as the views suggest it."""


def _asks_for(request: ApprovalState) -> str:
    """What a request asks for: approval of a call (or plan), or the permissions it lacks."""
    if not request.permissions:
        return "approval"
    return ", ".join(f"{need.kind} {need.name}" for need in request.permissions)


def approvals_table(pending: tuple[ApprovalState, ...]) -> Table:
    table = Table(title="pending approvals", title_justify="left")
    table.add_column("request", no_wrap=True)
    table.add_column("step", no_wrap=True)
    table.add_column("tool", no_wrap=True)
    table.add_column("arguments", overflow="fold")
    table.add_column("risk", no_wrap=True)
    table.add_column("asks for", no_wrap=True)
    table.add_column("reason")
    table.add_column("expires", no_wrap=True)
    for request in pending:
        table.add_row(
            request.request_id,
            request.step_id or "(the plan)",
            request.tool or "",
            Text(json.dumps(request.arguments) if request.arguments is not None else ""),
            request.risk,
            Text(_asks_for(request)),
            Text(request.reason),
            _time(request.expires_at),
        )
    return table


def permission_grants_table(grants: list[ApprovalState]) -> Table:
    """Permissions people granted on request: what, for what, by whom, until when."""
    table = Table(title="permissions granted on request", title_justify="left")
    for column in ("request", "permissions", "for", "by", "until"):
        table.add_column(column, no_wrap=column != "permissions", overflow="fold")
    for grant in grants:
        table.add_row(
            grant.request_id,
            Text(_asks_for(grant)),
            f"step {grant.step_id}" if grant.grant_scope == "step" else "the session",
            ", ".join(actor.id for actor in grant.decided_by),
            _time(grant.grant_until),
        )
    return table


def standing_grants_table(grants: list[ApprovalState]) -> Table:
    """ "Approve similar" grants: what later calls each covers, and how much of it is used."""
    table = Table(title="standing grants (approve similar)", title_justify="left")
    for column in ("request", "tool", "rule", "used", "until", "only where"):
        table.add_column(column, no_wrap=column != "only where", overflow="fold")
    for grant in grants:
        where = {
            name: condition.model_dump(mode="json", exclude_none=True)
            for name, condition in (grant.similar_where or {}).items()
        }
        table.add_row(
            grant.request_id,
            grant.tool or "",
            grant.rule or "",
            f"{grant.similar_used} of {grant.similar_limit}",
            _time(grant.similar_until),
            Text(json.dumps(where) if where else "any arguments"),
        )
    return table


def listed_steps(state: SessionState, rows: int | None) -> list[StepState]:
    """The steps a table of at most `rows` rows lists, in plan order: every step when they
    fit; else those not succeeded first (what runs, waits or went wrong, then what is still
    to come), and in the rows left the last steps that succeeded."""
    steps = state.steps
    if rows is None or len(steps) <= rows:
        return list(steps.values())
    # A table costs in proportion to its rows: thousands of them take seconds to draw.
    chosen = {
        step.id
        for step in itertools.islice(
            (step for step in steps.values() if step.status != "succeeded"), rows
        )
    }
    room = rows - len(chosen)
    for step in reversed(steps.values()):
        if room == 0:
            break
        if step.status == "succeeded":
            chosen.add(step.id)
            room -= 1
    return [step for step in steps.values() if step.id in chosen]


def _not_listed(state: SessionState, listed: list[StepState]) -> str:
    succeeded = sum(1 for step in state.steps.values() if step.status == "succeeded")
    succeeded -= sum(1 for step in listed if step.status == "succeeded")
    left_out = len(state.steps) - len(listed)
    return (
        f"{left_out} more steps not listed, {succeeded} of them succeeded: "
        f"helmline show {state.session_id} lists every step"
    )


def _steps_table(state: SessionState, listed: list[StepState], *, full: bool) -> Table:
    revision = f"plan (revision {state.plan_revision})" if state.plan_revision else "plan"
    table = Table(title=revision, title_justify="left")
    table.add_column("step", no_wrap=True)
    table.add_column("status", no_wrap=True)
    table.add_column("tool", no_wrap=True)
    if full:
        table.add_column("depends on")
    table.add_column("result" if full else "detail", overflow="fold")
    for step in listed:
        row: list[RenderableType] = [step.id, _step_status(step), step.tool]
        if full:
            row.append(", ".join(step.depends_on))
        # Results are data, never markup: a JSON list must not be read as a style tag.
        row.append(Text(_step_detail(state, step, width=CELL_WIDTH * 4 if full else CELL_WIDTH)))
        table.add_row(*row)
    return table


def _step_detail(state: SessionState, step: StepState, *, width: int) -> str:
    request = state.approvals.get(step.approval_request_id or "")
    if request is not None and request.status == "pending":
        return f"waiting for approval {request.request_id}"
    match step.status:
        case "succeeded" if step.output is None and step.reason:
            return step.reason  # Completed in the session a fork started from.
        case "succeeded":
            return _brief(step.output, width)
        case "failed" if step.retry_at is not None:
            return f"tried again at {_time(step.retry_at)}: {step.reason}"
        case "failed":
            if step.error is None:
                return ""
            hint = f" ({step.error.suggestion})" if step.error.suggestion else ""
            return f"{step.error.kind}: {step.error.message}{hint}"
        case "denied" | "skipped":
            return step.reason or ""
        case _:
            return step.description


def _status(state: SessionState) -> str:
    return f"[{SESSION_STYLE[state.status]}]{state.status}[/]"


def _step_status(step: StepState) -> str:
    notes = []
    if step.attempts > 1:
        notes.append(f"try {step.attempts}")
    if step.retries:
        notes.append(f"{step.retries} {'retry' if step.retries == 1 else 'retries'}")
    if step.cached_from is not None:
        notes.append(f"result of {step.cached_from}")
    if step.requires_approval:
        notes.append("plan asks approval")
    if step.redacted_by:
        # Which rules fired and how often: never what they replaced.
        fired = ", ".join(f"{rule}={count}" for rule, count in sorted(step.redacted_by.items()))
        notes.append(f"redacted {fired}")
    shown = f" ({', '.join(notes)})" if notes else ""
    return f"[{STEP_STYLE[step.status]}]{step.status}[/]{shown}"


def _brief(value: JsonValue, width: int) -> str:
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    text = text.replace("\n", "\\n")
    return text if len(text) <= width else text[: width - 1] + "…"


def _time(moment: datetime | None) -> str:
    return moment.astimezone().strftime("%Y-%m-%d %H:%M:%S") if moment else ""


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment else None
