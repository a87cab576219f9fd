"""A chat completion answered as OpenAI's Responses API: a ``response`` object, or its stream of events.

`ResponsesCall` is the `agentlightning.proxy._translate.Translation` of one ``POST /v1/responses`` call. Its id is
``resp_`` and the backend's chat completion id (`responses_id`). Output
items: ``reasoning`` (the chat message's ``reasoning_content`` / ``reasoning``), a ``message`` with one
``output_text`` part (with its logprobs when the request includes ``message.output_text.logprobs``), and one
``function_call`` per tool call, whose ``call_id`` is the chat tool call's id. ``finish_reason`` ``length`` makes the
response ``incomplete`` (``max_output_tokens``), as ``content_filter`` does; usage is the chat usage (a streamed
call asks the backend for it).

Streams follow the Responses event sequence the ``openai`` SDK parses: ``response.created``,
``response.in_progress``, then per item ``response.output_item.added``, its deltas (``response.output_text.delta``
within a ``response.content_part.added`` / ``.done`` pair, ``response.function_call_arguments.delta``,
``response.reasoning_text.delta``), their ``.done`` events and ``response.output_item.done``, and
``response.completed`` (or ``response.incomplete``) with the whole response, which is what the proxy records.
"""

from __future__ import annotations

import secrets
import time
from typing import Any, cast

from agentlightning.proxy._assemble import dumps

__all__ = ["ResponsesCall", "responses_id"]

_INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}
_MESSAGE = -1
_REASONING = -2
"""Keys of the message and reasoning items among the output items (a tool call's key is its index, from 0)."""


def _new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def responses_id(chat_id: str) -> str:
    """The id of the response that answers the chat completion ``chat_id``: one id along the path, so a response
    the agent saw is found in the backend's logs (and a test's model server) by the chat id in it."""
    return f"resp_{chat_id}"


