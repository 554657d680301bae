"""Tools the model can call: plain or async functions with a JSON schema."""

from __future__ import annotations

import inspect
import re
import types
import typing
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal, get_args, get_origin

ToolOutput = str | list[dict[str, Any]]


@dataclass(frozen=True)
class Tool:
    """A tool: its name, what it is for, the schema of its input, and the function to call."""

    name: str
    description: str
    input_schema: dict[str, Any]
    function: Callable[..., Any]

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.function)

    def to_api(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "input_schema": self.input_schema,
        }

    def __call__(self, **kwargs: Any) -> Any:
        return self.function(**kwargs)


def tool(
    function: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    input_schema: dict[str, Any] | None = None,
) -> Any:
    """Make a function a tool; its type hints and docstring give the schema.

    Use as ``@tool`` or ``@tool(name=..., description=..., input_schema=...)`` to give
    an explicit schema. The docstring's first paragraph is the description; an
    ``Args:`` section describes the parameters.
    """

    def make(func: Callable[..., Any]) -> Tool:
        doc = inspect.getdoc(func) or ""
        summary = doc.split("\n\n", 1)[0].strip()
        return Tool(
            name=name or func.__name__,
            description=description or summary or func.__name__,
            input_schema=input_schema or _schema(func, _arg_docs(doc)),
            function=func,
        )

    return make(function) if function is not None else make


def as_tool(value: Tool | Callable[..., Any]) -> Tool:
    return value if isinstance(value, Tool) else tool(value)


def output(value: Any) -> ToolOutput:
    """What a tool's return value becomes in its result: text, or content blocks as given."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(b, dict) and "type" in b for b in value):
        return value
    import json

    return json.dumps(value, default=str)


async def call(tool: Tool, arguments: dict[str, Any]) -> Any:
    result = tool.function(**arguments)
    if isinstance(result, Awaitable):
        result = await result
    return result


def _arg_docs(doc: str) -> dict[str, str]:
    match = re.search(r"^(?:Args|Arguments|Parameters):\s*\n((?:[ \t]+.*\n?)+)", doc, re.MULTILINE)
    if not match:
        return {}
    found: dict[str, str] = {}
    for line in match.group(1).splitlines():
        item = re.match(r"\s+(\w+)(?:\s*\(.*?\))?:\s*(.*)", line)
        if item:
            found[item.group(1)] = item.group(2).strip()
    return found


def _schema(func: Callable[..., Any], docs: dict[str, str]) -> dict[str, Any]:
    hints = typing.get_type_hints(func)
    properties: dict[str, Any] = {}
    required = []
    for param in inspect.signature(func).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        prop = _json_type(hints.get(param.name, Any))
        if param.name in docs:
            prop["description"] = docs[param.name]
        if param.default is param.empty:
            required.append(param.name)
        elif param.default is not None:
            prop["default"] = param.default
        properties[param.name] = prop
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = required
    return schema


def _json_type(hint: Any) -> dict[str, Any]:
    origin = get_origin(hint)
    if origin is Literal:
        return {"enum": list(get_args(hint))}
    if origin in (typing.Union, types.UnionType):
        options = [a for a in get_args(hint) if a is not type(None)]
        return (
            _json_type(options[0])
            if len(options) == 1
            else {"anyOf": [_json_type(a) for a in options]}
        )
    if origin in (list, tuple, set, frozenset):
        args = get_args(hint)
        return {"type": "array", "items": _json_type(args[0])} if args else {"type": "array"}
    if origin is dict or hint is dict:
        return {"type": "object"}
    simple = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array"}
    return {"type": simple[hint]} if hint in simple else {}
