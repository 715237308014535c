"""Helpers for testing code that runs on Helmline's event log, against a real nats-server.

Other teams can use them too: start a throwaway JetStream server, wait on conditions.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import ObjectInfo
from nats.js.object_store import OBJ_STREAM_TEMPLATE

from helmline.contracts import (
    EVENTS_STREAM,
    Actor,
    ApprovalDecisionSubmitted,
    ApprovalRequested,
    Event,
    Playbook,
    SessionStarted,
    SessionState,
    ThoughtRecorded,
    decode_event,
    event_type_filter,
    new_event,
)
from helmline.runtime._classifier import InjectionClassifierKind
from helmline.runtime._durability import Durability, jetstream_config
from helmline.runtime._embedded import nats_server_binary, reserve_ports
from helmline.runtime._object_meta import chunks_subject, meta_subject
from helmline.runtime._store import EventStore


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (`reserve_ports` for
    several at once: two calls may hand out the same port)."""
    return reserve_ports(1)[0]


class NatsServer:
    """A nats-server with JetStream on a free port, storing under `store_dir`, for tests."""

    def __init__(
        self,
        store_dir: Path,
        port: int | None = None,
        config: Path | None = None,
        *,
        durability: Durability = "durable",
        monitor_port: int | None = None,
    ) -> None:
        """With `config`, the server runs from that configuration file (which must listen on
        127.0.0.1 at `port` and store under `store_dir`); without, from one written into
        `store_dir` that fsyncs every append before acknowledging it unless `durability` is
        relaxed, as `helmline up` runs it, and serves `/varz` on `monitor_port` if given."""
        self.store_dir = store_dir
        # Drawn together with nothing else, so never the monitor's port.
        self.port = port or next(p for p in reserve_ports(2) if p != monitor_port)
        self.config = config
        self.durability = durability
        self.monitor_port = monitor_port
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """Where clients connect."""
        return f"nats://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        """The running server's process id."""
        return self._process.pid if self._process is not None else None

    def start(self, timeout_s: float = 10.0) -> None:
        """Start the server and wait until it accepts connections."""
        config = self.config or self._write_config()
        with (self.store_dir / "nats-server.log").open("ab") as log:
            self._process = subprocess.Popen(
                [str(nats_server_binary()), "-c", str(config)],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout_s
        while True:
            if self._process.poll() is not None:
                raise RuntimeError(f"nats-server exited: see {self.store_dir}/nats-server.log")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)

    def kill(self) -> None:
        """SIGKILL: what it had not written to the page cache is lost, nothing else."""
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait(timeout=10)

    def _write_config(self) -> Path:
        config: dict[str, Any] = {
            "listen": f"127.0.0.1:{self.port}",
            "jetstream": jetstream_config(self.store_dir, self.durability),
        }
        if self.monitor_port is not None:
            config["http"] = f"127.0.0.1:{self.monitor_port}"
        path = self.store_dir / "nats-server.conf"
        # The server's configuration format reads JSON.
        path.write_text(json.dumps(config, indent=2))
        return path

    def stop(self) -> None:
        """Stop the server."""
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            self._process.wait(timeout=10)

    def __enter__(self) -> NatsServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