class ResponsesCall:
    """One Responses call served through chat completions (see the module docs).

    Args:
        request: The agent's Responses request, as sent.
        chat_request: Its chat completion request (``agentlightning.proxy._responses.chat_request``).
    """

    def __init__(self, request: dict[str, Any], chat_request: dict[str, Any]) -> None:
        self.request = request
        self.chat_request = chat_request
        self.id = _new_id("resp")
        self.created_at = int(time.time())
        self._logprobs = "message.output_text.logprobs" in (request.get("include") or [])
        self._order: list[int] = []
        """The output items' keys in their order (`_MESSAGE`, `_REASONING`, a tool call's index)."""
        self._ids: dict[int, str] = {}
        self._call_ids: dict[int, str] = {}
        # streaming
        self._sequence = 0
        self._open: int | None = None
        self._texts: dict[int, list[str]] = {}
        self._names: dict[int, str] = {}
        self._started = False

    # ------------------------------------------------------------------ the response object
    def _key(self, key: int) -> int:
        """The output index of item ``key``, given an id when first seen."""
        if key not in self._ids:
            prefix = "msg" if key == _MESSAGE else "rs" if key == _REASONING else "fc"
            self._ids[key] = _new_id(prefix)
            self._order.append(key)
        return self._order.index(key)

    def _envelope(self, status: str, output: list[dict[str, Any]], model: Any) -> dict[str, Any]:
        request = self.request
        tools = [t for t in request.get("tools") or [] if isinstance(t, dict)]
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": None,
            "incomplete_details": None,
            "instructions": request.get("instructions"),
            "max_output_tokens": request.get("max_output_tokens"),
            "model": model or request.get("model") or "",
            "output": output,
            "parallel_tool_calls": request.get("parallel_tool_calls", True) is not False,
            "previous_response_id": None,
            "reasoning": request.get("reasoning") or {"effort": None, "summary": None},
            "store": False,
            "temperature": request.get("temperature"),
            "text": request.get("text") or {"format": {"type": "text"}},
            "tool_choice": request.get("tool_choice") or "auto",
            "tools": tools,
            "top_p": request.get("top_p"),
            "truncation": request.get("truncation") or "disabled",
            "usage": None,
            "user": request.get("user"),
            "metadata": request.get("metadata") or {},
        }

    def answer(self, chat: dict[str, Any]) -> dict[str, Any]:
        """The ``response`` object for a chat completion (its first choice)."""
        if isinstance(chat.get("id"), str) and chat["id"]:
            self.id = responses_id(chat["id"])
        choices = chat.get("choices")
        choice: dict[str, Any] = {}
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            choice = cast(dict[str, Any], choices[0])
        message = cast(dict[str, Any], choice.get("message") or {})
        finish = choice.get("finish_reason")
        status = "incomplete" if finish in _INCOMPLETE else "completed"
        reasoning = message.get("reasoning_content") or message.get("reasoning")
        content = message.get("content")
        text = content if isinstance(content, str) else ""
        calls = [c for c in cast(list[Any], message.get("tool_calls") or []) if isinstance(c, dict)]
        items: dict[int, dict[str, Any]] = {}
        if isinstance(reasoning, str) and reasoning:
            items[_REASONING] = self._reasoning_item(reasoning)
        if text or not calls:
            items[_MESSAGE] = self._message_item(text, status, choice.get("logprobs"))
        for index, call in enumerate(calls):
            items[index] = self._call_item(index, cast(dict[str, Any], call))
        for key in (_REASONING, _MESSAGE, *range(len(calls))):  # a streamed answer's own order comes first
            if key in items:
                self._key(key)
        response = self._envelope(status, [items[key] for key in self._order if key in items], chat.get("model"))
        if finish in _INCOMPLETE:
            response["incomplete_details"] = {"reason": _INCOMPLETE[finish]}
        response["usage"] = _usage(chat.get("usage"))
        return response

    def _message_item(self, text: str, status: str, logprobs: Any) -> dict[str, Any]:
        part: dict[str, Any] = {"type": "output_text", "text": text, "annotations": []}
        if self._logprobs:
            entries = cast(dict[str, Any], logprobs).get("content") if isinstance(logprobs, dict) else None
            part["logprobs"] = entries or []
        self._key(_MESSAGE)
        return {"id": self._ids[_MESSAGE], "type": "message", "role": "assistant", "status": status, "content": [part]}

    def _reasoning_item(self, text: str) -> dict[str, Any]:
        self._key(_REASONING)
        content = [{"type": "reasoning_text", "text": text}]
        return {"id": self._ids[_REASONING], "type": "reasoning", "summary": [], "content": content}

    def _call_item(self, index: int, call: dict[str, Any]) -> dict[str, Any]:
        self._key(index)
        function = cast(dict[str, Any], call.get("function") or {})
        call_id = self._call_ids.setdefault(index, str(call.get("id") or _new_id("call")))
        return {
            "id": self._ids[index],
            "type": "function_call",
            "call_id": call_id,
            "name": str(function.get("name") or ""),
            "arguments": str(function.get("arguments") or ""),
            "status": "completed",
        }

    # ------------------------------------------------------------------ the stream of events
    def _event(self, kind: str, **fields: Any) -> bytes:
        event = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return b"event: " + kind.encode() + b"\ndata: " + dumps(event) + b"\n\n"

    def events(self, chunk: dict[str, Any]) -> bytes:
        """The events for one chat completion chunk (the first one opens the response)."""
        out: list[bytes] = []
        if not self._started:
            self._started = True
            if isinstance(chunk.get("id"), str) and chunk["id"]:
                self.id = responses_id(chunk["id"])
            response = self._envelope("in_progress", [], chunk.get("model"))
            out += [self._event("response.created", response=response),
                    self._event("response.in_progress", response=response)]  # fmt: skip
        choices = chunk.get("choices")
        choice = cast(dict[str, Any], choices[0]) if isinstance(choices, list) and choices else {}
        if choice.get("index", 0) != 0:
            return b"".join(out)
        delta = cast(dict[str, Any], choice.get("delta") or {})
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        if isinstance(reasoning, str) and reasoning:
            out.append(self._delta(_REASONING, reasoning))
        if isinstance(delta.get("content"), str) and delta["content"]:
            out.append(self._delta(_MESSAGE, delta["content"]))
        for raw in cast(list[Any], delta.get("tool_calls") or []):
            if isinstance(raw, dict):
                call = cast(dict[str, Any], raw)
                out.append(self._call_delta(int(call.get("index", 0)), call))
        return b"".join(out)

    def _open_item(self, key: int, item: dict[str, Any]) -> bytes:
        out = self._close_open()
        self._open = key
        self._texts[key] = []
        index = self._key(key)
        out += self._event("response.output_item.added", output_index=index, item=item)
        if key == _MESSAGE:
            part = {"type": "output_text", "text": "", "annotations": []}
            out += self._event("response.content_part.added", item_id=self._ids[key], output_index=index,
                               content_index=0, part=part)  # fmt: skip
        return out

    def _delta(self, key: int, text: str) -> bytes:
        out = b""
        if self._open != key:
            self._key(key)
            item: dict[str, Any] = {"id": self._ids[key], "status": "in_progress"}
            if key == _MESSAGE:
                item.update(type="message", role="assistant", content=[])
            else:
                item.update(type="reasoning", summary=[], content=[])
            out = self._open_item(key, item)
        self._texts[key].append(text)
        index, item_id = self._order.index(key), self._ids[key]
        if key == _MESSAGE:
            return out + self._event("response.output_text.delta", item_id=item_id, output_index=index,
                                     content_index=0, delta=text, logprobs=[])  # fmt: skip
        return out + self._event("response.reasoning_text.delta", item_id=item_id, output_index=index,
                                 content_index=0, delta=text)  # fmt: skip

    def _call_delta(self, key: int, call: dict[str, Any]) -> bytes:
        function = cast(dict[str, Any], call.get("function") or {})
        out = b""
        if self._open != key:
            self._key(key)
            call_id = self._call_ids.setdefault(key, str(call.get("id") or _new_id("call")))
            self._names[key] = str(function.get("name") or "")
            item = {"id": self._ids[key], "type": "function_call", "call_id": call_id, "name": self._names[key],
                    "arguments": "", "status": "in_progress"}  # fmt: skip
            out = self._open_item(key, item)
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments:
            self._texts[key].append(arguments)
            out += self._event("response.function_call_arguments.delta", item_id=self._ids[key],
                               output_index=self._order.index(key), delta=arguments)  # fmt: skip
        return out

    def _close_open(self) -> bytes:
        """The ``.done`` events of the item being streamed, if one is."""
        key, self._open = self._open, None
        if key is None:
            return b""
        text, index, item_id = "".join(self._texts[key]), self._order.index(key), self._ids[key]
        if key == _MESSAGE:
            part = {"type": "output_text", "text": text, "annotations": []}
            item: dict[str, Any] = {"id": item_id, "type": "message", "role": "assistant", "status": "completed",
                                    "content": [part]}  # fmt: skip
            return (
                self._event("response.output_text.done", item_id=item_id, output_index=index, content_index=0,
                            text=text, logprobs=[])
                + self._event("response.content_part.done", item_id=item_id, output_index=index, content_index=0,
                              part=part)
                + self._event("response.output_item.done", output_index=index, item=item)
            )  # fmt: skip
        if key == _REASONING:
            item = self._reasoning_item(text)
            return (
                self._event("response.reasoning_text.done", item_id=item_id, output_index=index, content_index=0,
                            text=text)
                + self._event("response.output_item.done", output_index=index, item=item)
            )  # fmt: skip
        item = {"id": item_id, "type": "function_call", "call_id": self._call_ids[key], "name": self._names[key],
                "arguments": text, "status": "completed"}  # fmt: skip
        return self._event(
            "response.function_call_arguments.done",
            item_id=item_id,
            output_index=index,
            name=self._names[key],
            arguments=text,
        ) + self._event("response.output_item.done", output_index=index, item=item)

    def closing(self, answer: dict[str, Any]) -> bytes:
        """The open item's ``.done`` events and ``response.completed`` (``.incomplete``) with ``answer``."""
        out = b""
        if not self._started:  # a stream without a single chunk: still a whole response
            self._started = True
            out += self._event("response.created", response={**answer, "status": "in_progress", "output": []})
        out += self._close_open()
        final = "response.incomplete" if answer["status"] == "incomplete" else "response.completed"
        return out + self._event(final, response=answer)

    def failed(self, status: int, kind: str, message: str) -> bytes:
        """An ``error`` event (the ``openai`` SDK raises it as an `APIError`)."""
        return b"event: error\ndata: " + dumps({"error": {"message": message, "type": kind, "code": status}}) + b"\n\n"


def _usage(usage: Any) -> dict[str, Any] | None:
    """The chat usage in the Responses shape."""
    if not isinstance(usage, dict):
        return None
    usage = cast(dict[str, Any], usage)
    prompt, completion = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    reasoning = (usage.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": int(usage.get("total_tokens") or prompt + completion),
    }
