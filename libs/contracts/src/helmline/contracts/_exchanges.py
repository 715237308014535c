"""Model exchanges as the log records them: what the planner asked a model and what it said.

The form is the providers' common ground (OpenAI Chat Completions, Anthropic Messages), so a
recorded session can be replayed against any provider and compared message by message.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from helmline.contracts._values import Contract


class ModelToolCall(Contract):
    """A tool call the model asked for."""

    id: str = Field(min_length=1, max_length=256)
    """The model's id of the call; a tool result answers it by this id."""
    name: str = Field(min_length=1, max_length=256)
    """The tool the model named (not necessarily one that exists)."""
    arguments: str = ""
    """The arguments exactly as the model sent them: JSON text, possibly malformed."""


class ModelMessage(Contract):
    """One message of the conversation with the model (the system prompt is kept apart)."""

    role: Literal["user", "assistant", "tool"]
    """Who speaks: the planner on the user's behalf, the model, or a tool result."""
    content: str = ""
    """The text."""
    tool_calls: tuple[ModelToolCall, ...] = ()
    """Tool calls of an assistant message."""
    tool_call_id: str | None = None
    """The call a tool message answers."""


class ModelUsage(Contract):
    """Tokens a model call used, as the provider counted them."""

    input_tokens: int = Field(default=0, ge=0)
    """Tokens of the prompt."""
    output_tokens: int = Field(default=0, ge=0)
    """Tokens of the reply."""


class ModelRequestRecord(Contract):
    """A request to a model, as sent (tool schemas are named, not copied)."""

    model: str = Field(min_length=1)
    """The model asked."""
    system: str = ""
    """The system prompt."""
    messages: tuple[ModelMessage, ...]
    """The conversation."""
    tools: tuple[str, ...] = ()
    """Names of the tools offered, in the order offered."""
    max_tokens: int = Field(default=4096, ge=1)
    """Largest reply allowed."""


class ModelReply(Contract):
    """What a model answered."""

    content: str = ""
    """Its text."""
    tool_calls: tuple[ModelToolCall, ...] = ()
    """Tool calls it asked for."""
    stop_reason: str = ""
    """Why it stopped, in the provider's words (`tool_calls`, `tool_use`, `stop`, ...)."""
    usage: ModelUsage = Field(default_factory=ModelUsage)
    """Tokens used."""


class CriterionResult(Contract):
    """A completion criterion and whether the model found it met."""

    criterion: str = Field(min_length=1)
    """The criterion, as declared."""
    met: bool
    """Whether it holds."""
    evidence: str = ""
    """What shows it (a step result, a file's content)."""