class ServiceProcesses:
    """Helmline services, each a real process (`python -m helmline.<name>`), that tests and
    benchmarks can start, kill with SIGKILL and start again; logs go to `data_dir`."""

    def __init__(self, nats_url: str, data_dir: Path, env: Mapping[str, str] | None = None) -> None:
        self.nats_url = nats_url
        self.data_dir = data_dir
        self.env = dict(env or {})
        """More environment for every service (OTEL_* settings, credentials...)."""
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.ports: dict[str, int] = {}

    def start(
        self, name: str, env: Mapping[str, str] | None = None, script: Path | None = None
    ) -> None:
        """Start one service (again, on the same health port) and wait until it is ready;
        `env` adds to its environment (its own settings, its own NATS user); `script` runs a
        test's own wiring of a service instead of `python -m helmline.<name>`."""
        port = self.ports.setdefault(name, free_port())
        env = {
            **os.environ,
            "HELMLINE_NATS_URL": self.nats_url,
            "HELMLINE_DATA_DIR": str(self.data_dir),
            "HELMLINE_HEALTH_PORT": str(port),
            **self.env,
            **(env or {}),
        }
        with (self.data_dir / f"{name}.log").open("ab") as log:
            self.processes[name] = subprocess.Popen(
                [sys.executable, str(script)]
                if script
                else [sys.executable, "-m", f"helmline.{name}"],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self._wait_ready(name)

    def kill(self, name: str) -> None:
        """SIGKILL: no chance to finish anything."""
        process = self.processes.pop(name)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=10)

    def stop_all(self) -> None:
        """SIGTERM every process and wait for each (SIGKILL after 15 s)."""
        for process in self.processes.values():
            process.terminate()
        for process in self.processes.values():
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.processes.clear()

    def _wait_ready(self, name: str, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        url = f"http://127.0.0.1:{self.ports[name]}/readyz"
        while time.monotonic() < deadline:
            if self.processes[name].poll() is not None:
                log = (self.data_dir / f"{name}.log").read_text()[-2000:]
                raise RuntimeError(f"{name} exited while starting:\n{log}")
            try:
                with urllib.request.urlopen(url, timeout=1) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.05)
        raise TimeoutError(f"{name} was not ready within {timeout_s} s")


async def eventually(
    check: Callable[[], Any],
    *,
    timeout_s: float = 10.0,
    interval_s: float = 0.01,
    what: str = "condition",
) -> Any:
    """Wait until `check` returns something truthy and return it; fail after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if isinstance(result, Awaitable):
            result = await result
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not hold within {timeout_s} s")
        await asyncio.sleep(interval_s)


async def stored_log(js: JetStreamContext) -> bytes:
    """Every message of the events stream as stored, headers and body, every tenant's: to
    look for what must never be in the log, whatever event or header it would be in."""
    last = (await js.stream_info(EVENTS_STREAM.name)).state.last_seq
    raw = bytearray()
    for seq in range(1, last + 1):
        message = await js.get_msg(EVENTS_STREAM.name, seq)
        raw += json.dumps(message.headers or {}).encode() + (message.data or b"")
    return bytes(raw)


def session_started(tenant: str, session_id: str | None = None) -> Event:
    """The `session.started` of a session with no plan, started by "ana" (a new session
    unless `session_id` names one)."""
    return new_event(
        SessionStarted(goal="g", requested_by=Actor(id="ana")),
        tenant=tenant,
        session_id=session_id or uuid.uuid4().hex,
        source="test",
    )


async def push_out(store: EventStore, gone: Event, by: Event) -> None:
    """Append thoughts to the session of `by` until the log holds no event of the session of
    `gone` any more, as retention would remove it (the events stream must have a byte
    limit, as `HELMLINE_EVENTS_MAX_BYTES` sets)."""
    for batch in range(1_000):
        if await store.last_seq(gone.tenant, gone.session_id) == 0:
            return
        thoughts = [
            by.derive(ThoughtRecorded(kind="observation", text="x" * 200), source="test", key=k)
            for k in (f"{batch}/{i}" for i in range(50))
        ]
        await store.append_pipelined(thoughts)
    raise AssertionError(f"session {gone.session_id} is still in the log: has it no limit?")


async def remains_of(js: JetStreamContext, bucket: str, objects: list[ObjectInfo]) -> int:
    """How many messages of `objects` (as they were put) the bucket's stream still holds:
    their metadata, deletion markers and chunks."""
    subjects = {meta_subject(bucket, o.name) for o in objects}
    subjects |= {chunks_subject(bucket, o.nuid or "") for o in objects}
    stream = OBJ_STREAM_TEMPLATE.format(bucket=bucket)
    held = (await js.stream_info(stream, subjects_filter=">")).state.subjects
    return sum(count for subject, count in (held or {}).items() if subject in subjects)


async def start_playbook(
    store: EventStore, tenant: str, playbook: Playbook, requester: Actor
) -> str:
    """Start a playbook session; its id."""
    session_id = uuid.uuid4().hex
    started = SessionStarted(goal=playbook.goal, playbook=playbook, requested_by=requester)
    await store.append(new_event(started, tenant=tenant, session_id=session_id, source="test"))
    return session_id


async def ended(
    store: EventStore, tenant: str, session_id: str, *, timeout_s: float = 60
) -> SessionState:
    """Wait until the session has ended; its state."""

    async def over() -> SessionState | None:
        state = (await store.load(tenant, session_id)).state
        return state if state.is_terminal else None

    state: SessionState = await eventually(
        over, timeout_s=timeout_s, what=f"session {session_id} to end"
    )
    return state


async def run_playbook(
    store: EventStore, tenant: str, playbook: Playbook, requester: Actor, *, timeout_s: float = 60
) -> str:
    """Start a playbook session and wait until it has ended; its id."""
    session_id = await start_playbook(store, tenant, playbook, requester)
    await ended(store, tenant, session_id, timeout_s=timeout_s)
    return session_id


async def checkpointed(
    store: EventStore, tenant: str, session_id: str, *, timeout_s: float = 60
) -> SessionState:
    """Wait until every step of the session that succeeded has its checkpoint; the state.

    The state service makes checkpoints off the steps' path, some milliseconds late: a
    session may end, or wait for a person, before its last checkpoint is in the log."""

    async def settled() -> SessionState | None:
        state = (await store.load(tenant, session_id)).state
        done = {step.call_id for step in state.steps.values() if step.status == "succeeded"}
        return state if done <= {c.call_id for c in state.checkpoints} else None

    found: SessionState = await eventually(
        settled, timeout_s=timeout_s, what=f"the checkpoints of session {session_id}"
    )
    return found


class AutoApprover:
    """Grants every approval request of a tenant, as a person would, once each; can hold
    requests back for a while, so that no call runs at a chosen moment."""

    def __init__(self, store: EventStore, approver: Actor) -> None:
        self._store = store
        self._approver = approver
        self.holding = False
        self._held: list[Event] = []

    async def receive(self, message: Msg) -> None:
        requested = decode_event(message.data)
        assert isinstance(requested.data, ApprovalRequested)
        if self.holding:
            self._held.append(requested)
        else:
            await self._grant(requested)

    @property
    def held_back(self) -> int:
        """Requests received while holding and not granted yet."""
        return len(self._held)

    async def release(self) -> None:
        """Grant what was held back, and every request from now on."""
        self.holding = False
        held, self._held = self._held, []
        for requested in held:
            await self._grant(requested)

    async def _grant(self, requested: Event) -> None:
        assert isinstance(requested.data, ApprovalRequested)
        vote = ApprovalDecisionSubmitted(
            request_id=requested.data.request_id, decision="grant", decided_by=self._approver
        )
        await self._store.append(requested.derive(vote, source="test/approver"))


@contextlib.asynccontextmanager
async def auto_approver(
    nc: NATS, store: EventStore, tenant: str, approver: Actor
) -> AsyncIterator[AutoApprover]:
    """An `AutoApprover` of the tenant's requests while the block runs."""
    granting = AutoApprover(store, approver)
    subscription = await nc.subscribe(
        event_type_filter(ApprovalRequested.TYPE, tenant), cb=granting.receive
    )
    try:
        yield granting
    finally:
        await subscription.unsubscribe()


