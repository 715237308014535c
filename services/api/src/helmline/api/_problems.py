"""One error shape for every failure: RFC 9457 problem details (`application/problem+json`)."""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any

import nats.errors
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException

from helmline.contracts import QUOTED_BYTES, bounded_message, cut
from helmline.runtime import EventTooLarge

logger = logging.getLogger(__name__)

PROBLEM_MEDIA_TYPE = "application/problem+json"


class FieldProblem(BaseModel):
    """One thing wrong with the request."""

    field: str
    """Where: `body.playbook.steps.0.tool`, `query.limit`, ..."""
    message: str
    """What is wrong with it."""


class ProblemDetails(BaseModel):
    """What went wrong, for people and programs alike."""

    type: str = "about:blank"
    title: str
    """The kind of problem, e.g. "Not Found"."""
    status: int
    """The HTTP status."""
    detail: str
    """This occurrence, in words: what was wrong and, where it helps, what to do."""
    errors: list[FieldProblem] = []
    """Each invalid field, for a request that did not validate."""


class Problem(Exception):
    """Raised by a route to answer with problem details."""

    def __init__(
        self,
        status: int,
        title: str,
        detail: str,
        errors: list[FieldProblem] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.title = title
        self.detail = detail
        self.errors = errors or []
        self.headers = headers or {}


def not_found(detail: str) -> Problem:
    return Problem(404, "Not Found", detail)


def conflict(detail: str) -> Problem:
    return Problem(409, "Conflict", detail)


def forbidden(detail: str) -> Problem:
    return Problem(403, "Forbidden", detail)


MESSAGE_BYTES = 4 * QUOTED_BYTES
"""Longest message about one field: past it a message is cut, whatever it quotes."""


def invalid(problems: list[FieldProblem]) -> Problem:
    """A request that does not validate, each field at fault named (the first few also in
    the detail), no message longer than `MESSAGE_BYTES`."""
    problems = [
        FieldProblem(field=cut(p.field, MESSAGE_BYTES), message=cut(p.message, MESSAGE_BYTES))
        for p in problems
    ]
    summary = "; ".join(f"{p.field}: {p.message}" for p in problems[:5])
    return Problem(422, "Invalid Request", summary, errors=problems)


def problem_response(
    problem: ProblemDetails, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse(
        problem.model_dump(mode="json"),
        status_code=problem.status,
        media_type=PROBLEM_MEDIA_TYPE,
        headers=headers,
    )


PROBLEM_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ProblemDetails, "content": {PROBLEM_MEDIA_TYPE: {}}, "description": text}
    for status, text in (
        (401, "No valid API key or bearer token"),
        (403, "The principal lacks the role"),
        (
            413,
            "The body is larger than HELMLINE_API_MAX_BODY_BYTES (1 MiB by default), or "
            "would make an event larger than the log takes",
        ),
        (422, "The request does not validate"),
    )
}
"""The problems every authenticated route may answer with, for the OpenAPI document."""


def install_problem_handlers(app: FastAPI) -> None:
    @app.exception_handler(Problem)
    async def on_problem(request: Request, error: Problem) -> JSONResponse:
        return problem_response(
            ProblemDetails(
                title=error.title, status=error.status, detail=error.detail, errors=error.errors
            ),
            error.headers or None,
        )

    @app.exception_handler(HTTPException)
    async def on_http(request: Request, error: HTTPException) -> JSONResponse:
        title = _title(error.status_code)
        detail = error.detail if isinstance(error.detail, str) else title
        return problem_response(
            ProblemDetails(title=title, status=error.status_code, detail=detail),
            dict(error.headers) if error.headers else None,
        )

    @app.exception_handler(RequestValidationError)
    async def on_invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        problems = [
            FieldProblem(
                field=".".join(str(part) for part in e["loc"]),
                message=bounded_message(e["msg"], e.get("input")),
            )
            for e in error.errors()
        ]
        return await on_problem(request, invalid(problems))

    @app.exception_handler(EventTooLarge)
    async def on_too_large(request: Request, error: EventTooLarge) -> JSONResponse:
        # Before nats.errors.Error: trying again cannot help, and nothing was appended.
        return problem_response(
            ProblemDetails(
                title="Content Too Large",
                status=413,
                detail=f"{error}: nothing was appended; send less (a smaller playbook, "
                "goal, labels or arguments)",
            )
        )

    @app.exception_handler(nats.errors.Error)
    @app.exception_handler(TimeoutError)
    async def on_log_unavailable(request: Request, error: Exception) -> JSONResponse:
        logger.warning("event log unavailable for %s %s: %r", request.method, request.url, error)
        return problem_response(
            ProblemDetails(
                title="Service Unavailable",
                status=503,
                detail="the event log did not answer in time; try again shortly",
            ),
            {"Retry-After": "1"},
        )

    @app.exception_handler(Exception)
    async def on_unexpected(request: Request, error: Exception) -> JSONResponse:
        logger.exception("unexpected error answering %s %s", request.method, request.url.path)
        return problem_response(
            ProblemDetails(
                title="Internal Server Error",
                status=500,
                detail=f"the API failed unexpectedly ({type(error).__name__}); it is logged",
            )
        )


def _title(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"
