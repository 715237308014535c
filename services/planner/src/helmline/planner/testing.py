"""A scripted model: a real HTTP server speaking the OpenAI Chat Completions and Anthropic
Messages protocols, answering from scripts; and an in-memory world for the goal engine.
For tests and benchmarks; the service never imports this module.

Each conversation finds its script by a key that its first user message contains (say, a
word of the goal), so one server can answer many sessions at once. A script is a list of
replies, used in order, or a function of the request. Replies may be tool calls (with
well-formed or malformed JSON), text, or HTTP errors with a Retry-After; a request that
asks for `stream: true` gets the reply as server-sent events.

    with ScriptedModel() as model:
        model.script("weather", [Reply.call("echo", message="sunny"), Reply.call("finish", ...)])
        settings = PlannerSettings(llm_base_url=model.openai_url)
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

from pydantic import JsonValue

from helmline.contracts import (
    Actor,
    Event,
    PlanApproved,
    PlanProposed,
    SessionStarted,
    StepScheduled,
    ToolCallCompleted,
    ToolCallFailed,
    ToolError,
    new_event,
)
from helmline.planner._engine import GoalEngine
from helmline.planner._prompts import SYSTEM_CLASSIFY, SYSTEM_SUMMARISE

Protocol = Literal["openai", "anthropic"]


@dataclass(frozen=True, slots=True)
class Reply:
    """One scripted answer."""

    text: str = ""
    calls: tuple[tuple[str, str], ...] = ()
    """Tool calls as (name, raw JSON arguments)."""
    status: int = 200
    retry_after: str | None = None
    input_tokens: int = 120
    output_tokens: int = 30

    @classmethod
    def call(cls, name: str, text: str = "", **arguments: JsonValue) -> Reply:
        """A single tool call with well-formed arguments."""
        return cls(text=text, calls=((name, json.dumps(arguments)),))

    @classmethod
    def several(cls, *calls: tuple[str, dict[str, JsonValue]], text: str = "") -> Reply:
        """Several tool calls in one answer (parallel tool calls)."""
        return cls(text=text, calls=tuple((name, json.dumps(args)) for name, args in calls))

    @classmethod
    def malformed(cls, name: str, raw: str) -> Reply:
        """A tool call whose arguments are the given (broken) JSON text."""
        return cls(calls=((name, raw),))

    @classmethod
    def error(cls, status: int, retry_after: str | None = None) -> Reply:
        """An HTTP error, with a Retry-After header when given."""
        return cls(status=status, retry_after=retry_after)


@dataclass(frozen=True, slots=True)
class Received:
    """A request the server received."""

    protocol: Protocol
    body: dict[str, Any]
    headers: dict[str, str]
    at: float
    """`time.monotonic()` on arrival."""

    @property
    def tool_names(self) -> list[str]:
        """Names of the tools offered, as sent on the wire."""
        tools = self.body.get("tools") or []
        if self.protocol == "openai":
            return [tool["function"]["name"] for tool in tools]
        return [tool["name"] for tool in tools]

    @property
    def model(self) -> str:
        """The model asked."""
        return str(self.body.get("model", ""))

    @property
    def purpose(self) -> Literal["summarise", "classify", "turn"]:
        """What the planner asked for, told by the system prompt: an account of compacted
        turns, a classification of the goal, or a turn of the conversation."""
        if self.system.startswith(SYSTEM_SUMMARISE):
            return "summarise"
        return "classify" if self.system == SYSTEM_CLASSIFY else "turn"

    @property
    def system(self) -> str:
        """The system prompt."""
        if self.protocol == "anthropic":
            return str(self.body.get("system", ""))
        messages = self.body.get("messages", [])
        return next((m["content"] for m in messages if m["role"] == "system"), "")

    def texts(self) -> list[str]:
        """The text of every non-system message, tool results included, in order."""
        texts: list[str] = []
        for message in self.body.get("messages", []):
            if message["role"] == "system":
                continue
            content = message.get("content")
            if isinstance(content, str):
                texts.append(content)
            for block in content if isinstance(content, list) else ():
                inner = block.get("text") or block.get("content") or ""
                texts.append(inner if isinstance(inner, str) else json.dumps(inner))
        return texts

    def last_result(self) -> str:
        """The text of the conversation's last message (usually a tool result)."""
        texts = self.texts()
        return texts[-1] if texts else ""


Responder = Callable[[Received], Reply]


def with_asides(
    turns: Sequence[Reply] | Responder,
    *,
    summary: str = "Earlier turns went as planned.",
    intent: str = "",
    tools: Sequence[str] = (),
) -> Responder:
    """A script whose turns of the conversation come from `turns`, and whose summaries and
    classifications (asked on the side) are answered with `summary`, and `intent` and
    `tools` as the classifying model's JSON."""
    replies = turns if callable(turns) else _queue(turns)

    def respond(received: Received) -> Reply:
        match received.purpose:
            case "summarise":
                return Reply(text=summary)
            case "classify":
                return Reply(text=json.dumps({"intent": intent, "tools": list(tools)}))
            case "turn":
                return replies(received)

    return respond


