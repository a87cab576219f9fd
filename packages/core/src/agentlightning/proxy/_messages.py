"""Anthropic's Messages API as the proxy's chat path: a Messages request becomes a chat completion request, its answer
becomes a Messages answer.

The proxy serves ``POST {prefix}/v1/messages`` by translating the request to OpenAI's chat completions and sending
it down the chat path (``_messages_routes.py``): every backend (the embedded one with the model's own template, vLLM,
a remote OpenAI-compatible server) then renders and generates it as a chat call, and the call is recorded as one,
with the exact prompt and response token ids. The translation, both ways:

==============================================  ==============================================================
Messages                                        chat completions
==============================================  ==============================================================
``system`` (a string or text blocks)            a leading ``system`` message
``text`` blocks                                 the message's ``content``
``tool_use`` blocks (assistant)                 ``tool_calls`` (``arguments``: the ``input`` as JSON)
``tool_result`` blocks (user)                   ``tool`` messages, in order, before the user's text
``thinking`` blocks (assistant)                 ``reasoning_content``
``tools`` (``input_schema``)                    function tools (``parameters``)
``tool_choice`` auto / any / tool / none        ``auto`` / ``required`` / the named function / ``none``
``disable_parallel_tool_use``                   ``parallel_tool_calls: false``
``max_tokens``, ``temperature``, ``top_p``,     the same fields; ``stop_sequences`` becomes ``stop``
``top_k``, ``stop_sequences``
answer: ``text`` / ``tool_use`` / ``thinking``  ``content`` / ``tool_calls`` / ``reasoning_content``
``stop_reason`` end_turn / tool_use /           ``finish_reason`` stop / tool_calls / length (a stop string the
max_tokens / stop_sequence                      agent named: ``stop_sequence``)
==============================================  ==============================================================

What cannot be honoured is refused with a 400 naming it (`MessagesRefusal`), never dropped: image and document
blocks (the served models are text-only), server tools (``web_search``, ``bash``, computer use...), MCP servers,
containers, a ``tool_result`` for a ``tool_use`` id no earlier assistant turn made, unknown block types.
"""

from __future__ import annotations

import json
import logging
from typing import Any, cast

from agentlightning.proxy._assemble import dumps

__all__ = [
    "MessagesRefusal",
    "anthropic_error",
    "chat_request",
    "message_answer",
    "stop_reason",
    "tool_input",
    "usage_of",
]

logger = logging.getLogger("agentlightning.proxy._proxy")

