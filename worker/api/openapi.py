"""The API's OpenAPI document (``GET /openapi.json``): what a generated client is typed by.

FastAPI writes most of it from the routes; this module adds what it cannot see. The bodies
of ``POST /v1/runs`` and ``.../turns`` are read by their routes (JSON, or multipart with
files: :mod:`worker.api.uploads`), so their schemas (RunCreate, TurnCreate) are named here,
with the multipart form as a second content type: a client that sends JSON never meets it.
Every operation's id is stable camelCase: the route's own ``operation_id``, else its
function's name (``list_runs``: ``listRuns``).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.routing import APIRoute
from pydantic.json_schema import models_json_schema

from worker.api import schemas, uploads

_REF = "#/components/schemas/{model}"


def operation_id(route: APIRoute) -> str:
    """The id of an operation that names none: its function's name in camelCase."""
    first, *rest = route.name.split("_")
    return first + "".join(word.capitalize() for word in rest)


def _files(what: str) -> dict[str, Any]:
    return {
        "type": "array",
        "items": {"type": "string", "format": "binary"},
        "description": f"files {what} carries, each with its name (as --attach; "
        "HARNESS_ATTACH_MAX_BYTES, _MAX_FILES, _MAX_TOTAL_BYTES)",
    }


def _body(model: str, part: str, files: dict[str, Any]) -> dict[str, Any]:
    """A request body: ``model`` as JSON, or as the JSON part ``part`` of a multipart form
    beside ``files``."""
    return {
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": {"$ref": _REF.format(model=model)}},
                uploads.MULTIPART: {
                    "schema": {
                        "type": "object",
                        "required": [part],
                        "properties": {part: {"$ref": _REF.format(model=model)}, **files},
                    },
                    "encoding": {part: {"contentType": "application/json"}},
                },
            },
        }
    }


RUN_BODY = _body(
    "RunCreate",
    uploads.RUN_PART,
    {
        uploads.ARCHIVE_PART: {
            "type": "string",
            "format": "binary",
            "description": "a tar, tar.gz or zip unpacked into the workspace "
            "(at most HARNESS_ARCHIVE_MAX_BYTES)",
        },
        uploads.ATTACHMENT_PART: _files("the first turn"),
    },
)
"""``POST /v1/runs``'s body in the document (its route reads the body itself)."""

TURN_BODY = _body("TurnCreate", uploads.TURN_PART, {uploads.ATTACHMENT_PART: _files("the turn")})
"""``POST /v1/runs/{id}/turns``'s body in the document."""

_READ_BODIES = (schemas.RunCreate, schemas.TurnCreate)
"""Models of bodies no route declares as a parameter: FastAPI alone would leave them out."""


def install(app: FastAPI) -> None:
    """Serve the document with the bodies' schemas named among its components."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            spec = generate()
            _, found = models_json_schema(
                [(model, "validation") for model in _READ_BODIES], ref_template=_REF
            )
            known = spec.setdefault("components", {}).setdefault("schemas", {})
            for name, schema in found.get("$defs", {}).items():
                known.setdefault(name, schema)
            app.openapi_schema = spec
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