def _queue(replies: Sequence[Reply]) -> Responder:
    queue = list(replies)

    def responder(_: Received) -> Reply:
        if not queue:
            return Reply(status=500, text="the script has no more replies")
        return queue.pop(0)

    return responder


@dataclass(slots=True)
class _Script:
    replies: Responder
    received: list[Received] = field(default_factory=list)


class ScriptedModel:
    """The server; start it with `with`, or `start()` and `stop()`."""

    def __init__(self) -> None:
        self._scripts: dict[str, _Script] = {}
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), daemon=True
        )

    @property
    def url(self) -> str:
        """Base URL for the Anthropic protocol (and the server's root)."""
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def openai_url(self) -> str:
        """Base URL for the OpenAI protocol (ends in /v1)."""
        return self.url + "/v1"

    def start(self) -> ScriptedModel:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> ScriptedModel:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def script(self, key: str, replies: Sequence[Reply] | Responder) -> None:
        """Answer conversations whose first user message contains `key`."""
        responder = replies if callable(replies) else _queue(replies)
        with self._lock:
            self._scripts[key] = _Script(responder)

    def received(self, key: str) -> list[Received]:
        """Requests of the conversations with that key, in arrival order."""
        with self._lock:
            return list(self._scripts[key].received)

    def _answer(self, received: Received) -> Reply:
        texts = received.texts()
        first = texts[0] if texts else ""
        with self._lock:
            script = next((s for key, s in self._scripts.items() if key in first), None)
            if script is None:
                return Reply(status=500, text=f"no script for a conversation starting {first!r}")
            script.received.append(received)
        return script.replies(received)

    def next_id(self) -> int:
        return next(self._ids)


def _handler_for(model: ScriptedModel) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass  # Quiet: tests read `received` instead.

        def do_POST(self) -> None:
            protocol: Protocol
            if self.path.rstrip("/").endswith("/chat/completions"):
                protocol = "openai"
            elif self.path.rstrip("/").endswith("/v1/messages"):
                protocol = "anthropic"
            else:
                self._send_json(404, {"error": {"message": f"no such endpoint {self.path}"}})
                return
            length = int(self.headers.get("content-length", "0"))
            body = json.loads(self.rfile.read(length) or b"{}")
            received = Received(
                protocol=protocol,
                body=body,
                headers={k.lower(): v for k, v in self.headers.items()},
                at=time.monotonic(),
            )
            reply = model._answer(received)
            if reply.status != 200:
                headers = {"retry-after": reply.retry_after} if reply.retry_after else {}
                message = reply.text or f"scripted error {reply.status}"
                self._send_json(reply.status, {"error": {"message": message}}, headers)
                return
            ids = [f"call_{model.next_id()}" for _ in reply.calls]
            if body.get("stream"):
                events = _openai_stream if protocol == "openai" else _anthropic_stream
                self._send_stream(events(reply, ids, str(body.get("model", ""))))
            elif protocol == "openai":
                self._send_json(200, _openai_answer(reply, ids, str(body.get("model", ""))))
            else:
                self._send_json(200, _anthropic_answer(reply, ids, str(body.get("model", ""))))

        def _send_json(
            self, status: int, document: dict[str, Any], headers: dict[str, str] | None = None
        ) -> None:
            raw = json.dumps(document).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(raw)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(raw)

        def _send_stream(self, events: Iterator[str]) -> None:
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("connection", "close")
            self.end_headers()
            for event in events:
                self.wfile.write(event.encode())
                self.wfile.flush()
            self.close_connection = True

    return Handler


def _openai_answer(reply: Reply, ids: list[str], model: str) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.text or None}
    if reply.calls:
        message["tool_calls"] = [
            {"id": id_, "type": "function", "function": {"name": name, "arguments": raw}}
            for id_, (name, raw) in zip(ids, reply.calls, strict=True)
        ]
    return {
        "id": "chatcmpl-scripted",
        "object": "chat.completion",
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if reply.calls else "stop",
            }
        ],
        "usage": {
            "prompt_tokens": reply.input_tokens,
            "completion_tokens": reply.output_tokens,
            "total_tokens": reply.input_tokens + reply.output_tokens,
        },
    }


def _openai_stream(reply: Reply, ids: list[str], model: str) -> Iterator[str]:
    def chunk(choices: list[dict[str, Any]], **extra: Any) -> str:
        document = {"id": "chatcmpl-scripted", "object": "chat.completion.chunk", "model": model}
        return f"data: {json.dumps({**document, 'choices': choices, **extra})}\n\n"

    yield chunk([{"index": 0, "delta": {"role": "assistant", "content": ""}}])
    for piece in _halves(reply.text):
        yield chunk([{"index": 0, "delta": {"content": piece}}])
    for index, (id_, (name, raw)) in enumerate(zip(ids, reply.calls, strict=True)):
        start = {"index": index, "id": id_, "type": "function"}
        yield chunk(
            [
                {
                    "index": 0,
                    "delta": {
                        "tool_calls": [{**start, "function": {"name": name, "arguments": ""}}]
                    },
                }
            ]
        )
        for piece in _halves(raw):
            part = {"index": index, "function": {"arguments": piece}}
            yield chunk([{"index": 0, "delta": {"tool_calls": [part]}}])
    finish = "tool_calls" if reply.calls else "stop"
    yield chunk([{"index": 0, "delta": {}, "finish_reason": finish}])
    usage = {"prompt_tokens": reply.input_tokens, "completion_tokens": reply.output_tokens}
    yield chunk([], usage=usage)
    yield "data: [DONE]\n\n"


