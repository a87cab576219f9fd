"""OpenAI's Responses API at the LLM proxy: a request translated into the chat completion the backend serves.

``POST {prefix}/v1/responses`` (the OpenAI Agents SDK's default, ``client.responses.create``, LangChain's
``ChatOpenAI(use_responses_api=True)``) is served through the backend's chat completions (see ``_translate.py``):

- ``instructions`` -> a system message; ``input`` (a string, or items) -> messages: ``message`` items (``developer``
  counts as ``system``), ``function_call`` items -> the assistant message's ``tool_calls`` (one assistant turn with its
  text), ``function_call_output`` items -> ``tool`` messages, ``reasoning`` items -> the next assistant message's
  ``reasoning_content``;
- function ``tools``, ``tool_choice``, ``parallel_tool_calls``, ``max_output_tokens`` (``max_tokens``),
  ``temperature``, ``top_p``, ``top_logprobs``, ``text.format`` (``response_format``), ``reasoning.effort``
  (``reasoning_effort``); other fields a backend may read (``seed``, vLLM's sampling extras) are passed on.

What cannot be honoured is refused (400, naming it), never dropped: ``previous_response_id`` and ``conversation``
(the proxy stores no responses: send the whole input), a stored ``prompt``, ``background``, ``max_tool_calls``,
built-in tools (web search, file search, computer use...), image, file and audio input; so are malformed items, item
types the API does not have, and a ``function_call_output`` whose ``call_id`` no earlier ``function_call`` item has.
Fields that only ask the server to keep or label the response (``store``, ``metadata``, ``user``, ``include``...)
are accepted; ``metadata`` is echoed.
"""

from __future__ import annotations

from typing import Any, cast

from pydantic import BaseModel, ConfigDict, Field, StrictBool

from agentlightning._server_base import Refusal

__all__ = ["ResponsesBody", "responses_call"]


class ResponsesBody(BaseModel):
    """An OpenAI Responses request (the fields the proxy reads; see the module docs for what it does with the rest)."""

    model_config = ConfigDict(extra="allow")
    model: str | None = None
    input: str | list[Any]
    instructions: str | None = None
    stream: StrictBool = False
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: StrictBool | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    include: list[str] | None = None
    previous_response_id: str | None = None


class Unsupported(ValueError):
    """What the proxy cannot honour, or malformed input: answered 400 with its message."""


_NOT_KEPT = "the LLM proxy keeps no responses: send the whole conversation as input"
_REFUSED_FIELDS = {
    "previous_response_id": _NOT_KEPT,
    "conversation": _NOT_KEPT,
    "prompt": "stored prompts live on OpenAI's servers: send instructions and input instead",
    "background": "background responses are not served: call without background",
    "max_tool_calls": "a limit on built-in tool calls does not apply to function tools: leave it out",
}
# Fields of the Responses API with no meaning for a chat completion; accepted, not forwarded.
_RESPONSES_ONLY = frozenset(
    {"input", "instructions", "tools", "tool_choice", "max_output_tokens", "text", "reasoning", "include", "store",
     "metadata", "truncation", "stream", "stream_options", "prompt_cache_key", "prompt_cache_retention",
     "prompt_cache_options", "safety_identifier", "service_tier", "context_management", "user", "top_logprobs",
     "parallel_tool_calls", *_REFUSED_FIELDS}
)  # fmt: skip
_BUILT_IN = "a built-in tool of OpenAI's servers; the model behind this proxy has function tools only"
_NOT_TEXT = "this proxy serves a text-only model: send text"
_TEXT_PARTS = frozenset({"input_text", "output_text", "text", "summary_text", "reasoning_text"})
_HOSTED_ITEMS = frozenset(
    {"file_search_call", "web_search_call", "computer_call", "computer_call_output", "code_interpreter_call",
     "image_generation_call", "local_shell_call", "local_shell_call_output", "shell_call", "shell_call_output",
     "apply_patch_call", "apply_patch_call_output", "mcp_list_tools", "mcp_approval_request", "mcp_approval_response",
     "mcp_call", "custom_tool_call", "custom_tool_call_output", "tool_search_call", "tool_search_output",
     "compaction", "program", "program_output"}
)  # fmt: skip


