"""A producer's ``--output-schema``: a JSON Schema, checked where it enters (client, API and
worker).

A schema is refused here, with the reason, rather than discovered when the first answer
comes back (or when its check never ends):

- it must be a JSON object (a boolean schema accepts everything or nothing: no result to
  parse), at most ``HARNESS_OUTPUT_SCHEMA_MAX_BYTES`` as JSON and nested at most
  ``MAX_DEPTH`` deep (the metaschema check and the answer's check recurse once per level);
- valid against its own dialect's metaschema (``$schema``, else the latest draft
  ``jsonschema`` knows): ``{"type": "objekt"}`` or ``{"required": "name"}``;
- every ``pattern`` and ``patternProperties`` key compiles in RE2 (no back-references or
  look-around: ``worker.options.schema_regex``), at most ``MAX_PATTERNS`` of them;
- every ``$ref`` leads inside the schema (or to a dialect's metaschema): another document
  is never fetched;
- no reference leads back to where it is without descending into a part of the value
  (``{"$ref": "#"}``, ``{"allOf": [{"$ref": "#"}]}``): checking an answer would never end;
- ``$schema`` only at the top (a subschema naming its own dialect would be checked by
  ``jsonschema``'s stock validator, not the RE2 one).

The costly part is done once per schema text (``_passed``): a run record decoded again
holds the same schema.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Iterator, Mapping
from typing import Any

import jsonschema
from jsonschema.exceptions import SchemaError

from worker.errors import InvalidInput
from worker.options import schema_validator
from worker.options.schema_regex import PatternError, compile_pattern

MAX_DEPTH = 64
"""How deep a schema may nest (objects and arrays): ``jsonschema`` recurses once per level
and more, and Python's recursion limit is a thousand frames."""
MAX_PATTERNS = 100
"""Patterns one schema may hold: each compile holds the GIL for up to about 10 ms."""
_PASSED_KEEP = 1024
_passed: dict[str, None] = {}
"""SHA-256 of schema texts that passed the costly checks (forgotten all at once when full)."""


def check_output_schema(schema: object, max_bytes: int) -> dict[str, Any]:
    """``schema`` as a valid JSON Schema object, or InvalidInput naming what is wrong."""
    if not isinstance(schema, dict):
        raise InvalidInput(
            f"the output schema must be a JSON object (a JSON Schema), not {type(schema).__name__}"
        )
    places = _places(schema)
    try:
        text = json.dumps(schema, ensure_ascii=False, sort_keys=True)
        size = len(text.encode("utf-8"))
    except (TypeError, ValueError, UnicodeEncodeError) as exc:
        raise InvalidInput(f"the output schema is not JSON: {exc}") from None
    if size > max_bytes:
        raise InvalidInput(
            f"the output schema is {size} bytes, over the operator's limit of {max_bytes} "
            "(HARNESS_OUTPUT_SCHEMA_MAX_BYTES)"
        )
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    if digest not in _passed:
        _check_dialect(schema)
        _check_structure(schema, places)
        if len(_passed) >= _PASSED_KEEP:
            _passed.clear()
        _passed[digest] = None
    return schema


