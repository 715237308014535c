"""Model providers behind one interface: thin clients over two wire protocols.

`OpenAIChat` speaks Chat Completions (OpenAI and every server that copies it: vLLM, Ollama,
llama.cpp, LiteLLM); `AnthropicMessages` speaks the Messages API. Both send the conversation
as the log records it (`ModelRequestRecord`) and return a `ModelReply`, retry rate limits and
server errors (after the server's Retry-After when it gives one), and can read a streamed
answer. Written over httpx rather than the vendors' SDKs: two small request/response mappings
are easier to audit than two large SDKs, and every compatible server works the same way.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
from pydantic import JsonValue

from helmline.contracts import (
    ModelMessage,
    ModelReply,
    ModelRequestRecord,
    ModelToolCall,
    ModelUsage,
    ToolSpec,
)
from helmline.planner._settings import PlannerSettings
from helmline.runtime import SafeOutput, make_safe, make_text_safe, retry_after_s

RETRIED_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504, 529})
ANTHROPIC_VERSION = "2023-06-01"
_WIRE_NAME = re.compile(r"[^A-Za-z0-9_-]")


class ModelError(Exception):
    """A model call that did not produce an answer; the message says why."""


class ModelUnavailable(ModelError):
    """Rate limits, server errors or lost connections outlasted the retries."""


class ModelRefused(ModelError):
    """The provider refused the request (bad key, unknown model, invalid request)."""


@dataclass(frozen=True, slots=True)
class ModelCall:
    """A model's answer and what it took to get it."""

    reply: ModelReply
    """The answer, made safe: what the log may record and the planner act on."""
    attempts: int
    duration_ms: float
    redacted_by: Mapping[str, int] = field(default_factory=dict[str, int])
    """How many values each output-safety rule redacted from the answer, by rule name."""
    neutralised_by: Mapping[str, int] = field(default_factory=dict[str, int])
    """How many places of the answer each injection rule neutralised, by rule name."""


@dataclass(slots=True)
class _ToolNames:
    """Providers allow `[A-Za-z0-9_-]{1,64}` in tool names; Helmline names may hold `.` or `:`."""

    to_wire: dict[str, str] = field(default_factory=dict)
    from_wire: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, tools: Sequence[ToolSpec]) -> _ToolNames:
        names = cls()
        for tool in tools:
            wire = _WIRE_NAME.sub("_", tool.name)[:64]
            names.to_wire[tool.name] = wire
            names.from_wire[wire] = tool.name
        return names

    def wire(self, name: str) -> str:
        return self.to_wire.get(name, _WIRE_NAME.sub("_", name)[:64])

    def ours(self, wire: str) -> str:
        return self.from_wire.get(wire, wire)