def _anthropic_answer(reply: Reply, ids: list[str], model: str) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if reply.text:
        content.append({"type": "text", "text": reply.text})
    for id_, (name, raw) in zip(ids, reply.calls, strict=True):
        try:
            arguments: Any = json.loads(raw)
        except ValueError:
            arguments = raw  # Broken JSON can only reach an Anthropic client as a non-object.
        content.append({"type": "tool_use", "id": id_, "name": name, "input": arguments})
    return {
        "id": "msg_scripted",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": "tool_use" if reply.calls else "end_turn",
        "usage": {"input_tokens": reply.input_tokens, "output_tokens": reply.output_tokens},
    }


def _anthropic_stream(reply: Reply, ids: list[str], model: str) -> Iterator[str]:
    def event(name: str, data: dict[str, Any]) -> str:
        return f"event: {name}\ndata: {json.dumps({'type': name, **data})}\n\n"

    start = {"id": "msg_scripted", "type": "message", "role": "assistant", "model": model}
    usage = {"input_tokens": reply.input_tokens, "output_tokens": 1}
    yield event("message_start", {"message": {**start, "content": [], "usage": usage}})
    index = 0
    if reply.text:
        yield event(
            "content_block_start", {"index": index, "content_block": {"type": "text", "text": ""}}
        )
        for piece in _halves(reply.text):
            delta = {"type": "text_delta", "text": piece}
            yield event("content_block_delta", {"index": index, "delta": delta})
        yield event("content_block_stop", {"index": index})
        index += 1
    for id_, (name, raw) in zip(ids, reply.calls, strict=True):
        block = {"type": "tool_use", "id": id_, "name": name, "input": {}}
        yield event("content_block_start", {"index": index, "content_block": block})
        for piece in _halves(raw):
            delta = {"type": "input_json_delta", "partial_json": piece}
            yield event("content_block_delta", {"index": index, "delta": delta})
        yield event("content_block_stop", {"index": index})
        index += 1
    stop = "tool_use" if reply.calls else "end_turn"
    yield event(
        "message_delta",
        {"delta": {"stop_reason": stop}, "usage": {"output_tokens": reply.output_tokens}},
    )
    yield event("message_stop", {})


def _halves(text: str) -> list[str]:
    """A text in two pieces, so that clients must join the deltas of a stream."""
    middle = len(text) // 2
    return [piece for piece in (text[:middle], text[middle:]) if piece]


class InMemoryWorld:
    """Policy that approves every plan and tools that answer at once, around a goal engine,
    over a log kept in memory: the planner's loop without NATS or other services."""

    def __init__(
        self,
        engine: GoalEngine,
        output: JsonValue = None,
        error: ToolError | None = None,
        *,
        untrusted: bool = False,
    ) -> None:
        self.engine = engine
        self.output = output
        """What every tool call returns; None returns the call's arguments."""
        self.untrusted = untrusted
        """Whether every result comes from an untrusted tool (an MCP tool's, by default)."""
        self.error = error
        """What every tool call fails with instead, when set."""
        self.log: list[Event] = []

    async def run(self, goal: str, mode: Literal["plan", "act"] = "act") -> list[Event]:
        """Run a session for `goal` to its end; its log."""
        started = new_event(
            SessionStarted(goal=goal, mode=mode, requested_by=Actor(id="test")),
            tenant="t",
            session_id=f"s{len(self.log)}",
            source="test",
        )
        self.log.append(started)
        queue = [started]

        async def append(event: Event) -> None:
            queue.append(event)

        while queue:
            event = queue.pop(0)
            if isinstance(
                event.data, SessionStarted | PlanApproved | ToolCallCompleted | ToolCallFailed
            ):
                await self.engine.handle(event, self.log, append)
            for answer in self._answer(event):
                self.log.append(answer)
                queue.append(answer)
        return self.log

    def _answer(self, event: Event) -> list[Event]:
        data = event.data
        if isinstance(data, PlanProposed):
            approved = PlanApproved(revision=data.revision, approved_by=Actor(id="policy"))
            return [event.derive(approved, source="policy")]
        if isinstance(data, StepScheduled) and self.error is not None:
            failed = ToolCallFailed(
                call_id=data.call_id, step_id=data.step_id, tool=data.tool, error=self.error
            )
            return [event.derive(failed, source="tools")]
        if isinstance(data, StepScheduled):
            output = self.output if self.output is not None else data.arguments
            completed = ToolCallCompleted(
                call_id=data.call_id,
                step_id=data.step_id,
                tool=data.tool,
                output=output,
                untrusted=self.untrusted,
            )
            return [event.derive(completed, source="tools")]
        return []
