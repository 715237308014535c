"""The planner's settings: which model to ask, how, and the limits of a goal session."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr, model_validator

from helmline.contracts import BUILTIN_TOOLS
from helmline.planner._context import schema_tokens
from helmline.planner._prompts import CONTROL_TOOLS
from helmline.runtime import RuntimeSettings

Provider = Literal["openai", "anthropic"]
Purpose = Literal["planning", "summarising", "classifying"]

DEFAULT_BASE_URLS: dict[Provider, str] = {
    "openai": "https://api.openai.com/v1",
    "anthropic": "https://api.anthropic.com",
}


class PlannerSettings(RuntimeSettings):
    """`HELMLINE_*` variables of the planner; the providers' own key variables count too."""

    llm_provider: Provider = "openai"
    """Wire protocol: `openai` (Chat Completions: OpenAI, vLLM, Ollama, llama.cpp, LiteLLM)
    or `anthropic` (Messages)."""
    llm_base_url: str | None = None
    """Endpoint; for `openai` it ends in `/v1`. Defaults to `OPENAI_BASE_URL` or
    `ANTHROPIC_BASE_URL`, then to the provider's public API."""
    openai_base_url: str | None = Field(default=None, validation_alias="OPENAI_BASE_URL")
    anthropic_base_url: str | None = Field(default=None, validation_alias="ANTHROPIC_BASE_URL")
    llm_model: str = "gpt-4o-mini"
    """The model for every purpose that has no model of its own."""
    llm_model_planning: str | None = None
    """Model that plans and acts (default: `llm_model`)."""
    llm_model_summarising: str | None = None
    """Model that summarises (default: `llm_model`)."""
    llm_model_classifying: str | None = None
    """Model that classifies (default: `llm_model`)."""
    llm_api_key: SecretStr | None = None
    """API key; `OPENAI_API_KEY` or `ANTHROPIC_API_KEY` is used when this is unset."""
    openai_api_key: SecretStr | None = Field(default=None, validation_alias="OPENAI_API_KEY")
    anthropic_api_key: SecretStr | None = Field(default=None, validation_alias="ANTHROPIC_API_KEY")
    llm_timeout_s: float = Field(default=120.0, gt=0)
    """Longest wait for one response."""
    llm_connect_timeout_s: float = Field(default=10.0, gt=0)
    """Longest wait to connect."""
    llm_max_retries: int = Field(default=4, ge=0, le=20)
    """Retries after a rate limit (429), a server error (5xx) or a lost connection."""
    llm_max_retry_wait_s: float = Field(default=60.0, ge=0)
    """Longest wait before a retry, even when the server's Retry-After asks for more."""
    llm_stream: bool = False
    """Ask for server-sent events and assemble the answer as it streams."""
    llm_max_output_tokens: int = Field(default=4096, ge=1)
    """Largest reply asked for."""
    llm_max_reply_bytes: int = Field(default=262_144, ge=1024)
    """Longest text of a reply (its answer, and each call's arguments) recorded; the rest
    is cut with a marker, as output safety cuts every output that reaches the log."""
    llm_prices: dict[str, tuple[float, float]] = Field(default_factory=dict)
    """USD per million input and output tokens, by model (JSON); cost is unknown without."""

    planner_system_prompt: str | None = None
    """Replaces the built-in system prompt (to try a new prompt, then shadow-replay)."""
    planner_max_iterations: int = Field(default=40, ge=1)
    """Model calls per session."""
    planner_max_tokens: int = Field(default=400_000, ge=1)
    """Tokens (input and output) per session."""
    planner_max_cost_usd: float | None = Field(default=None, gt=0)
    """Spend per session, where prices are configured."""
    planner_max_wall_s: float = Field(default=3600.0, gt=0)
    """Seconds from a session's start after which no model call is made."""
    planner_context_tokens: int = Field(default=16_000, ge=1000)
    """The model's context window as a request may use it: the prompt (system prompt, tool
    schemas, history with tool results) and a reserve of `llm_max_output_tokens` for the
    answer."""
    planner_compact_at: float = Field(default=0.85, gt=0, lt=1)
    """Share of the prompt's budget at which old history is compacted into a summary."""
    planner_max_tools: int = Field(default=16, ge=1)
    """Tools offered to the model per request, chosen by the goal and recent use."""
    planner_tool_schema_share: float = Field(default=0.3, gt=0, lt=1)
    """Share of the prompt's budget the offered tools' schemas may take; the least relevant
    tools not used recently are left out to stay within it."""
    planner_max_result_chars: int = Field(default=4000, ge=100)
    """Tool results longer than this are cut, with a marker, before the model sees them."""
    planner_loop_repeats: int = Field(default=3, ge=2)
    """The same call (or cycle of calls) this many times in a row stops the session."""
    planner_max_finish_attempts: int = Field(default=3, ge=1)
    """`finish` calls short of the required completion criteria after which the session
    stops: completed in part when some criteria were met, failed when none was."""

    @model_validator(mode="after")
    def _room_for_a_prompt(self) -> PlannerSettings:
        if self.prompt_budget() < self.planner_context_tokens // 4:
            raise ValueError(
                f"llm_max_output_tokens ({self.llm_max_output_tokens}) leaves less than a "
                f"quarter of planner_context_tokens ({self.planner_context_tokens}) for the "
                "prompt; raise the context or lower the output"
            )
        return self

    @model_validator(mode="after")
    def _room_for_tool_schemas(self) -> PlannerSettings:
        room = int(self.prompt_budget() * self.planner_tool_schema_share)
        needed = sum(schema_tokens(tool) for tool in (*CONTROL_TOOLS.values(), *BUILTIN_TOOLS))
        if room < needed:
            raise ValueError(
                f"planner_tool_schema_share ({self.planner_tool_schema_share:g}) leaves "
                f"{room} tokens of the prompt for tool schemas, but the control tools and the "
                f"built-in tools alone take {needed}: a session could be offered no tool to "
                "act with; raise the share or planner_context_tokens"
            )
        return self

    def prompt_budget(self) -> int:
        """Tokens a request's prompt may take: the context less the answer's reserve."""
        return self.planner_context_tokens - self.llm_max_output_tokens

    def base_url(self) -> str:
        """The endpoint to call."""
        fallback = (
            self.openai_base_url if self.llm_provider == "openai" else self.anthropic_base_url
        )
        url = self.llm_base_url or fallback or DEFAULT_BASE_URLS[self.llm_provider]
        return url.rstrip("/")

    def api_key(self) -> str | None:
        """The key to send: Helmline's own variable first, then the provider's usual one."""
        fallback = self.openai_api_key if self.llm_provider == "openai" else self.anthropic_api_key
        key = self.llm_api_key or fallback
        return key.get_secret_value() if key is not None else None

    def missing_credentials(self) -> str | None:
        """Why no model can be asked, when that is known without asking: a provider's own
        service with no API key to send."""
        if self.api_key() is None and self.base_url() in DEFAULT_BASE_URLS.values():
            return (
                f"no API key for {self.base_url()}: set HELMLINE_LLM_API_KEY (or the "
                "provider's own key variable), or HELMLINE_LLM_BASE_URL for a model server "
                "that needs none"
            )
        return None

    def model_for(self, purpose: Purpose) -> str:
        """The model configured for a purpose (the model router)."""
        chosen = {
            "planning": self.llm_model_planning,
            "summarising": self.llm_model_summarising,
            "classifying": self.llm_model_classifying,
        }[purpose]
        return chosen or self.llm_model
