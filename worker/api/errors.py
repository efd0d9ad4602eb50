"""The API's errors: ``{"error": {"type", "message"}}`` with the status that fits.

The client's typed errors (:mod:`worker.errors`) map to statuses here, once; a request the
schema refuses is 422 with the field's path; a body too big 413; Redis out of reach 503
``unavailable`` with ``Retry-After``, wherever it is met (the rate limit, a route, a stream's
start); anything unforeseen 500 with no detail (the log has it: a response never holds a
URL, a secret or a path of ours).
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from worker.api.middleware import DEFAULT_CSP, SECURITY_HEADERS
from worker.errors import (
    AnswerRefused,
    BudgetSpent,
    HarnessError,
    InvalidInput,
    Refused,
    RequestNotFound,
    RunBusy,
    RunEnded,
    RunNotFound,
    TurnWaitTimeout,
    Unavailable,
)
from worker.store.errors import REDIS_ERRORS
from worker.store.idempotency import IdempotencyInProgress, IdempotencyMismatch

log = logging.getLogger("worker.api")

RETRY_UNAVAILABLE_S = 5
"""The ``Retry-After`` of a 503: Redis or the broker is out of reach (a restart, a failover)."""


class ErrorDetail(BaseModel):
    type: str
    message: str
    path: str | None = None
    """For 422: the refused field, as ``body.labels.team``."""


class ErrorBody(BaseModel):
    error: ErrorDetail


class ApiError(Exception):
    def __init__(
        self, status: int, kind: str, message: str, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.message = message
        self.headers = headers or {}


def not_found(run_id: str) -> ApiError:
    return ApiError(404, "not_found", f"unknown run {run_id[:40]!r}")


# The order matters: a subclass before its base.
_STATUSES: tuple[tuple[type[HarnessError], int, str], ...] = (
    (BudgetSpent, 409, "budget_spent"),
    (IdempotencyMismatch, 422, "idempotency_mismatch"),
    (IdempotencyInProgress, 409, "in_progress"),
    (InvalidInput, 400, "invalid_input"),
    (RunNotFound, 404, "not_found"),
    (RequestNotFound, 404, "not_found"),
    (RunBusy, 409, "run_busy"),
    (RunEnded, 409, "run_ended"),
    (AnswerRefused, 409, "answer_refused"),
    (Refused, 409, "refused"),
    (TurnWaitTimeout, 504, "timeout"),
    (Unavailable, 503, "unavailable"),
)

ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody, "description": text}
    for status, text in (
        (400, "Invalid input or beyond policy"),
        (401, "Missing or unknown API key"),
        (403, "A run page link does not allow this call (worker/api/links.py)"),
        (404, "No such run of this tenant"),
        (409, "The run is busy or has ended, or the request was refused"),
        (413, "Request body too large"),
        (422, "The request does not match its schema"),
        (429, "Rate limit reached, too many wrong keys or open streams (see Retry-After)"),
        (503, "Redis or the broker cannot be reached (see Retry-After)"),
    )
}


def body(status: int, kind: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"error": {"type": kind, "message": message, **extra}}


def respond(exc: ApiError) -> JSONResponse:
    return JSONResponse(body(exc.status, exc.kind, exc.message), exc.status, headers=exc.headers)


def unavailable(message: str) -> JSONResponse:
    """503 with ``Retry-After``."""
    return JSONResponse(
        body(503, "unavailable", f"{message}; retry later"),
        503,
        headers={"Retry-After": str(RETRY_UNAVAILABLE_S)},
    )


def _json_syntax(error: dict[str, Any], document: object) -> str:
    """Where a body's JSON breaks, as an editor says it (its ``loc`` holds a character
    offset, not a field)."""
    reason = str((error.get("ctx") or {}).get("error") or "not JSON")
    loc = error.get("loc", ())
    position = loc[1] if len(loc) > 1 and isinstance(loc[1], int) else None
    if isinstance(document, bytes):
        document = document.decode("utf-8", "replace")
    if position is None or not isinstance(document, str):
        return f"invalid JSON: {reason}"
    line = document.count("\n", 0, position) + 1
    column = position - document.rfind("\n", 0, position)
    return f"invalid JSON at line {line} column {column}: {reason}"


def install(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api(_: Request, exc: ApiError) -> JSONResponse:
        return respond(exc)

    @app.exception_handler(HarnessError)
    async def _harness(_: Request, exc: HarnessError) -> JSONResponse:
        if isinstance(exc, Unavailable):
            log.warning("api.unavailable", extra={"error": str(exc)})
            # A translated Redis or broker error names their address: not said.
            return unavailable(
                "Redis or the broker cannot be reached" if exc.__cause__ else str(exc)
            )
        for kind, status, name in _STATUSES:
            if isinstance(exc, kind):
                wait = getattr(exc, "retry_after_s", None)
                headers = {"Retry-After": str(wait)} if wait is not None else None
                return JSONResponse(body(status, name, str(exc)), status, headers=headers)
        return JSONResponse(body(500, "error", str(exc)), 500)

    async def _redis_away(_: Request, exc: Exception) -> JSONResponse:
        log.warning("api.unavailable", extra={"error": str(exc)})
        return unavailable("Redis cannot be reached")

    # The API's own async Redis calls (the rate limit, ownership checks, a stream's start)
    # raise these; the client's calls raise Unavailable, above.
    for error in REDIS_ERRORS:
        app.add_exception_handler(error, _redis_away)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        if first.get("type") == "json_invalid":
            message = _json_syntax(first, exc.body)
            return JSONResponse(body(422, "invalid_request", message, path="body"), 422)
        path = ".".join(str(p) for p in first.get("loc", ()))
        message = f"{path}: {first.get('msg', 'invalid')}" if path else str(first.get("msg"))
        return JSONResponse(body(422, "invalid_request", message, path=path), 422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        kinds = {404: "not_found", 405: "method_not_allowed", 401: "unauthorized"}
        return JSONResponse(
            body(exc.status_code, kinds.get(exc.status_code, "error"), str(exc.detail)),
            exc.status_code,
            headers=getattr(exc, "headers", None),
        )

    @app.exception_handler(Exception)
    async def _unforeseen(_: Request, exc: Exception) -> JSONResponse:
        log.exception("api.error", exc_info=exc)
        # Answered by the server-error middleware, outside SecurityHeaders: its headers here.
        headers = {**SECURITY_HEADERS, "Content-Security-Policy": DEFAULT_CSP}
        return JSONResponse(body(500, "internal", "internal error"), 500, headers=headers)
