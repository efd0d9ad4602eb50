"""A producer's JSON Schema as ``jsonschema`` runs it here: its regexes on RE2, its ``$ref``s
inside itself.

- ``pattern``, ``patternProperties`` and ``additionalProperties`` (which reads
  ``patternProperties``) are replaced through ``jsonschema.validators.extend`` by versions
  that match with RE2 (``worker.options.schema_regex``). ``unevaluatedProperties`` scans
  ``patternProperties`` inside ``jsonschema`` with Python's ``re``: that scan, like
  everything else about an answer's check, is bounded by the process the check runs in
  (``worker.turn.structured``).
- ``$ref`` resolves through a registry holding the schema and the dialects' metaschemas
  only: ``jsonschema``'s default registry fetches any other URI with ``urlopen``
  (``http://169.254.169.254/...``, ``file:///etc/...``); this one retrieves nothing.

``references`` lists where each reference of a schema leads (the schema check refuses one
that leads outside the schema); ``validator`` builds the validator the answer check runs.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import jsonschema
import referencing
import referencing.exceptions
import referencing.jsonschema
from jsonschema.exceptions import ValidationError
from jsonschema_specifications import REGISTRY as METASCHEMAS

from worker.options.schema_regex import compile_pattern, searches

REFERENCE_KEYWORDS = ("$ref", "$dynamicRef", "$recursiveRef")
IN_PLACE_ONE = ("not", "if", "then", "else")
"""Keywords whose schema applies to the same value (not to a part of it)."""
IN_PLACE_MANY = ("allOf", "anyOf", "oneOf", "extends")
IN_PLACE_MAP = ("dependentSchemas", "dependencies")


class Patterns:
    """Compiled patterns of one validation, each compiled once (RE2 objects are costly to
    make and cheap to run)."""

    def __init__(self) -> None:
        self._compiled: dict[str, Any] = {}

    def search(self, pattern: str, text: str) -> bool:
        compiled = self._compiled.get(pattern)
        if compiled is None:
            compiled = self._compiled[pattern] = compile_pattern(pattern)
        return searches(compiled, text)


def _keywords(patterns: Patterns) -> dict[str, Any]:
    def pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[Any]:
        if validator.is_type(instance, "string") and not patterns.search(pattern, instance):
            yield ValidationError(f"{instance!r} does not match {pattern!r}")

    def pattern_properties(
        validator: Any, by_pattern: Mapping[str, Any], instance: Any, schema: Any
    ) -> Iterator[Any]:
        if not validator.is_type(instance, "object"):
            return
        for each, subschema in by_pattern.items():
            for key, value in instance.items():
                if patterns.search(each, key):
                    yield from validator.descend(value, subschema, path=key, schema_path=each)

    def additional_properties(
        validator: Any, additional: Any, instance: Any, schema: Any
    ) -> Iterator[Any]:
        if not validator.is_type(instance, "object"):
            return
        named = schema.get("properties", {})
        by_pattern = schema.get("patternProperties", {})
        extras = [
            key
            for key in instance
            if key not in named and not any(patterns.search(p, key) for p in by_pattern)
        ]
        if validator.is_type(additional, "object"):
            for key in extras:
                yield from validator.descend(instance[key], additional, path=key)
        elif not additional and extras:
            shown = ", ".join(repr(key) for key in sorted(extras, key=str))
            if by_pattern:
                verb = "does" if len(extras) == 1 else "do"
                listed = ", ".join(repr(p) for p in sorted(by_pattern))
                yield ValidationError(f"{shown} {verb} not match any of the regexes: {listed}")
            else:
                verb = "was" if len(extras) == 1 else "were"
                yield ValidationError(
                    f"Additional properties are not allowed ({shown} {verb} unexpected)"
                )

    return {
        "pattern": pattern,
        "patternProperties": pattern_properties,
        "additionalProperties": additional_properties,
    }


def _dialect(schema: Mapping[str, Any]) -> Any:
    return jsonschema.validators.validator_for(schema)


def validator(schema: Mapping[str, Any]) -> Any:
    """A validator of ``schema`` whose patterns run on RE2 and whose references are
    resolved inside it (or a dialect's metaschema) only."""
    base = _dialect(schema)
    extended = jsonschema.validators.extend(base, validators=_keywords(Patterns()))
    return extended(schema, registry=referencing.Registry())


def root_resolver(schema: Mapping[str, Any]) -> tuple[Any, Any]:
    """The dialect's ``referencing`` specification and a resolver rooted at ``schema``,
    over a registry that retrieves nothing."""
    base = _dialect(schema)
    specification = referencing.jsonschema.specification_with(
        base.ID_OF(base.META_SCHEMA) or "urn:unknown-dialect",
        default=referencing.Specification.OPAQUE,
    )
    root = specification.create_resource(schema)
    return specification, METASCHEMAS.combine(referencing.Registry()).resolver_with_root(root)


class Unresolvable(ValueError):
    """A reference that leads nowhere inside the schema: the message names it."""


def resolve(resolver: Any, reference: str) -> Any:
    """Where ``reference`` leads from ``resolver``'s base (``Resolved``), or Unresolvable:
    an address outside the schema is never fetched."""
    try:
        return resolver.lookup(reference)
    except referencing.exceptions.Unresolvable as exc:
        raise Unresolvable(
            f"the {reference!r} reference leads nowhere inside the schema ({type(exc).__name__}"
            "; other documents are never fetched: put what it names under $defs)"
        ) from None
