"""Tool-call parsers chosen by name, like vLLM's ``--tool-call-parser``: generated text to OpenAI ``tool_calls``.

A parser turns the decoded text of one response into ``(content, tool_calls)``. Text outside the calls stays
content; text that only looks like a call (bad JSON, a block that never closes) stays content too, so nothing the
model wrote is lost. Registered here: ``hermes`` (Qwen2.5 / Qwen3 / Hermes: ``<tool_call>{...}</tool_call>``),
``llama3_json`` (Llama 3.1+ JSON calls, optionally after ``<|python_tag|>``) and ``calc`` (the calculator model's
``CALC(<expression>)``). `split_reasoning` separates a ``<think>...</think>`` block.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "CalcToolParser",
    "HermesToolParser",
    "Llama3JsonToolParser",
    "ToolParser",
    "get_tool_parser",
    "guess_tool_parser",
    "make_tool_call",
    "register_tool_parser",
    "split_reasoning",
    "tool_parser_names",
]


@runtime_checkable
class ToolParser(Protocol):
    """Turns a response's text into content and OpenAI tool calls."""

    @property
    def name(self) -> str:
        """The registry name."""
        ...

    @property
    def markers(self) -> tuple[str, ...]:
        """Strings that may begin a tool call; a streaming server holds text back from the first one on."""
        ...

    def parse(self, text: str, tools: Sequence[Mapping[str, Any]]) -> tuple[str | None, list[dict[str, Any]]]:
        """``(content, tool_calls)`` of ``text``; content is ``None`` when the response is only calls."""
        ...


def make_tool_call(name: str, arguments: Any) -> dict[str, Any]:
    """An OpenAI ``tool_calls`` entry (fresh id; ``arguments`` as a JSON string, kept as given if already one)."""
    encoded = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function", "function": {"name": name, "arguments": encoded}}


def _declared_names(tools: Sequence[Mapping[str, Any]]) -> set[str]:
    names: set[str] = set()
    for tool in tools:
        function = tool.get("function")
        if isinstance(function, Mapping) and isinstance(function.get("name"), str):  # type: ignore[reportUnknownMemberType]
            names.add(str(function["name"]))  # type: ignore[reportUnknownArgumentType]
    return names


def _call_from_object(obj: Any) -> dict[str, Any] | None:
    """``{"name": ..., "arguments"|"parameters": {...}}`` to a tool call, or ``None`` if it is not that shape."""
    if not isinstance(obj, Mapping):
        return None
    name = obj.get("name")  # type: ignore[reportUnknownMemberType]
    arguments = obj.get("arguments", obj.get("parameters", {}))  # type: ignore[reportUnknownMemberType]
    if not isinstance(name, str) or not name:
        return None
    if isinstance(arguments, str):  # some models emit the arguments already encoded
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    if not isinstance(arguments, Mapping):
        return None
    return make_tool_call(name, dict(arguments))  # type: ignore[reportUnknownArgumentType]