_IGNORED = frozenset({
    "metadata", "service_tier", "thinking", "stream", "cache_control", "inference_geo", "speed", "user_profile_id",
    "workspace_id", "diagnostics",
})  # fmt: skip
"""Fields that ask nothing an open model's answer could honour differently: who calls (``metadata``,
``user_profile_id``, ``workspace_id``), where and how fast Anthropic serves it (``service_tier``, ``inference_geo``,
``speed``, ``diagnostics``), prompt caching (``cache_control``: the backend's prefix cache works unasked),
``thinking`` (a model that reasons returns its ``thinking`` blocks whatever the setting); ``stream`` is read apart."""
_SAMPLING = {"max_tokens": "max_tokens", "temperature": "temperature", "top_p": "top_p", "top_k": "top_k"}
_SERVER_FEATURES = {
    "mcp_servers": "MCP servers (the proxy calls no tools itself)",
    "container": "code-execution containers",
    "context_management": "server-side context management",
}
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
}
_STOP_REASONS = {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens", "function_call": "tool_use"}


class MessagesRefusal(ValueError):
    """A Messages request the proxy cannot honour or parse: answered 400 with this message, nothing forwarded."""


def anthropic_error(status: int, message: str, kind: str | None = None) -> bytes:
    """An error body in Anthropic's shape (``{"type": "error", "error": {"type", "message"}}``)."""
    kind = _ERROR_TYPES.get(status, kind or "api_error")
    return dumps({"type": "error", "error": {"type": kind, "message": message}})


def _where(index: int, role: str) -> str:
    return f"messages[{index}] ({role})"


def _text_of(content: Any, where: str) -> str:
    """The text of a string or a list of ``text`` blocks (a system prompt, a tool result)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise MessagesRefusal(f"{where} must be a string or a list of text blocks")
    parts: list[str] = []
    for block in cast(list[Any], content):
        kind = _block_type(block, where)
        if kind != "text":
            raise MessagesRefusal(f"{where} holds a {kind!r} block: {_refused_block(kind)}")
        parts.append(_string(block, "text", where))
    return "\n".join(parts)


_MEDIA = ("image", "document", "search_result", "container_upload")


def _refused_block(kind: str) -> str:
    if kind in _MEDIA:
        return f"{kind} blocks are not supported (the models this proxy serves read text only); send text"
    return "only text blocks are allowed here"


def _block_type(block: Any, where: str) -> str:
    if not isinstance(block, dict) or not isinstance(cast(dict[str, Any], block).get("type"), str):
        raise MessagesRefusal(f"{where}: every content block must be an object with a string 'type'")
    return cast(str, cast(dict[str, Any], block)["type"])


def _string(block: Any, key: str, where: str) -> str:
    value = cast(dict[str, Any], block).get(key)
    if not isinstance(value, str):
        raise MessagesRefusal(f"{where}: a {block['type']!r} block needs a string {key!r}")
    return value


def _user_turn(content: Any, where: str, issued: set[str], out: list[dict[str, Any]]) -> None:
    """A user turn: its tool results become ``tool`` messages, its text a user message, in the blocks' order."""
    if isinstance(content, str):
        out.append({"role": "user", "content": content})
        return
    if not isinstance(content, list) or not content:
        raise MessagesRefusal(f"{where}: content must be a string or a non-empty list of blocks")
    text: list[str] = []
    for block in cast(list[Any], content):
        kind = _block_type(block, where)
        if kind == "text":
            text.append(_string(block, "text", where))
        elif kind == "tool_result":
            if text:  # text before a tool result keeps its place
                out.append({"role": "user", "content": "\n".join(text)})
                text = []
            call_id = _string(block, "tool_use_id", where)
            if call_id not in issued:
                raise MessagesRefusal(
                    f"{where}: tool_result for tool_use id {call_id!r}, which no earlier assistant turn made"
                )
            result = cast(dict[str, Any], block).get("content", "")
            out.append({"role": "tool", "tool_call_id": call_id, "content": _text_of(result, f"{where} tool_result")})
        elif kind == "tool_use":
            raise MessagesRefusal(f"{where}: tool_use blocks belong to assistant turns")
        elif kind in _MEDIA:
            raise MessagesRefusal(f"{where}: {_refused_block(kind)}")
        else:
            raise MessagesRefusal(f"{where}: unknown content block type {kind!r} in a user turn")
    if text:
        out.append({"role": "user", "content": "\n".join(text)})


def _assistant_turn(content: Any, where: str, issued: set[str], out: list[dict[str, Any]]) -> None:
    """An assistant turn: text, ``tool_use`` blocks as tool calls, ``thinking`` as ``reasoning_content``."""
    if isinstance(content, str):
        out.append({"role": "assistant", "content": content})
        return
    if not isinstance(content, list):
        raise MessagesRefusal(f"{where}: content must be a string or a list of blocks")
    text: list[str] = []
    thinking: list[str] = []
    calls: list[dict[str, Any]] = []
    for block in cast(list[Any], content):
        kind = _block_type(block, where)
        if kind == "text":
            text.append(_string(block, "text", where))
        elif kind == "thinking":
            thinking.append(_string(block, "thinking", where))
        elif kind == "tool_use":
            call_id, name = _string(block, "id", where), _string(block, "name", where)
            arguments = cast(dict[str, Any], block).get("input", {})
            if not isinstance(arguments, dict):
                raise MessagesRefusal(f"{where}: the 'input' of tool_use {call_id!r} must be an object")
            issued.add(call_id)
            function = {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}
            calls.append({"id": call_id, "type": "function", "function": function})
        elif kind == "redacted_thinking":
            raise MessagesRefusal(f"{where}: redacted_thinking blocks cannot be shown to an open model (encrypted)")
        else:
            raise MessagesRefusal(f"{where}: unknown content block type {kind!r} in an assistant turn")
    message: dict[str, Any] = {"role": "assistant", "content": "".join(text) if text or not calls else None}
    if thinking:
        message["reasoning_content"] = "".join(thinking)
    if calls:
        message["tool_calls"] = calls
    out.append(message)


def _tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise MessagesRefusal("'tools' must be a list")
    out: list[dict[str, Any]] = []
    for index, tool in enumerate(cast(list[Any], tools)):
        if not isinstance(tool, dict):
            raise MessagesRefusal(f"tools[{index}] must be an object")
        tool = cast(dict[str, Any], tool)
        kind = tool.get("type", "custom")
        if kind != "custom":
            raise MessagesRefusal(
                f"tools[{index}] is the server tool {kind!r}: this proxy serves open models and runs no server tools "
                "(web search, code execution, bash, text editor, computer use); declare it as a custom tool with an "
                "input_schema and run it in the agent"
            )
        name, schema = tool.get("name"), tool.get("input_schema")
        if not isinstance(name, str) or not name or not isinstance(schema, dict):
            raise MessagesRefusal(f"tools[{index}] needs a string 'name' and an object 'input_schema'")
        function: dict[str, Any] = {"name": name}  # OpenAI's order: templates render the tool as JSON
        if isinstance(tool.get("description"), str):
            function["description"] = tool["description"]
        function["parameters"] = schema
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: Any, chat: dict[str, Any]) -> None:
    if not isinstance(choice, dict) or not isinstance(cast(dict[str, Any], choice).get("type"), str):
        raise MessagesRefusal("'tool_choice' must be an object with a 'type' (auto, any, tool or none)")
    choice = cast(dict[str, Any], choice)
    kind = choice["type"]
    if kind == "auto":
        chat["tool_choice"] = "auto"
    elif kind == "any":
        chat["tool_choice"] = "required"
    elif kind == "none":
        chat["tool_choice"] = "none"
    elif kind == "tool" and isinstance(choice.get("name"), str):
        chat["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    else:
        raise MessagesRefusal(f"unknown tool_choice {choice!r} (auto, any, tool with a 'name', or none)")
    if choice.get("disable_parallel_tool_use") is True:
        chat["parallel_tool_calls"] = False


def chat_request(body: dict[str, Any]) -> dict[str, Any]:
    """The chat completion request that asks the model what the Messages request ``body`` asks.

    Raises:
        MessagesRefusal: A field or block the proxy cannot translate faithfully (the message names it).
    """
    for name, what in _SERVER_FEATURES.items():
        if body.get(name):
            raise MessagesRefusal(f"{name!r} is not supported: {what}")
    known = {"model", "messages", "system", "tools", "tool_choice", "stop_sequences", "output_config", *_SAMPLING,
             *_IGNORED}  # fmt: skip
    unknown = sorted(set(body) - known - set(_SERVER_FEATURES))
    if unknown:
        raise MessagesRefusal(f"unknown Messages field(s) {', '.join(map(repr, unknown))}")
    if not isinstance(body.get("max_tokens"), int) or isinstance(body.get("max_tokens"), bool):
        raise MessagesRefusal("'max_tokens' (an integer) is required")
    messages: list[dict[str, Any]] = []
    if body.get("system") is not None:
        messages.append({"role": "system", "content": _text_of(body["system"], "system")})
    turns = body.get("messages")
    if not isinstance(turns, list) or not turns:
        raise MessagesRefusal("'messages' must be a non-empty list")
    issued: set[str] = set()
    for index, turn in enumerate(cast(list[Any], turns)):
        if not isinstance(turn, dict) or cast(dict[str, Any], turn).get("role") not in ("user", "assistant"):
            raise MessagesRefusal(f"messages[{index}] must be an object whose role is 'user' or 'assistant'")
        turn = cast(dict[str, Any], turn)
        if "content" not in turn:
            raise MessagesRefusal(f"{_where(index, turn['role'])} has no 'content'")
        add = _user_turn if turn["role"] == "user" else _assistant_turn
        add(turn["content"], _where(index, turn["role"]), issued, messages)
    chat: dict[str, Any] = {"messages": messages}
    if isinstance(body.get("model"), str):
        chat["model"] = body["model"]
    for name, field in _SAMPLING.items():
        if body.get(name) is not None:
            chat[field] = body[name]
    if body.get("stop_sequences"):
        stops = body["stop_sequences"]
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in cast(list[Any], stops)):
            raise MessagesRefusal("'stop_sequences' must be a list of strings")
        chat["stop"] = stops
    if body.get("tools"):
        chat["tools"] = _tools(body["tools"])
    if body.get("tool_choice") is not None:
        _tool_choice(body["tool_choice"], chat)
    if body.get("output_config") is not None:
        _output_config(body["output_config"], chat)
    return chat