@dataclass(frozen=True, slots=True)
class ClassifierReply:
    """One answer of a `ScriptedClassifier`."""

    injection: bool = False
    score: float | None = None
    status: int = 200
    """Anything but 200 answers that status with an error body."""
    hang: bool = False
    """Answer nothing until the server stops (a classifier past its timeout)."""
    body: bytes | None = None
    """This body as it is, instead of the protocol's answer."""


CLASSIFIER_PATHS: Mapping[InjectionClassifierKind, str] = {
    "generic": "/classify",
    "openai-moderation": "/v1/moderations",
    "openai-chat": "/v1/chat/completions",
}


class ScriptedClassifier:
    """An injection classifier: a real HTTP server on a free port speaking each protocol of
    `InjectionClassifierKind` (by path, `CLASSIFIER_PATHS`), answering each text as `decide`
    says (by default, clean). Start it with `with`; `received` holds the requests."""

    def __init__(self, decide: Callable[[str], ClassifierReply] | None = None) -> None:
        self.decide = decide or (lambda _text: ClassifierReply())
        self.received: list[tuple[str, dict[str, Any], str | None]] = []
        """(path, JSON body, Authorization header) of each request, in arrival order."""
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _classifier_handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), daemon=True
        )

    def url(self, kind: InjectionClassifierKind = "generic") -> str:
        """The endpoint of a protocol."""
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}{CLASSIFIER_PATHS[kind]}"

    def texts(self) -> list[str]:
        """The texts asked about, in arrival order."""
        with self._lock:
            return [_text_of(path, body) for path, body, _ in self.received]

    def __enter__(self) -> ScriptedClassifier:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stopping.set()
        self._server.shutdown()
        self._server.server_close()

    def _answer(self, path: str, body: dict[str, Any], authorization: str | None) -> bytes:
        """The response's body; raises `_Status` for an error status."""
        with self._lock:
            self.received.append((path, body, authorization))
        reply = self.decide(_text_of(path, body))
        if reply.hang:
            self._stopping.wait(60)
            raise _Status(503)
        if reply.status != 200:
            raise _Status(reply.status)
        if reply.body is not None:
            return reply.body
        score = reply.score if reply.score is not None else float(reply.injection)
        answer: dict[str, Any]
        if path == CLASSIFIER_PATHS["openai-moderation"]:
            answer = {
                "id": "modr-1",
                "model": body.get("model", "scripted-moderation"),
                "results": [
                    {
                        "flagged": reply.injection,
                        "categories": {"prompt_injection": reply.injection},
                        "category_scores": {"prompt_injection": score},
                    }
                ],
            }
        elif path == CLASSIFIER_PATHS["openai-chat"]:
            word = "injection" if reply.injection else "clean"
            answer = {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "model": body.get("model"),
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": word},
                        "finish_reason": "stop",
                    }
                ],
            }
        else:
            answer = {"injection": reply.injection, "score": reply.score}
        return json.dumps(answer).encode()