def read_output_schema(text: str, source: str, max_bytes: int) -> dict[str, Any]:
    """A schema from its JSON text (``source`` names the file in errors)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"the output schema {source} is not JSON: {exc}") from None
    except RecursionError:
        raise InvalidInput(
            f"the output schema {source} is nested deeper than {MAX_DEPTH} levels"
        ) from None
    return check_output_schema(value, max_bytes)


def load_output_schema(path: str, max_bytes: int) -> dict[str, Any]:
    """A schema from the file at ``path``: a regular file of at most ``max_bytes`` bytes
    (``/dev/zero``, a FIFO or a folder is refused, not read without end)."""
    try:
        # O_NONBLOCK: opening a FIFO would otherwise wait for a writer.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise InvalidInput(f"cannot read the output schema {path!r}: {exc.strerror}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise InvalidInput(f"the output schema {path!r} is not a regular file")
        with os.fdopen(os.dup(fd), "rb") as file:
            data = file.read(max_bytes + 1)
    except OSError as exc:
        raise InvalidInput(f"cannot read the output schema {path!r}: {exc.strerror}") from None
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise InvalidInput(f"the output schema {path!r} is over {max_bytes} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidInput(f"cannot read the output schema {path!r}: not UTF-8 text") from None
    return read_output_schema(text, repr(path), max_bytes)


def _places(schema: dict[str, Any]) -> dict[int, str]:
    """Where each object and array of ``schema`` is (a JSON pointer), by ``id``; refuses a
    schema nested deeper than ``MAX_DEPTH``. Iterative: a deep schema is what it refuses."""
    places: dict[int, str] = {}
    seen: set[tuple[int, int]] = set()
    stack: list[tuple[Any, str, int]] = [(schema, "", 1)]
    while stack:
        value, where, depth = stack.pop()
        if isinstance(value, dict):
            children = [(v, f"{where}/{_escaped(k)}") for k, v in value.items()]
        elif isinstance(value, list):
            children = [(v, f"{where}/{i}") for i, v in enumerate(value)]
        else:
            continue
        if depth > MAX_DEPTH:
            raise InvalidInput(
                f"the output schema is nested deeper than {MAX_DEPTH} levels (at {where[:200]}...)"
            )
        if (id(value), depth) in seen:  # an object a caller put in twice, or in itself
            continue
        seen.add((id(value), depth))
        places.setdefault(id(value), where or "/")
        stack.extend((child, place, depth + 1) for child, place in children)
    return places


def _escaped(key: object) -> str:
    return str(key).replace("~", "~0").replace("/", "~1")


def _check_dialect(schema: dict[str, Any]) -> None:
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except SchemaError as exc:
        where = "/".join(str(p) for p in exc.path) or "the top level"
        raise InvalidInput(
            f"the output schema is not a valid JSON Schema: {exc.message} (at {where})"
        ) from None


def _check_structure(schema: dict[str, Any], places: dict[int, str]) -> None:
    """Patterns, references and in-place cycles (the module docstring)."""
    specification, resolver = schema_validator.root_resolver(schema)
    stack = [(specification.create_resource(schema), resolver)]
    steps: dict[int, list[tuple[int, str]]] = {}
    patterns = 0
    while stack:
        resource, resolver = stack.pop()
        node = resource.contents
        if not isinstance(node, dict) or id(node) in steps:
            continue
        where = places.get(id(node), "?")
        if node is not schema and "$schema" in node:
            raise InvalidInput(f"the output schema names $schema at {where}: only its top may")
        for pattern in _patterns_of(node):
            patterns += 1
            if patterns > MAX_PATTERNS:
                raise InvalidInput(f"the output schema holds over {MAX_PATTERNS} patterns")
            try:
                compile_pattern(pattern)
            except PatternError as exc:
                raise InvalidInput(
                    f"the output schema's pattern {pattern[:200]!r} (at {where}) is refused: {exc}"
                ) from None
        steps[id(node)] = [(id(sub), keyword) for keyword, sub in _in_place(node)]
        for keyword in schema_validator.REFERENCE_KEYWORDS:
            reference = node.get(keyword)
            if not isinstance(reference, str):
                continue
            try:
                resolved = schema_validator.resolve(resolver, reference)
            except schema_validator.Unresolvable as exc:
                raise InvalidInput(f"the output schema's {keyword} at {where}: {exc}") from None
            target = resolved.contents
            steps[id(node)].append((id(target), f"{keyword} {reference!r} at {where}"))
            if id(target) in places:  # not a metaschema's
                stack.append((specification.create_resource(target), resolved.resolver))
        for sub in resource.subresources():
            stack.append((sub, resolver.in_subresource(sub)))
    cycle = _cycle(steps, id(schema))
    if cycle is not None:
        raise InvalidInput(
            "the output schema refers back to itself without descending into a part of the "
            f"answer ({cycle}): checking an answer against it would never end"
        )


def _patterns_of(node: Mapping[str, Any]) -> Iterator[str]:
    if isinstance(node.get("pattern"), str):
        yield node["pattern"]
    by_pattern = node.get("patternProperties")
    if isinstance(by_pattern, dict):
        yield from (key for key in by_pattern if isinstance(key, str))


def _in_place(node: Mapping[str, Any]) -> Iterator[tuple[str, Any]]:
    """Subschemas of ``node`` that apply to the same value as ``node`` does."""
    for keyword in schema_validator.IN_PLACE_ONE:
        if isinstance(node.get(keyword), dict):
            yield keyword, node[keyword]
    for keyword in schema_validator.IN_PLACE_MANY:
        value = node.get(keyword)
        for sub in value if isinstance(value, list) else [value]:
            if isinstance(sub, dict):
                yield keyword, sub
    for keyword in schema_validator.IN_PLACE_MAP:
        value = node.get(keyword)
        if isinstance(value, dict):
            yield from ((keyword, sub) for sub in value.values() if isinstance(sub, dict))


def _cycle(steps: dict[int, list[tuple[int, str]]], root: int) -> str | None:
    """The references of a cycle among in-place steps reachable from ``root``, or None.
    A depth-first walk with an explicit stack (a chain of a thousand ``$ref``s is fine)."""
    done: set[int] = set()
    for start in [root, *steps]:
        if start in done:
            continue
        path: list[tuple[int, str]] = [(start, "")]
        on_path = {start}
        pending = [iter(steps.get(start, []))]
        while pending:
            step = next(pending[-1], None)
            if step is None:
                pending.pop()
                node, _ = path.pop()
                on_path.discard(node)
                done.add(node)
                continue
            target, label = step
            if target in on_path:
                start_at = next(i for i, (n, _) in enumerate(path) if n == target)
                labels = [lab for _, lab in path[start_at + 1 :]] + [label]
                return ", then ".join(lab for lab in labels if lab.startswith("$")) or "a loop"
            if target in done:
                continue
            path.append((target, label))
            on_path.add(target)
            pending.append(iter(steps.get(target, [])))
    return None