def _output_config(config: Any, chat: dict[str, Any]) -> None:
    """``format`` (a JSON schema the answer must follow) becomes ``response_format``; ``effort`` is a hint to Claude's
    reasoning budget, which an open model has no setting for."""
    if not isinstance(config, dict):
        raise MessagesRefusal("'output_config' must be an object")
    config = cast(dict[str, Any], config)
    unknown = sorted(set(config) - {"format", "effort"})
    if unknown:
        raise MessagesRefusal(f"unknown output_config field(s) {', '.join(map(repr, unknown))}")
    fmt = config.get("format")
    if fmt is None:
        return
    if not isinstance(fmt, dict) or cast(dict[str, Any], fmt).get("type") != "json_schema":
        raise MessagesRefusal("output_config.format must be {'type': 'json_schema', 'schema': {...}}")
    schema = cast(dict[str, Any], fmt).get("schema")
    if not isinstance(schema, dict):
        raise MessagesRefusal("output_config.format needs an object 'schema'")
    chat["response_format"] = {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}


def tool_input(arguments: str, name: str) -> dict[str, Any]:
    """A tool call's ``input`` object from its JSON arguments (text that is no JSON object is kept, under ``_raw``)."""
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        value = None
    if isinstance(value, dict):
        return cast(dict[str, Any], value)
    logger.warning("the model called tool %r with arguments that are no JSON object: %.200s", name, arguments)
    return {"_raw": arguments}