class _Status(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


def _text_of(path: str, body: Mapping[str, Any]) -> str:
    if path == CLASSIFIER_PATHS["openai-moderation"]:
        return str(body.get("input", ""))
    if path == CLASSIFIER_PATHS["openai-chat"]:
        messages = body.get("messages") or [{}]
        return str(messages[-1].get("content", ""))
    return str(body.get("text", ""))


def _classifier_handler(classifier: ScriptedClassifier) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass  # Quiet: tests read `received` instead.

        def do_POST(self) -> None:
            if self.path not in CLASSIFIER_PATHS.values():
                self._send(404, b'{"error": "no such endpoint"}')
                return
            length = int(self.headers.get("content-length", "0"))
            body = json.loads(self.rfile.read(length) or b"{}")
            try:
                answer = classifier._answer(self.path, body, self.headers.get("authorization"))
            except _Status as status:
                self._send(status.status, b'{"error": "scripted"}')
                return
            self._send(200, answer)

        def _send(self, status: int, body: bytes) -> None:
            try:
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except OSError:
                pass  # The client gave up waiting (a timeout under test).

    return Handler


CHROMIUM = Path("/usr/bin/chromium")
"""Debian's Chromium, which the console's browser tests and benchmark drive through
Playwright (`tools/system_packages.py` installs it; Playwright's own download fails here)."""
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
)
"""What Chromium needs to run headless as root on a machine with no display or network."""

SHOWN_STEP_COUNTS = """
window.shownCounts = [];
new MutationObserver(() => {
  const text = document.getElementById("summary")?.textContent ?? "";
  const found = /(\\d+)\\/(\\d+) steps/.exec(text);
  const count = found ? Number(found[1]) : null;
  if (count !== null && window.shownCounts.at(-1)?.[1] !== count) {
    window.shownCounts.push([Date.now(), count]);
  }
}).observe(document, { childList: true, subtree: true, characterData: true });
"""
"""A console page's init script: from its first paint, each time the session's summary shows
another count of succeeded steps, `window.shownCounts` notes when (the epoch in ms, as the
log's event times) and which count."""


def display_lags(finished_ms: list[float], shown: list[list[int]]) -> list[float]:
    """How long after the log had k steps succeeded (`finished_ms`, sorted) the page first
    showed at least k (`shown`, as `SHOWN_STEP_COUNTS` noted it), in ms: for each step that
    succeeded after the page first showed a count (it opened after the session started)."""
    opened_at = shown[0][0]
    lags = []
    for k, at in enumerate(finished_ms, start=1):
        if at >= opened_at:
            first_shown = next(when for when, count in shown if count >= k)
            lags.append(max(0.0, first_shown - at))
    return lags
