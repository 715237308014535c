"""What a person asks of a session, as the events the CLI appends. Pure: no I/O here."""

from __future__ import annotations

import getpass
import os
import uuid
from typing import Literal

from pydantic import ValidationError

from helmline.cli._errors import CliError
from helmline.contracts import (
    Actor,
    ApprovalDecisionSubmitted,
    Event,
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


def current_actor() -> Actor:
    """The person at the terminal, with every role for now (there is no login yet)."""
    try:
        name = getpass.getuser()
    except (KeyError, OSError):
        # A container may run under a uid that has no entry in /etc/passwd.
        name = f"uid-{os.getuid()}"
    return Actor(id=name, kind="user", roles=("operator", "approver"))


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


def session_started(playbook: Playbook, *, tenant: str, session_id: str, actor: Actor) -> Event:
    payload = SessionStarted(
        goal=playbook.goal, mode="playbook", playbook=playbook, requested_by=actor
    )
    return _intent(payload, tenant, session_id)


def decision_submitted(
    *,
    tenant: str,
    session_id: str,
    request_id: str,
    decision: Literal["grant", "deny"],
    actor: Actor,
    comment: str,
) -> Event:
    payload = ApprovalDecisionSubmitted(
        request_id=request_id, decision=decision, decided_by=actor, comment=comment
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
