"""A session's life: asked for, paused and resumed, cancelled, completed or failed."""

from __future__ import annotations

from typing import Literal, Self

from pydantic import Field

from helmline.contracts._exchanges import CriterionResult
from helmline.contracts._payload import Payload
from helmline.contracts._plans import Playbook
from helmline.contracts._services import API, PLANNER
from helmline.contracts._values import Actor, Contract, SessionId, StepId
from helmline.contracts.events._samples import ANA, COUNT, WRITE


class ForkOrigin(Contract):
    """Where a forked session came from."""

    session_id: SessionId
    """The session that was forked."""
    at_seq: int = Field(ge=1)
    """Stream sequence of the origin session's last event included in the fork."""
    checkpoint_id: str | None = Field(default=None, min_length=1, max_length=128)
    """The origin's checkpoint the fork starts from."""
    snapshot_id: str | None = Field(default=None, min_length=1, max_length=128)
    """The origin's workspace snapshot the fork's workspace starts as; the fork runs no step
    before the sandbox has restored it (`workspace.restored`)."""
    completed_steps: tuple[StepId, ...] = ()
    """Steps the origin had completed at that point: the fork does not run them again."""


class SessionStarted(Payload, type="session.started", published_by=(API,)):
    """A session was asked for: a goal, and optionally the playbook that achieves it."""

    goal: str = Field(min_length=1)
    """The goal in plain language."""
    mode: Literal["playbook", "plan", "act"] = "playbook"
    """How the planner works: a declared playbook, plan-then-execute, or one call at a time."""
    playbook: Playbook | None = None
    """The declared plan, for playbook sessions."""
    requested_by: Actor
    """Who started the session."""
    labels: dict[str, str] = Field(default_factory=dict)
    """Free-form labels for filtering."""
    fork_of: ForkOrigin | None = None
    """Set when this session is a fork of another."""

    @classmethod
    def example(cls) -> Self:
        return cls(
            goal="Write a note and count its bytes",
            requested_by=ANA,
            playbook=Playbook(goal="Write a note and count its bytes", steps=(WRITE, COUNT)),
            labels={"team": "docs"},
        )


class SessionPauseRequested(Payload, type="session.pause_requested", published_by=(API,)):
    """Someone asked that no new step start until the session is resumed."""

    requested_by: Actor
    """Who asked."""
    reason: str = ""
    """Why, if they said."""

    @classmethod
    def example(cls) -> Self:
        return cls(requested_by=ANA, reason="lunch")


class SessionPaused(Payload, type="session.paused", published_by=(PLANNER,)):
    """The planner stopped starting new steps; running steps finish."""

    @classmethod
    def example(cls) -> Self:
        return cls()


class SessionResumeRequested(Payload, type="session.resume_requested", published_by=(API,)):
    """Someone asked a paused session to continue."""

    requested_by: Actor
    """Who asked."""

    @classmethod
    def example(cls) -> Self:
        return cls(requested_by=ANA)


class SessionResumed(Payload, type="session.resumed", published_by=(PLANNER,)):
    """The planner continues scheduling steps."""

    @classmethod
    def example(cls) -> Self:
        return cls()


class SessionCancelRequested(Payload, type="session.cancel_requested", published_by=(API,)):
    """Someone asked to stop the session for good; running commands are killed."""

    requested_by: Actor
    """Who asked."""
    reason: str = ""
    """Why, if they said."""

    @classmethod
    def example(cls) -> Self:
        return cls(requested_by=ANA, reason="wrong goal")


class SessionCancelled(Payload, type="session.cancelled", published_by=(PLANNER,)):
    """The session ended because it was cancelled."""

    reason: str = ""
    """Why it was cancelled."""

    @classmethod
    def example(cls) -> Self:
        return cls(reason="wrong goal")


class SessionCompleted(Payload, type="session.completed", published_by=(PLANNER,)):
    """The session reached its goal."""

    summary: str = ""
    """What was achieved."""
    partial: bool = False
    """True when the session stopped with only some completion criteria met."""
    criteria: tuple[CriterionResult, ...] = ()
    """Each completion criterion as the planner checked it (goal sessions)."""

    @classmethod
    def example(cls) -> Self:
        return cls(summary="2 of 2 steps succeeded")


class SessionFailed(Payload, type="session.failed", published_by=(PLANNER,)):
    """The session ended without reaching its goal."""

    reason: str
    """Why it failed."""
    step_id: StepId | None = None
    """The step whose failure ended the session, if one did."""

    @classmethod
    def example(cls) -> Self:
        return cls(reason="step 'count' was denied: denied by ana", step_id="count")