class ModelClient(ABC):
    """One provider's client: request mapping, retries, streaming. Subclasses map the wire."""

    provider = ""
    path = ""

    def __init__(self, settings: PlannerSettings, *, http: httpx.AsyncClient | None = None) -> None:
        self._settings = settings
        timeout = httpx.Timeout(settings.llm_timeout_s, connect=settings.llm_connect_timeout_s)
        self._http = http or httpx.AsyncClient(timeout=timeout)
        self._url = settings.base_url() + self.path

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._http.aclose()

    async def complete(self, request: ModelRequestRecord, tools: Sequence[ToolSpec]) -> ModelCall:
        """Ask the model; retry what retrying can fix; raise `ModelError` otherwise."""
        missing = self._settings.missing_credentials()
        if missing is not None:
            raise ModelError(missing)  # Asking would only fail, after every retry.
        names = _ToolNames.of(tools)
        body = self.body(request, tools, names)
        started = time.monotonic()
        attempts = 0
        while True:
            attempts += 1
            try:
                reply = await self._attempt(body, names)
            except _Retry as retry:
                if attempts > self._settings.llm_max_retries:
                    raise ModelUnavailable(
                        f"{self.provider} model {request.model!r} at {self._url}: {retry.reason}"
                        f" (gave up after {attempts} attempts)"
                    ) from None
                await asyncio.sleep(self._wait(retry.after_s, attempts))
                continue
            elapsed_ms = (time.monotonic() - started) * 1000
            return made_safe(reply, attempts, elapsed_ms, self._settings.llm_max_reply_bytes)

    def _wait(self, after_s: float | None, attempts: int) -> float:
        cap = self._settings.llm_max_retry_wait_s
        if after_s is not None:
            return min(after_s, cap)
        # Exponential backoff with full jitter, so many sessions do not retry in step.
        return random.uniform(0, min(cap, 0.5 * 2 ** (attempts - 1)))

    async def _attempt(self, body: dict[str, Any], names: _ToolNames) -> ModelReply:
        try:
            async with self._http.stream(
                "POST", self._url, json=body, headers=self.headers()
            ) as response:
                if response.status_code != 200:
                    await response.aread()
                    raise self._failure(response)
                if body.get("stream"):
                    return await self.read_stream(_sse(response.aiter_lines()), names)
                await response.aread()
                return self.read(response.json(), names)
        except httpx.TransportError as error:
            raise _Retry(f"{type(error).__name__}: {error}", None) from error
        except (ValueError, KeyError, TypeError, IndexError) as error:
            raise ModelRefused(
                f"{self.provider} answered in an unexpected form: {error}"
            ) from error

    def _failure(self, response: httpx.Response) -> Exception:
        detail = response.text[:500]
        reason = f"HTTP {response.status_code}: {detail}"
        if response.status_code in RETRIED_STATUSES:
            return _Retry(reason, retry_after_s(response.headers))
        return ModelRefused(f"{self.provider} refused the request at {self._url}: {reason}")

    @abstractmethod
    def headers(self) -> dict[str, str]:
        """The provider's authentication and version headers."""

    @abstractmethod
    def body(
        self, request: ModelRequestRecord, tools: Sequence[ToolSpec], names: _ToolNames
    ) -> dict[str, Any]:
        """The request body in the provider's wire format."""

    @abstractmethod
    def read(self, answer: dict[str, Any], names: _ToolNames) -> ModelReply:
        """The reply of a whole (not streamed) answer."""

    @abstractmethod
    async def read_stream(
        self, events: AsyncIterator[tuple[str, dict[str, Any]]], names: _ToolNames
    ) -> ModelReply:
        """The reply assembled from a streamed answer's server-sent events."""


def made_safe(reply: ModelReply, attempts: int, duration_ms: float, max_bytes: int) -> ModelCall:
    """The call with its answer passed through output safety, as every output that reaches
    the log is: the text (plans, thoughts and final answers are made of it) and the
    arguments of each call (a secret the model repeats must not reach a tool's event)."""
    redacted: dict[str, int] = {}
    neutralised: dict[str, int] = {}

    def count(safe: SafeOutput) -> None:
        for counts, fired in ((redacted, safe.redacted_by), (neutralised, safe.neutralised_by)):
            for name, times in fired.items():
                counts[name] = counts.get(name, 0) + times

    content, safe = make_text_safe(reply.content, max_bytes=max_bytes)
    count(safe)
    calls: list[ModelToolCall] = []
    for call in reply.tool_calls:
        arguments, safe = _safe_arguments(call.arguments, max_bytes)
        count(safe)
        changed = arguments is not call.arguments
        calls.append(call.model_copy(update={"arguments": arguments}) if changed else call)
    safe_reply = reply.model_copy(update={"content": content, "tool_calls": tuple(calls)})
    return ModelCall(safe_reply, attempts, duration_ms, redacted, neutralised)


def _safe_arguments(arguments: str, max_bytes: int) -> tuple[str, SafeOutput]:
    """Arguments made safe value by value, so that they stay the JSON they were; arguments
    that are not JSON are made safe as text (the planner asks the model to repair them).
    Instructions in them are counted, not marked: they are what the tool is to do."""
    try:
        parsed: JsonValue = json.loads(arguments)
    except ValueError:
        return make_text_safe(arguments, max_bytes=max_bytes)
    safe = make_safe(parsed, max_bytes=max_bytes, mark_instructions=False)
    if not (safe.redacted_by or safe.truncated):
        return arguments, safe
    return json.dumps(safe.output, ensure_ascii=False), safe