def responses_call(body: dict[str, Any]) -> Any:
    """The `agentlightning.proxy._responses_answer.ResponsesCall` serving ``body``, or the 400 `Refusal` saying why
    it cannot be served."""
    from agentlightning.proxy._responses_answer import ResponsesCall

    try:
        return ResponsesCall(body, chat_request(body))
    except Unsupported as exc:
        return Refusal(400, f"this Responses request cannot be served: {exc}", "invalid_request_error")


def chat_request(body: dict[str, Any]) -> dict[str, Any]:
    """The chat completion request that serves the Responses request ``body`` (validated by `ResponsesBody`).

    Raises:
        Unsupported: What cannot be honoured, or a malformed item (the message names it).
    """
    for name, why in _REFUSED_FIELDS.items():
        if body.get(name) not in (None, False):
            raise Unsupported(f"{name} is not supported ({why})")
    chat: dict[str, Any] = {k: v for k, v in body.items() if k not in _RESPONSES_ONLY}
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if instructions:
        messages.append({"role": "system", "content": instructions})
    source = body["input"]
    messages += [{"role": "user", "content": source}] if isinstance(source, str) else _messages(source)
    if not messages:
        raise Unsupported("input is empty: send at least one message")
    chat["messages"] = messages
    tools = [_tool(i, t) for i, t in enumerate(body.get("tools") or [])]
    if tools:
        chat["tools"] = tools
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    if body.get("parallel_tool_calls") is not None and tools:
        chat["parallel_tool_calls"] = body["parallel_tool_calls"]
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    if body.get("top_logprobs"):
        chat["top_logprobs"] = body["top_logprobs"]
    _text_format(body.get("text"), chat)
    reasoning = body.get("reasoning")
    if isinstance(reasoning, dict) and cast(dict[str, Any], reasoning).get("effort") is not None:
        chat["reasoning_effort"] = cast(dict[str, Any], reasoning)["effort"]
    if body.get("stream"):
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    return chat


def _messages(items: list[Any]) -> list[dict[str, Any]]:
    """Input items -> chat messages (a function call joins the assistant turn before it: one turn, as the model
    produced it)."""
    messages: list[dict[str, Any]] = []
    calls: set[str] = set()
    reasoning: str | None = None
    for index, raw in enumerate(items):
        where = f"input[{index}]"
        if not isinstance(raw, dict):
            raise Unsupported(f"{where} must be an object, got {type(raw).__name__}")
        item = cast(dict[str, Any], raw)
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            message = _message(item, where)
            if message["role"] == "assistant" and reasoning is not None:
                message["reasoning_content"], reasoning = reasoning, None
            messages.append(message)
        elif kind == "function_call":
            call_id, name, arguments = (_string(item, key, where) for key in ("call_id", "name", "arguments"))
            calls.add(call_id)
            call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
            last: dict[str, Any] | None = messages[-1] if messages else None
            if last is None or last["role"] != "assistant":
                last = {"role": "assistant", "content": None}
                if reasoning is not None:
                    last["reasoning_content"], reasoning = reasoning, None
                messages.append(last)
            calls_of: list[dict[str, Any]] = last.setdefault("tool_calls", [])
            calls_of.append(call)
        elif kind == "function_call_output":
            call_id = _string(item, "call_id", where)
            if call_id not in calls:
                raise Unsupported(
                    f"{where}: function_call_output for call_id {call_id!r}, which no earlier function_call item has "
                    "(the proxy keeps no responses: send the function_call items too)"
                )
            output = item.get("output")
            text = output if isinstance(output, str) else _text(output, f"{where}.output")
            messages.append({"role": "tool", "tool_call_id": call_id, "content": text})
        elif kind == "reasoning":
            if item.get("encrypted_content"):
                raise Unsupported(f"{where}: encrypted reasoning cannot be read by this proxy's model")
            parts = item.get("content") or item.get("summary") or []
            reasoning = _text(parts, f"{where}.content")
        elif kind == "item_reference":
            raise Unsupported(f"{where}: item_reference is not supported ({_NOT_KEPT})")
        elif kind in _HOSTED_ITEMS:
            raise Unsupported(f"{where}: items of type {kind!r} are not supported ({_BUILT_IN})")
        else:
            raise Unsupported(f"{where}: unknown input item type {kind!r}")
    return messages