@dataclass(frozen=True)
class HermesToolParser:
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks, any number, anywhere in the text.

    A final block whose closing tag is missing (the model stopped on eos right after the JSON) is accepted.
    If any block is not a JSON call, the whole text stays content.
    """

    name: str = "hermes"
    markers: tuple[str, ...] = ("<tool_call>",)

    _BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)

    def parse(self, text: str, tools: Sequence[Mapping[str, Any]]) -> tuple[str | None, list[dict[str, Any]]]:
        """See `ToolParser.parse`."""
        del tools
        if "<tool_call>" not in text:
            return text, []
        calls: list[dict[str, Any]] = []
        for match in self._BLOCK.finditer(text):
            try:
                call = _call_from_object(json.loads(match.group(1).strip()))
            except json.JSONDecodeError:
                call = None
            if call is None:
                return text, []
            calls.append(call)
        content = self._BLOCK.sub("", text).strip()
        return content or None, calls


@dataclass(frozen=True)
class Llama3JsonToolParser:
    """Llama 3.1+ JSON tool calls: ``{"name": ..., "parameters": {...}}`` (``arguments`` also accepted).

    The response must be the calls alone (optionally after ``<|python_tag|>``), several separated by ``;``.
    """

    name: str = "llama3_json"
    markers: tuple[str, ...] = ("<|python_tag|>", "{")

    def parse(self, text: str, tools: Sequence[Mapping[str, Any]]) -> tuple[str | None, list[dict[str, Any]]]:
        """See `ToolParser.parse`."""
        del tools
        body = text.strip()
        body = body.removeprefix("<|python_tag|>").strip()
        if not body.startswith("{"):
            return text, []
        decoder = json.JSONDecoder()
        calls: list[dict[str, Any]] = []
        position = 0
        while True:
            try:
                obj, position = decoder.raw_decode(body, position)
            except json.JSONDecodeError:
                return text, []
            call = _call_from_object(obj)
            if call is None:
                return text, []
            calls.append(call)
            rest = body[position:].lstrip()
            rest = rest[1:].lstrip() if rest.startswith(";") else rest
            if not rest:
                break
            if not rest.startswith("{"):
                return text, []
            position = len(body) - len(rest)
        return None, calls


@dataclass(frozen=True)
class CalcToolParser:
    """The calculator model's format: the whole response ``CALC(<expression>)`` calls ``calculator``.

    It is a call only when the request declares a function named ``tool_name``.
    """

    name: str = "calc"
    markers: tuple[str, ...] = ("CALC(",)
    tool_name: str = "calculator"

    _CALL = re.compile(r"CALC\((.*)\)", re.DOTALL)

    def parse(self, text: str, tools: Sequence[Mapping[str, Any]]) -> tuple[str | None, list[dict[str, Any]]]:
        """See `ToolParser.parse`."""
        match = self._CALL.fullmatch(text.strip())
        if match is None or self.tool_name not in _declared_names(tools):
            return text, []
        return None, [make_tool_call(self.tool_name, {"expression": match.group(1)})]


_REGISTRY: dict[str, Callable[[], ToolParser]] = {
    "hermes": HermesToolParser,
    "llama3_json": Llama3JsonToolParser,
    "calc": CalcToolParser,
}


def register_tool_parser(name: str, factory: Callable[[], ToolParser]) -> None:
    """Register (or replace) a parser under ``name``; ``factory()`` builds one.

    Raises:
        ValueError: If ``name`` is empty.
    """
    if not name:
        raise ValueError("a tool parser needs a name")
    _REGISTRY[name] = factory


def tool_parser_names() -> list[str]:
    """The registered parser names, sorted."""
    return sorted(_REGISTRY)


def get_tool_parser(name: str) -> ToolParser:
    """The parser registered as ``name``.

    Raises:
        ValueError: If no parser has that name (the message lists the known ones).
    """
    factory = _REGISTRY.get(name)
    if factory is None:
        raise ValueError(f"unknown tool-call parser {name!r}; known parsers: {', '.join(tool_parser_names())}")
    return factory()


def guess_tool_parser(chat_template: str | None) -> str:
    """The parser a chat template's own tool-call format implies (``hermes`` when nothing more specific shows)."""
    template = chat_template or ""
    if "CALC(" in template:
        return "calc"
    if "<|python_tag|>" in template or ('"parameters"' in template and "<tool_call>" not in template):
        return "llama3_json"
    return "hermes"


def split_reasoning(text: str, *, opened: bool = False) -> tuple[str | None, str | None]:
    """``(reasoning, content)`` of a response that may start with a ``<think>...</think>`` block.

    Args:
        text: The response text.
        opened: The prompt already opened the block (some templates end the generation prompt with ``<think>``).

    A block that never closes (cut off by ``max_tokens``) is all reasoning. Without a block, the text is content.
    """
    stripped = text.lstrip()
    if stripped.startswith("<think>"):
        stripped, opened = stripped[len("<think>") :], True
    if not opened:
        return None, text
    reasoning, closed, rest = stripped.partition("</think>")
    if not closed:
        return reasoning.strip() or None, None
    return reasoning.strip() or None, rest.lstrip() or None
