"""The proxy's Anthropic Messages routes: ``POST {prefix}/v1/messages`` and ``{prefix}/v1/messages/count_tokens``.

A Messages call is translated to a chat completion (``_messages.py``) and answered by `LLMProxy.complete`, the chat
route's own handler: the same slot checks, late-call refusal, pause, limits, and the same record (the chat request
the backend rendered, with its exact prompt and response token ids). Its answer is translated back: a JSON answer
here, a stream by ``_messages_stream.py``, and every error into Anthropic's error shape (status and headers kept).

Anthropic's SDKs send the key as ``x-api-key``: the proxy takes it where others send ``Authorization: Bearer``
(`ProxyASGI`). Their ``base_url`` has no ``/v1`` (they add ``/v1/messages``):
``agl.llm_base_url().removesuffix("/v1")``.

``count_tokens`` renders the conversation with the served model's chat template through the backend's ``POST
/tokenize`` (vLLM's route; the embedded backend serves it too) and answers ``{"input_tokens": n}``; a backend without
it gets a 400 that says so.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

from pydantic import BaseModel, ConfigDict, StrictBool, StrictInt
from starlette.responses import Response, StreamingResponse

from agentlightning._routing import Route
from agentlightning.proxy._asgi import COMPLETIONS_TAG, SLOT, ProxyRequest
from agentlightning.proxy._assemble import Kind, dumps, loads
from agentlightning.proxy._messages import MessagesRefusal, anthropic_error, chat_request, message_answer
from agentlightning.proxy._messages_stream import message_events

if TYPE_CHECKING:
    from agentlightning.proxy._proxy import LLMProxy
    from agentlightning.proxy._routes import Target

__all__ = ["messages_routes"]

_DROPPED_HEADERS = frozenset({"content-length", "content-type"})


class MessagesBody(BaseModel):
    """An Anthropic Messages request (the fields the proxy checks first; the rest is checked as it is translated)."""

    model_config = ConfigDict(extra="allow")
    model: str | None = None
    messages: list[Any]
    max_tokens: StrictInt
    stream: StrictBool = False


class CountTokensBody(BaseModel):
    """An Anthropic ``count_tokens`` request: a Messages request without ``max_tokens``."""

    model_config = ConfigDict(extra="allow")
    model: str | None = None
    messages: list[Any]


class MessagesAnswer(BaseModel):
    """A Messages answer (``type: message``), a stream of Messages events, or ``{"input_tokens": n}``."""

    model_config = ConfigDict(extra="allow")


def _refused(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    return Response(anthropic_error(status, message), status, headers=headers, media_type="application/json")


def _kept_headers(answer: Response) -> dict[str, str]:
    return {k: v for k, v in answer.headers.items() if k.lower() not in _DROPPED_HEADERS}


def as_messages_error(answer: Response) -> Response:
    """An error answer of the chat path (OpenAI's shape) in Anthropic's shape, status and headers kept."""
    body = bytes(answer.body)
    message = body.decode("utf-8", errors="replace")[:4000]
    try:
        parsed = loads(body)
        error = cast(dict[str, Any], parsed.get("error")) if isinstance(parsed, dict) else None
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            message = cast(str, error["message"])
    except ValueError:
        pass
    return _refused(answer.status_code, message, _kept_headers(answer))


def _translated(answer: Response, stops: list[str]) -> Response:
    if isinstance(answer, StreamingResponse):
        answer.body_iterator = message_events(answer.body_iterator, stops)  # pyright: ignore[reportArgumentType]
        return answer
    if answer.status_code >= 400:
        return as_messages_error(answer)
    try:
        chat = loads(bytes(answer.body))
    except ValueError:
        return _refused(502, "the backend's answer is not JSON")
    body = dumps(message_answer(cast(dict[str, Any], chat), stops))
    return Response(body, 200, headers=_kept_headers(answer), media_type="application/json")


def _plain_refusal(proxy: LLMProxy, target: Target) -> Response | None:
    if target.rollout_id is not None or target.slot is not None or proxy.allow_unrecorded:
        return None
    return _refused(
        400,
        "this LLM proxy records calls per rollout: give the Anthropic client base_url="
        "agl.llm_base_url().removesuffix('/v1') (a runner slot's URL) or {proxy}/rollout/{rollout_id}/attempt/"
        "{attempt_id}; plain /v1/messages is refused so that no training data is silently lost",
    )


async def _count_tokens(proxy: LLMProxy, target: Target, body: dict[str, Any], authorization: str | None) -> Response:
    """``{"input_tokens": n}``: the conversation rendered by the backend's chat template (its ``/tokenize``)."""
    try:
        chat = chat_request({**body, "max_tokens": 1})
    except MessagesRefusal as exc:
        return _refused(400, str(exc))
    request: dict[str, Any] = {"messages": chat["messages"], "add_generation_prompt": True}
    for name in ("tools", "model"):
        if name in chat:
            request[name] = chat[name]
    if proxy.served_model:
        request["model"] = proxy.served_model
    answer = await proxy.unrecorded_call(target, "POST", "/tokenize", dumps(request), authorization)
    status, raw = answer.status_code, bytes(answer.body)
    if status == 502:
        return as_messages_error(answer)
    if status in (404, 405):
        return _refused(
            400,
            "count_tokens needs the backend's POST /tokenize (vLLM's route; the embedded backend serves it too), "
            f"and the backend answered {status}: tokens cannot be counted with the served model's template",
        )
    if status >= 400:
        return as_messages_error(answer)
    try:
        count = loads(raw).get("count")
    except (ValueError, AttributeError):
        count = None
    if not isinstance(count, int):
        return _refused(502, "the backend answered /tokenize without a 'count'")
    return Response(dumps({"input_tokens": count}), 200, media_type="application/json")


def messages_routes(
    proxy: LLMProxy,
    target: Callable[[Kind, dict[str, str]], Target | Response],
    shapes: Sequence[tuple[str, str, str, str]],
) -> list[Route]:
    """``/v1/messages`` and ``/v1/messages/count_tokens`` under each URL shape of ``shapes`` (``_routes.py``'s:
    prefix, scope, operation-id prefix, auth rule); ``target`` turns a path's parameters into its `Target`."""

    async def messages(request: ProxyRequest) -> Response:
        found = target("chat", request.params)
        if isinstance(found, Response):
            return as_messages_error(found)
        refusal = _plain_refusal(proxy, found)
        if refusal is not None:
            return refusal
        body = cast(dict[str, Any], request.parsed)
        try:
            chat = chat_request(body)
        except MessagesRefusal as exc:
            return _refused(400, str(exc))
        if body.get("stream"):
            chat["stream"] = True
            chat["stream_options"] = {"include_usage": True}
        answer = await proxy.complete(found, chat, request.authorization, request.agent)
        return _translated(answer, cast(list[str], chat.get("stop") or []))

    async def count_tokens(request: ProxyRequest) -> Response:
        found = target("chat", request.params)
        if isinstance(found, Response):
            return as_messages_error(found)
        return await _count_tokens(proxy, found, cast(dict[str, Any], request.parsed), request.authorization)

    errors = {
        400: "not JSON, a field or block the proxy cannot honour (named), or a plain /v1 call it does not record",
        404: "the slot runs no attempt now, or the attempt is unknown to the store",
        409: "the attempt already ended: a late call, not recorded",
        502: "the backend could not be reached, or the call could not be recorded",
        503: "paused for a model update (Retry-After)",
    }
    routes: list[Route] = []
    for prefix, scope, name, auth in shapes:
        where = f" ({scope} URL)." + (" The slot's key in the URL admits the call." if auth == SLOT else "")
        routes += [
            Route("POST", f"{prefix}/v1/messages", messages, f"{name}messages",
                  f"An Anthropic Messages call, answered by the chat path and recorded as a chat call{where}",
                  body=MessagesBody, response=MessagesAnswer, errors=errors, tags=(COMPLETIONS_TAG,), auth=auth),
            Route("POST", f"{prefix}/v1/messages/count_tokens", count_tokens, f"{name}messages_count_tokens",
                  f"The prompt's token count with the served model's template (the backend's /tokenize){where}",
                  body=CountTokensBody, response=MessagesAnswer, errors={400: errors[400], 502: errors[502]},
                  tags=("messages",), auth=auth),
        ]  # fmt: skip
    return routes