def _message(item: dict[str, Any], where: str) -> dict[str, Any]:
    role = item.get("role")
    if role not in ("user", "system", "developer", "assistant"):
        raise Unsupported(f"{where}.role must be user, system, developer or assistant, got {role!r}")
    content = item.get("content")
    if isinstance(content, str):
        text: str | list[dict[str, str]] = content
    elif isinstance(content, list):
        texts = _texts(cast(list[Any], content), f"{where}.content")
        text = texts[0] if len(texts) == 1 else [{"type": "text", "text": t} for t in texts]
    else:
        raise Unsupported(f"{where}.content must be a string or a list of content parts")
    return {"role": "system" if role == "developer" else role, "content": text}


def _texts(parts: list[Any], where: str) -> list[str]:
    """The text of each content part; an image, file or audio part, or an unknown one, is refused."""
    texts: list[str] = []
    for index, raw in enumerate(parts):
        part = cast(dict[str, Any], raw) if isinstance(raw, dict) else {}
        kind = part.get("type")
        if kind in _TEXT_PARTS and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            texts.append(part["refusal"])
        elif kind in ("input_image", "input_file", "input_audio"):
            raise Unsupported(f"{where}[{index}]: {kind} is not supported ({_NOT_TEXT})")
        else:
            raise Unsupported(f"{where}[{index}]: not a text content part ({kind!r})")
    return texts


def _text(parts: Any, where: str) -> str:
    if isinstance(parts, str):
        return parts
    if not isinstance(parts, list):
        raise Unsupported(f"{where} must be a string or a list of content parts")
    return "".join(_texts(cast(list[Any], parts), where))


def _string(item: dict[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or (key != "arguments" and not value):
        raise Unsupported(f"{where}.{key} must be a non-empty string")
    return value


def _tool(index: int, tool: dict[str, Any]) -> dict[str, Any]:
    kind = tool.get("type")
    if kind != "function":
        raise Unsupported(f"tools[{index}]: tool type {kind!r} is not supported ({_BUILT_IN})")
    name = tool.get("name")
    if not isinstance(name, str) or not name:
        raise Unsupported(f"tools[{index}].name must be a non-empty string")
    function: dict[str, Any] = {"name": name}
    for key in ("description", "parameters", "strict"):
        if tool.get(key) is not None:
            function[key] = tool[key]
    return {"type": "function", "function": function}


def _tool_choice(choice: str | dict[str, Any]) -> str | dict[str, Any]:
    if isinstance(choice, str):
        if choice not in ("auto", "none", "required"):
            raise Unsupported(f"tool_choice {choice!r} is not one of auto, none, required")
        return choice
    if choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise Unsupported(f"tool_choice {choice!r} is not supported (auto, none, required or a function by name)")


def _text_format(text: Any, chat: dict[str, Any]) -> None:
    """``text.format`` -> the chat ``response_format`` (plain text needs none)."""
    if not isinstance(text, dict):
        return
    fmt = cast(dict[str, Any], text).get("format")
    if not isinstance(fmt, dict):
        return
    fmt = cast(dict[str, Any], fmt)
    kind = fmt.get("type")
    if kind == "json_schema":
        schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        chat["response_format"] = {"type": "json_schema", "json_schema": schema}
    elif kind == "json_object":
        chat["response_format"] = {"type": "json_object"}
    elif kind not in (None, "text"):
        raise Unsupported(f"text.format type {kind!r} is not supported (text, json_object or json_schema)")
