"""The bodies of ``POST /v1/runs`` and ``POST /v1/runs/{id}/turns``: JSON, or files beside it.

A run seeded from an archive, or a turn that carries files, is one request,
``multipart/form-data``: a ``run`` (or ``turn``) part, the same JSON object as a JSON body,
then an ``archive`` part (runs only: a tar, tar.gz or zip, at most
``HARNESS_ARCHIVE_MAX_BYTES``: 413 past it) and any number of ``attachment`` parts (each a
file with its name: images and other files, bounded by ``HARNESS_ATTACH_*`` as
``--attach`` is). The API keeps the files in a temporary folder for as long as the request
lasts and hands their paths to the Python client as ``harness run --archive/--attach``
does (uploaded through Redis, checked again by the worker, :mod:`worker.store.transfer`).

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile

from config import Settings
from worker.api import schemas
from worker.api.errors import ApiError
from worker.options.attachments import safe_name

MULTIPART = "multipart/form-data"
RUN_PART = "run"
TURN_PART = "turn"
ARCHIVE_PART = "archive"
ATTACHMENT_PART = "attachment"


def is_multipart(headers: Any) -> bool:
    return str(headers.get("content-type", "")).lower().startswith(MULTIPART)


def parse_run(raw: bytes | str) -> schemas.RunCreate:
    """The JSON of a run, refused as FastAPI refuses a body (422, ``body.FIELD``)."""
    return cast(schemas.RunCreate, _validated(schemas.RunCreate, raw))


def parse_turn(raw: bytes | str) -> schemas.TurnCreate:
    """The JSON of a turn, refused as FastAPI refuses a body (422, ``body.FIELD``)."""
    return cast(schemas.TurnCreate, _validated(schemas.TurnCreate, raw))


def _validated(model: type[BaseModel], raw: bytes | str) -> BaseModel:
    data = _json(raw)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = [
            {**error, "loc": ("body", *error["loc"])} for error in exc.errors(include_url=False)
        ]
        raise RequestValidationError(problems) from None


def _json(raw: bytes | str) -> Any:
    try:
        data = json.loads(raw) if raw else None
    except (ValueError, RecursionError) as exc:  # RecursionError: nested past Python's depth
        position = getattr(exc, "pos", None)
        problem = {
            "type": "json_invalid",
            "loc": ("body",) if position is None else ("body", position),
            "msg": "JSON decode error",
            "ctx": {"error": getattr(exc, "msg", "nested too deep")},
        }
        raise RequestValidationError([problem], body=getattr(exc, "doc", raw)) from None
    if data is None:
        missing = {"type": "missing", "loc": ("body",), "msg": "Field required"}
        raise RequestValidationError([missing])
    return data


def too_large(max_bytes: int) -> ApiError:
    return ApiError(
        413,
        "too_large",
        f"the archive is over the operator's limit of {max_bytes} bytes "
        "(HARNESS_ARCHIVE_MAX_BYTES)",
    )


@dataclass
class Files:
    """The files of a multipart request, in a temporary folder while the request lasts."""

    archive: Path | None = None
    attachments: list[Path] = field(default_factory=list)


@contextlib.asynccontextmanager
async def run_request(
    request: Request, limits: Settings
) -> AsyncIterator[tuple[schemas.RunCreate, Files]]:
    """The run a request asks for, and its archive and attachments while the request lasts."""
    if not is_multipart(request.headers):
        yield parse_run(await request.body()), Files()
        return
    async with _multipart(request, limits, RUN_PART, archive=True) as (raw, files):
        yield parse_run(raw), files


@contextlib.asynccontextmanager
async def turn_request(
    request: Request, limits: Settings
) -> AsyncIterator[tuple[schemas.TurnCreate, Files]]:
    """The turn a request asks for, and its attachments while the request lasts."""
    if not is_multipart(request.headers):
        yield parse_turn(await request.body()), Files()
        return
    async with _multipart(request, limits, TURN_PART, archive=False) as (raw, files):
        yield parse_turn(raw), files


@contextlib.asynccontextmanager
async def _multipart(
    request: Request, limits: Settings, json_part: str, *, archive: bool
) -> AsyncIterator[tuple[bytes | str, Files]]:
    part_max = limits.api_max_body_bytes
    form = await request.form(
        max_files=limits.attach_max_files + 1,
        max_fields=1,
        max_part_size=part_max,
    )
    folder = Path(tempfile.mkdtemp(prefix="harness-upload-"))
    try:
        part = form.get(json_part)
        raw = await part.read(part_max + 1) if isinstance(part, UploadFile) else part
        if raw is None:
            raise ApiError(
                400,
                "invalid_input",
                f"a multipart request has a '{json_part}' part (its JSON)"
                + (f", then an '{ARCHIVE_PART}' part" if archive else "")
                + f" and '{ATTACHMENT_PART}' parts (the files)",
            )
        files = Files()
        found = form.get(ARCHIVE_PART)
        if found is not None:
            if not archive or not isinstance(found, UploadFile):
                raise ApiError(400, "invalid_input", f"no '{ARCHIVE_PART}' part here")
            if found.size is None or found.size > limits.archive_max_bytes:
                raise too_large(limits.archive_max_bytes)
            files.archive = folder / "archive"
            await run_in_threadpool(_save, found, files.archive)
        files.attachments = await _attachments(form.getlist(ATTACHMENT_PART), folder, limits)
        yield raw, files
    finally:
        await form.close()
        shutil.rmtree(folder, ignore_errors=True)


async def _attachments(parts: list[Any], folder: Path, limits: Settings) -> list[Path]:
    """Each ``attachment`` part saved under its name made safe as ``--attach`` makes it
    (a plain file name in our folder, whatever the part says: ``..``, ``a/../b``, a hidden
    name), bounded here first by the operator's limits; the client's checks then apply
    (names, sizes, counts, image bytes)."""
    if len(parts) > limits.attach_max_files:
        raise ApiError(
            413,
            "too_large",
            f"{len(parts)} attachments: at most {limits.attach_max_files} "
            "(HARNESS_ATTACH_MAX_FILES)",
        )
    paths: list[Path] = []
    total = 0
    for part in parts:
        if not isinstance(part, UploadFile):
            raise ApiError(400, "invalid_input", f"an '{ATTACHMENT_PART}' part must be a file")
        given = part.filename or ""
        name = safe_name(given) if given.strip() else ""
        if not name or name in {p.name for p in paths}:
            raise ApiError(400, "invalid_input", f"an attachment needs a name of its own: {name!r}")
        size = part.size or 0
        total += size
        if size > limits.attach_max_bytes or total > limits.attach_max_total_bytes:
            raise ApiError(
                413,
                "too_large",
                f"attachment {name!r} is over the operator's limits "
                "(HARNESS_ATTACH_MAX_BYTES, HARNESS_ATTACH_MAX_TOTAL_BYTES)",
            )
        path = folder / "attachments" / name
        path.parent.mkdir(exist_ok=True)
        await run_in_threadpool(_save, part, path)
        paths.append(path)
    return paths


def _save(upload: UploadFile, path: Path) -> None:
    upload.file.seek(0)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        shutil.copyfileobj(upload.file, out, 1024 * 1024)