def stop_reason(finish: str | None, matched: Any, stops: list[str]) -> tuple[str | None, str | None]:
    """(``stop_reason``, ``stop_sequence``) of a choice's ``finish_reason`` and vLLM's ``stop_reason`` (the stop string
    that ended it, when one did)."""
    if finish == "stop" and isinstance(matched, str) and matched in stops:
        return "stop_sequence", matched
    return (_STOP_REASONS.get(finish, "end_turn") if finish is not None else None), None


def usage_of(usage: Any) -> dict[str, int]:
    """Anthropic's ``usage`` from a chat answer's."""
    usage = cast(dict[str, Any], usage) if isinstance(usage, dict) else {}
    return {
        "input_tokens": int(usage.get("prompt_tokens") or 0),
        "output_tokens": int(usage.get("completion_tokens") or 0),
    }


def message_answer(chat: dict[str, Any], stops: list[str]) -> dict[str, Any]:
    """The Messages answer of a (non-streamed) chat completion; its ``id`` is the chat completion's, which the
    proxy records as the call's ``response_id`` (adapters' spans join on it)."""
    choices = cast(list[Any], chat.get("choices") or [{}])
    choice = cast(dict[str, Any], choices[0]) if choices and isinstance(choices[0], dict) else {}
    message = cast(dict[str, Any], choice.get("message") or {})
    content: list[dict[str, Any]] = []
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if isinstance(reasoning, str) and reasoning:
        content.append({"type": "thinking", "thinking": reasoning, "signature": ""})
    if isinstance(message.get("content"), str) and message["content"]:
        content.append({"type": "text", "text": message["content"]})
    for call in cast(list[Any], message.get("tool_calls") or []):
        function = cast(dict[str, Any], cast(dict[str, Any], call).get("function") or {})
        name = str(function.get("name") or "")
        call_id = cast(dict[str, Any], call).get("id") or f"toolu_{len(content)}"
        arguments = function.get("arguments")
        args = tool_input(arguments, name) if isinstance(arguments, str) else {}
        content.append({"type": "tool_use", "id": call_id, "name": name, "input": args})
    reason, sequence = stop_reason(choice.get("finish_reason"), choice.get("stop_reason"), stops)
    return {
        "id": chat.get("id"),
        "type": "message",
        "role": "assistant",
        "model": chat.get("model"),
        "content": content,
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": usage_of(chat.get("usage")),
    }
