"""A tool set from plain Python functions: each one's JSON Schema from its typed signature,
its description from its docstring (or both given explicitly), its arguments validated by
pydantic before it is called.

What a handler returns is what the harness reads: a string as it is, anything else as JSON.
"""

from __future__ import annotations

import inspect
import json
import re
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, create_model
from pydantic_core import to_json

TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
"""What every CLI accepts as a tool name (Claude and Codex prefix it with the server's)."""


class ToolError(Exception):
    """A call the tool set refuses: unknown tool, arguments that do not fit its schema."""


@dataclass(frozen=True)
class Tool:
    """One tool of a set: its name, description and input schema, and its handler."""

    name: str
    description: str
    input_schema: dict[str, Any]
    handler: Callable[..., Any]
    arguments: type[BaseModel] | None = None
    """Validates the call's arguments (derived from the signature); None when the schema was
    given explicitly: the handler then gets the arguments as they came."""

    def definition(self) -> dict[str, Any]:
        """As MCP's ``tools/list`` lists it."""
        return {
            "name": self.name,
            "description": self.description,
            "inputSchema": self.input_schema,
        }

    def call(self, arguments: Mapping[str, Any]) -> str:
        """Run the handler on ``arguments``; its result as text. Raises :class:`ToolError`
        for arguments that do not fit; whatever the handler raises propagates."""
        if self.arguments is None:
            result = self.handler(**arguments)
        else:
            try:
                parsed = self.arguments.model_validate(dict(arguments))
            except ValidationError as exc:
                raise ToolError(f"invalid arguments for {self.name}: {exc}") from None
            result = self.handler(
                **{name: getattr(parsed, name) for name in type(parsed).model_fields}
            )
        if isinstance(result, str):
            return result
        return to_json(result, fallback=str).decode()


def tool(
    handler: Callable[..., Any],
    *,
    name: str | None = None,
    description: str | None = None,
    input_schema: Mapping[str, Any] | None = None,
) -> Tool:
    """A :class:`Tool` from a function: its name, docstring and typed parameters, unless
    given. Raises :class:`ValueError` for a name no CLI accepts or a parameter without a
    type (``*args``/``**kwargs`` included)."""
    tool_name = str(name or getattr(handler, "__name__", ""))
    if not TOOL_NAME.fullmatch(tool_name):
        raise ValueError(f"a tool name is 1 to 64 letters, digits, '_' or '-': {tool_name!r}")
    text = description if description is not None else inspect.getdoc(handler) or ""
    if input_schema is not None:
        return Tool(tool_name, text, dict(input_schema), handler)
    model = _arguments_model(handler, tool_name)
    schema = model.model_json_schema()
    schema.pop("title", None)
    return Tool(tool_name, text, schema, handler, model)


def _arguments_model(handler: Callable[..., Any], name: str) -> type[BaseModel]:
    signature = inspect.signature(handler)
    try:
        hints = typing.get_type_hints(handler)
    except (NameError, TypeError) as exc:
        raise ValueError(f"the type hints of tool {name} cannot be read: {exc}") from None
    fields: dict[str, Any] = {}
    for parameter in signature.parameters.values():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            raise ValueError(f"tool {name}: *args and **kwargs have no schema")
        if parameter.name not in hints:
            raise ValueError(f"tool {name}: parameter {parameter.name!r} has no type")
        default = ... if parameter.default is parameter.empty else parameter.default
        fields[parameter.name] = (hints[parameter.name], default)
    return create_model(f"{name}_arguments", __config__=ConfigDict(extra="forbid"), **fields)


def tool_set(handlers: object) -> dict[str, Tool]:
    """The tools of ``handlers``: a function, a :class:`Tool`, a mapping of name to either,
    or an iterable of them. Raises :class:`ValueError` when empty or a name repeats."""
    items: Iterable[tuple[str | None, object]]
    if callable(handlers) or isinstance(handlers, Tool):
        items = [(None, handlers)]
    elif isinstance(handlers, Mapping):
        items = list(handlers.items())
    elif isinstance(handlers, Iterable) and not isinstance(handlers, str | bytes):
        items = [(None, h) for h in handlers]
    else:
        raise ValueError(f"not a tool set: {type(handlers).__name__}")
    tools: dict[str, Tool] = {}
    for name, handler in items:
        if isinstance(handler, Tool):
            made = handler if name in (None, handler.name) else _renamed(handler, str(name))
        elif callable(handler):
            made = tool(handler, name=name)
        else:
            raise ValueError(f"not a tool: {handler!r}")
        if made.name in tools:
            raise ValueError(f"two tools are named {made.name!r}")
        tools[made.name] = made
    if not tools:
        raise ValueError("a tool set needs at least one tool")
    return tools


def _renamed(made: Tool, name: str) -> Tool:
    if not TOOL_NAME.fullmatch(name):
        raise ValueError(f"a tool name is 1 to 64 letters, digits, '_' or '-': {name!r}")
    return Tool(name, made.description, made.input_schema, made.handler, made.arguments)


def definitions_json(tools: Mapping[str, Tool]) -> str:
    """The set's ``tools/list`` entries as JSON, as servers publish them in Redis."""
    return json.dumps([t.definition() for t in tools.values()], sort_keys=True)
