"""``POST /v1/runs``'s body: the run as JSON, or a workspace archive beside it.

A run seeded from an archive is created in one request, ``multipart/form-data`` with two
parts: ``run`` (the same JSON object as a JSON body) and ``archive`` (a tar, tar.gz or zip,
at most ``HARNESS_ARCHIVE_MAX_BYTES``: 413 past it). The API keeps the archive in a
temporary file for as long as the request lasts and starts the run with it as the Python
client does (``start_run(archive=PATH)``: uploaded through Redis, checked against its
SHA-256 and unpacked by the worker, :mod:`worker.store.transfer`).

One request, not an upload and a reference to it: an API process behind a load balancer
keeps nothing between two requests.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile

from worker.api import schemas
from worker.api.errors import ApiError

MULTIPART = "multipart/form-data"
RUN_PART = "run"
ARCHIVE_PART = "archive"

REQUEST_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/RunCreate"}},
            MULTIPART: {
                "schema": {
                    "type": "object",
                    "required": [RUN_PART, ARCHIVE_PART],
                    "properties": {
                        RUN_PART: {
                            "type": "string",
                            "description": "the run as JSON (RunCreate)",
                        },
                        ARCHIVE_PART: {
                            "type": "string",
                            "format": "binary",
                            "description": "a tar, tar.gz or zip unpacked into the workspace "
                            "(at most HARNESS_ARCHIVE_MAX_BYTES)",
                        },
                    },
                },
                "encoding": {RUN_PART: {"contentType": "application/json"}},
            },
        },
    }
}
"""The operation's body in the OpenAPI document (its route reads the body itself)."""


def is_multipart(headers: Any) -> bool:
    return str(headers.get("content-type", "")).lower().startswith(MULTIPART)


def parse_run(raw: bytes | str) -> schemas.RunCreate:
    """The JSON of a run, refused as FastAPI refuses a body (422, ``body.FIELD``)."""
    try:
        data = json.loads(raw) if raw else None
    except (ValueError, RecursionError) as exc:  # RecursionError: nested past Python's depth
        position = getattr(exc, "pos", 0)
        problem = {"type": "json_invalid", "loc": ("body", position), "msg": "JSON decode error"}
        raise RequestValidationError([problem]) from None
    if data is None:
        missing = {"type": "missing", "loc": ("body",), "msg": "Field required"}
        raise RequestValidationError([missing])
    try:
        return cast(schemas.RunCreate, schemas.RunCreate.model_validate(data))
    except ValidationError as exc:
        problems = [
            {**error, "loc": ("body", *error["loc"])} for error in exc.errors(include_url=False)
        ]
        raise RequestValidationError(problems) from None


def too_large(max_bytes: int) -> ApiError:
    return ApiError(
        413,
        "too_large",
        f"the archive is over the operator's limit of {max_bytes} bytes "
        "(HARNESS_ARCHIVE_MAX_BYTES)",
    )


@contextlib.asynccontextmanager
async def run_request(
    request: Request, archive_max_bytes: int, part_max_bytes: int
) -> AsyncIterator[tuple[schemas.RunCreate, Path | None]]:
    """The run a request asks for, and the path of its archive while the request lasts."""
    if not is_multipart(request.headers):
        yield parse_run(await request.body()), None
        return
    form = await request.form(max_files=2, max_fields=1, max_part_size=part_max_bytes)
    folder: Path | None = None
    try:
        part, archive = form.get(RUN_PART), form.get(ARCHIVE_PART)
        run = await part.read(part_max_bytes + 1) if isinstance(part, UploadFile) else part
        if run is None or not isinstance(archive, UploadFile):
            raise ApiError(
                400,
                "invalid_input",
                f"a multipart run has a '{RUN_PART}' part (its JSON) and an "
                f"'{ARCHIVE_PART}' part (the file)",
            )
        body = parse_run(run)
        if archive.size is None or archive.size > archive_max_bytes:
            raise too_large(archive_max_bytes)
        folder = Path(tempfile.mkdtemp(prefix="harness-upload-"))
        path = folder / "archive"
        await run_in_threadpool(_save, archive, path)
        yield body, path
    finally:
        await form.close()
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)


def _save(archive: UploadFile, path: Path) -> None:
    archive.file.seek(0)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        shutil.copyfileobj(archive.file, out, 1024 * 1024)


def document(app: FastAPI) -> None:
    """Name RunCreate among the OpenAPI document's schemas (the JSON body above refers to
    it; no route declares it as a parameter, so FastAPI alone would leave it out)."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            spec = generate()
            found = schemas.RunCreate.model_json_schema(ref_template="#/components/schemas/{model}")
            for name, sub in found.pop("$defs", {}).items():
                spec["components"]["schemas"].setdefault(name, sub)
            spec["components"]["schemas"]["RunCreate"] = found
            app.openapi_schema = spec
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
