"""What a person asks of a session, as the events the CLI appends. Pure: no I/O here."""

from __future__ import annotations

import getpass
import os
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from pydantic import ValidationError

from helmline.cli._errors import CliError
from helmline.contracts import (
    Actor,
    ApprovalDecisionSubmitted,
    ArgumentCondition,
    Arguments,
    Event,
    GrantScope,
    Payload,
    Playbook,
    SessionCancelRequested,
    SessionPauseRequested,
    SessionResumeRequested,
    SessionStarted,
    new_event,
)

SOURCE = "helmline/cli"

Control = Literal["pause", "resume", "cancel"]


DEFAULT_ROLES = ("operator", "approver")


@dataclass(frozen=True, slots=True)
class StandingGrant:
    """ "Approve similar calls": a grant that also stands for later calls of the same tool
    that the same policy rule sends to approval in the session."""

    limit: int
    """How many such calls it approves."""
    until: datetime | None
    """When it ends; None: the approval service's default (an hour after the grant)."""
    where: dict[str, ArgumentCondition] | None = None
    """Conditions on the later calls' arguments that it is limited to."""


@dataclass(frozen=True, slots=True)
class PermissionGrant:
    """How a permission request is granted: for the step that asked or the whole session,
    and until when."""

    scope: GrantScope
    """The step, or the session."""
    until: datetime | None
    """When it ends; None: the policy's default (`permission_requests.grant_expires_in`)."""


def current_actor(name: str | None = None, roles: tuple[str, ...] = ()) -> Actor:
    """The person at the terminal: the login name and the operator and approver roles,
    unless they say who they act as (the CLI speaks to the log directly, so whoever may reach
    NATS is trusted; the HTTP API checks identities with keys)."""
    if name is None:
        try:
            name = getpass.getuser()
        except (KeyError, OSError):
            # A container may run under a uid that has no entry in /etc/passwd.
            name = f"uid-{os.getuid()}"
    try:
        return Actor(id=name, kind="user", roles=roles or DEFAULT_ROLES)
    except ValidationError as error:
        problems = "; ".join(detail["msg"] for detail in error.errors())
        raise CliError(f"invalid identity {name!r} {roles}: {problems}", exit_code=2) from error


def new_session_id() -> str:
    return uuid.uuid4().hex


def check_identifiers(tenant: str, session_id: str) -> None:
    """Refuse a tenant or session id the contracts do not allow, before it reaches a subject.

    The envelope is the one definition of what an id may hold, so it is asked directly.
    """
    try:
        _intent(SessionResumeRequested(requested_by=Actor(id="check")), tenant, session_id)
    except ValidationError as error:
        fields = sorted({str(detail["loc"][0]).replace("_", " ") for detail in error.errors()})
        raise CliError(
            f"invalid {' and '.join(fields)}: tenant {tenant!r}, session {session_id!r} "
            "(letters, digits, '-' and '_' only)",
            exit_code=2,
        ) from error


@dataclass(frozen=True, slots=True)
class Goal:
    """A goal in plain language, for the planner's model to plan (`plan`) or act on (`act`)."""

    text: str
    mode: Literal["plan", "act"]


def session_started(plan: Playbook | Goal, *, tenant: str, session_id: str, actor: Actor) -> Event:
    if isinstance(plan, Goal):
        if not plan.text.strip():
            raise CliError("the goal is empty; say what the session should achieve", exit_code=2)
        payload = SessionStarted(goal=plan.text, mode=plan.mode, requested_by=actor)
    else:
        payload = SessionStarted(goal=plan.goal, mode="playbook", playbook=plan, requested_by=actor)
    return _intent(payload, tenant, session_id)


def decision_submitted(
    *,
    tenant: str,
    session_id: str,
    request_id: str,
    decision: Literal["grant", "deny"],
    actor: Actor,
    comment: str,
    modified_arguments: Arguments | None = None,
    similar: StandingGrant | None = None,
    grant: PermissionGrant | None = None,
) -> Event:
    payload = ApprovalDecisionSubmitted(
        request_id=request_id,
        decision=decision,
        decided_by=actor,
        comment=comment,
        modified_arguments=modified_arguments,
        similar_limit=similar.limit if similar else None,
        similar_until=similar.until if similar else None,
        similar_where=similar.where if similar else None,
        grant_scope=grant.scope if grant else None,
        grant_until=grant.until if grant else None,
    )
    return _intent(payload, tenant, session_id)


def control_requested(
    control: Control, *, tenant: str, session_id: str, actor: Actor, reason: str
) -> Event:
    payload: Payload
    match control:
        case "pause":
            payload = SessionPauseRequested(requested_by=actor, reason=reason)
        case "resume":
            # The contract records no reason for resuming.
            payload = SessionResumeRequested(requested_by=actor)
        case "cancel":
            payload = SessionCancelRequested(requested_by=actor, reason=reason)
    return _intent(payload, tenant, session_id)


def _intent(payload: Payload, tenant: str, session_id: str) -> Event:
    return new_event(payload, tenant=tenant, session_id=session_id, source=SOURCE)