class _Retry(Exception):
    def __init__(self, reason: str, after_s: float | None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.after_s = after_s


async def _sse(lines: AsyncIterator[str]) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """Server-sent events as (event name, JSON data); OpenAI's `[DONE]` ends the stream."""
    name = ""
    async for line in lines:
        if line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:"):
            data = line[5:].strip()
            if data == "[DONE]":
                return
            if data:
                yield name, json.loads(data)
        elif not line:
            name = ""


class OpenAIChat(ModelClient):
    """Chat Completions with function tools."""

    provider = "openai"
    path = "/chat/completions"

    def headers(self) -> dict[str, str]:
        key = self._settings.api_key()
        return {"authorization": f"Bearer {key}"} if key else {}

    def body(
        self, request: ModelRequestRecord, tools: Sequence[ToolSpec], names: _ToolNames
    ) -> dict[str, Any]:
        messages: list[dict[str, Any]] = []
        if request.system:
            messages.append({"role": "system", "content": request.system})
        messages.extend(_openai_message(message, names) for message in request.messages)
        body: dict[str, Any] = {
            "model": request.model,
            "messages": messages,
            "max_tokens": request.max_tokens,
            "temperature": 0,
        }
        if tools:
            body["tools"] = [
                {
                    "type": "function",
                    "function": {
                        "name": names.wire(tool.name),
                        "description": tool.description,
                        "parameters": tool.parameters,
                    },
                }
                for tool in tools
            ]
        if self._settings.llm_stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        return body

    def read(self, answer: dict[str, Any], names: _ToolNames) -> ModelReply:
        choice = answer["choices"][0]
        message = choice["message"]
        calls = tuple(
            ModelToolCall(
                id=call["id"],
                name=names.ours(call["function"]["name"]),
                arguments=call["function"].get("arguments") or "",
            )
            for call in message.get("tool_calls") or ()
        )
        usage = answer.get("usage") or {}
        return ModelReply(
            content=message.get("content") or "",
            tool_calls=calls,
            stop_reason=choice.get("finish_reason") or "",
            usage=ModelUsage(
                input_tokens=usage.get("prompt_tokens", 0),
                output_tokens=usage.get("completion_tokens", 0),
            ),
        )

    async def read_stream(
        self, events: AsyncIterator[tuple[str, dict[str, Any]]], names: _ToolNames
    ) -> ModelReply:
        text: list[str] = []
        calls: dict[int, dict[str, str]] = {}
        stop_reason = ""
        usage: dict[str, int] = {}
        async for _, chunk in events:
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices") or ():
                delta = choice.get("delta") or {}
                text.append(delta.get("content") or "")
                for part in delta.get("tool_calls") or ():
                    call = calls.setdefault(part["index"], {"id": "", "name": "", "arguments": ""})
                    function = part.get("function") or {}
                    call["id"] = part.get("id") or call["id"]
                    call["name"] += function.get("name") or ""
                    call["arguments"] += function.get("arguments") or ""
                stop_reason = choice.get("finish_reason") or stop_reason
        return ModelReply(
            content="".join(text),
            tool_calls=tuple(
                ModelToolCall(id=c["id"], name=names.ours(c["name"]), arguments=c["arguments"])
                for _, c in sorted(calls.items())
            ),
            stop_reason=stop_reason,
            usage=ModelUsage(
                input_tokens=usage.get("prompt_tokens", 0),
                output_tokens=usage.get("completion_tokens", 0),
            ),
        )


def _openai_message(message: ModelMessage, names: _ToolNames) -> dict[str, Any]:
    if message.role == "tool":
        return {"role": "tool", "tool_call_id": message.tool_call_id, "content": message.content}
    wire: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        wire["content"] = message.content or None
        wire["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": names.wire(call.name), "arguments": call.arguments},
            }
            for call in message.tool_calls
        ]
    return wire


