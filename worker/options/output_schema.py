"""A producer's ``--output-schema``: a JSON Schema, checked where it enters (client and worker).

A schema is checked against its own dialect's metaschema (``$schema``, else the latest
draft ``jsonschema`` knows) with ``check_schema``: ``{"type": "objekt"}`` or
``{"required": "name"}`` is refused here, not discovered when the first answer comes back. It
must be a JSON object (a boolean schema accepts everything or nothing: no result to parse)
and at most ``HARNESS_OUTPUT_SCHEMA_MAX_BYTES`` as JSON.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema
from jsonschema.exceptions import SchemaError

from worker.errors import InvalidInput


def check_output_schema(schema: object, max_bytes: int) -> dict[str, Any]:
    """``schema`` as a valid JSON Schema object, or InvalidInput naming what is wrong."""
    if not isinstance(schema, dict):
        raise InvalidInput(
            f"the output schema must be a JSON object (a JSON Schema), not {type(schema).__name__}"
        )
    try:
        size = len(json.dumps(schema, ensure_ascii=False).encode("utf-8"))
    except (TypeError, ValueError, UnicodeEncodeError) as exc:
        raise InvalidInput(f"the output schema is not JSON: {exc}") from None
    if size > max_bytes:
        raise InvalidInput(
            f"the output schema is {size} bytes, over the operator's limit of {max_bytes} "
            "(HARNESS_OUTPUT_SCHEMA_MAX_BYTES)"
        )
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except SchemaError as exc:
        where = "/".join(str(p) for p in exc.path) or "the top level"
        raise InvalidInput(
            f"the output schema is not a valid JSON Schema: {exc.message} (at {where})"
        ) from None
    return schema


def read_output_schema(text: str, source: str, max_bytes: int) -> dict[str, Any]:
    """A schema from its JSON text (``source`` names the file in errors)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"the output schema {source} is not JSON: {exc}") from None
    return check_output_schema(value, max_bytes)