class AnthropicMessages(ModelClient):
    """The Messages API with tool use."""

    provider = "anthropic"
    path = "/v1/messages"

    def headers(self) -> dict[str, str]:
        headers = {"anthropic-version": ANTHROPIC_VERSION}
        key = self._settings.api_key()
        if key:
            headers["x-api-key"] = key
        return headers

    def body(
        self, request: ModelRequestRecord, tools: Sequence[ToolSpec], names: _ToolNames
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": request.model,
            "messages": _anthropic_messages(request.messages, names),
            "max_tokens": request.max_tokens,
            "temperature": 0,
        }
        if request.system:
            body["system"] = request.system
        if tools:
            body["tools"] = [
                {
                    "name": names.wire(tool.name),
                    "description": tool.description,
                    "input_schema": tool.parameters,
                }
                for tool in tools
            ]
        if self._settings.llm_stream:
            body["stream"] = True
        return body

    def read(self, answer: dict[str, Any], names: _ToolNames) -> ModelReply:
        text: list[str] = []
        calls: list[ModelToolCall] = []
        for block in answer["content"]:
            if block["type"] == "text":
                text.append(block["text"])
            elif block["type"] == "tool_use":
                arguments = json.dumps(block.get("input") or {})
                calls.append(
                    ModelToolCall(
                        id=block["id"], name=names.ours(block["name"]), arguments=arguments
                    )
                )
        usage = answer.get("usage") or {}
        return ModelReply(
            content="".join(text),
            tool_calls=tuple(calls),
            stop_reason=answer.get("stop_reason") or "",
            usage=ModelUsage(
                input_tokens=usage.get("input_tokens", 0),
                output_tokens=usage.get("output_tokens", 0),
            ),
        )

    async def read_stream(
        self, events: AsyncIterator[tuple[str, dict[str, Any]]], names: _ToolNames
    ) -> ModelReply:
        blocks: dict[int, dict[str, str]] = {}
        stop_reason = ""
        input_tokens = output_tokens = 0
        async for name, data in events:
            kind = data.get("type", name)
            if kind == "message_start":
                input_tokens = data["message"].get("usage", {}).get("input_tokens", 0)
            elif kind == "content_block_start":
                block = data["content_block"]
                blocks[data["index"]] = {
                    "type": block["type"],
                    "text": block.get("text", ""),
                    "id": block.get("id", ""),
                    "name": block.get("name", ""),
                    "json": "",
                }
            elif kind == "content_block_delta":
                delta = data["delta"]
                block = blocks[data["index"]]
                block["text"] += delta.get("text", "")
                block["json"] += delta.get("partial_json", "")
            elif kind == "message_delta":
                stop_reason = data.get("delta", {}).get("stop_reason") or stop_reason
                output_tokens = data.get("usage", {}).get("output_tokens", output_tokens)
            elif kind == "error":
                raise _Retry(f"stream error: {data.get('error')}", None)
        ordered = [blocks[index] for index in sorted(blocks)]
        return ModelReply(
            content="".join(b["text"] for b in ordered if b["type"] == "text"),
            tool_calls=tuple(
                ModelToolCall(id=b["id"], name=names.ours(b["name"]), arguments=b["json"] or "{}")
                for b in ordered
                if b["type"] == "tool_use"
            ),
            stop_reason=stop_reason,
            usage=ModelUsage(input_tokens=input_tokens, output_tokens=output_tokens),
        )


def _anthropic_messages(
    messages: Sequence[ModelMessage], names: _ToolNames
) -> list[dict[str, Any]]:
    """Messages alternate user and assistant; tool results travel in user messages."""
    wire: list[dict[str, Any]] = []
    for message in messages:
        role = "assistant" if message.role == "assistant" else "user"
        blocks: list[dict[str, Any]] = []
        if message.role == "tool":
            blocks.append(
                {
                    "type": "tool_result",
                    "tool_use_id": message.tool_call_id,
                    "content": message.content,
                }
            )
        elif message.content:
            blocks.append({"type": "text", "text": message.content})
        for call in message.tool_calls:
            blocks.append(
                {
                    "type": "tool_use",
                    "id": call.id,
                    "name": names.wire(call.name),
                    "input": _arguments_object(call.arguments),
                }
            )
        if wire and wire[-1]["role"] == role:
            wire[-1]["content"].extend(blocks)
        else:
            wire.append({"role": role, "content": blocks})
    return wire


def _arguments_object(arguments: str) -> dict[str, Any]:
    # A tool_use block must carry an object; a malformed one the model sent is shown as empty
    # (the tool result that follows tells the model what was wrong with it).
    try:
        parsed = json.loads(arguments or "{}")
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def model_client(settings: PlannerSettings) -> ModelClient:
    """The client of the configured provider."""
    if settings.llm_provider == "anthropic":
        return AnthropicMessages(settings)
    return OpenAIChat(settings)


def cost_usd(settings: PlannerSettings, model: str, usage: ModelUsage) -> float | None:
    """What a call cost at the configured price of its model; None when no price is known."""
    price = settings.llm_prices.get(model)
    if price is None:
        return None
    per_input, per_output = price
    return (usage.input_tokens * per_input + usage.output_tokens * per_output) / 1_000_000
