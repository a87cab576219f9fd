"""The LLM proxy's route table: every route declared once, dispatched by `ProxyASGI` and documented from the same table.

==================================================================  =========================================
``POST {prefix}/v1/chat/completions``, ``{prefix}/v1/completions``   forwarded to a backend and recorded
``POST {prefix}/v1/responses``                                       translated to a chat completion, recorded
``GET  {prefix}/v1/models``                                          the backend's model list
``POST {prefix}/v1/messages``, ``.../v1/messages/count_tokens``      Anthropic's Messages API, as chat calls
``PUT`` / ``DELETE /slot/{key}``                                      register / clear a runner slot (runner token)
``PUT /slots``                                                        register slots, report ends (runner token)
``/admin/*``                                                          pause, resume, backends, status
==================================================================  =========================================

The agent APIs are one table, `AGENT_APIS`. ``{prefix}`` is ``/rollout/{rollout_id}/attempt/{attempt_id}`` (the
per-rollout URL), ``/slot/{key}`` (a runner slot's URL) or nothing (plain ``/v1``, refused for completions unless
``allow_unrecorded``). A path no route serves is answered 404 naming it and the APIs of `AGENT_APIS`, before any
token check (`agentlightning.proxy._asgi.ProxyASGI.unserved`). Under a runner slot's
URL the slot's key is the agent's credential (`slot_refusal`): the URL alone is enough, whatever ``api_key`` the agent
sends; the per-rollout and plain URLs need the agents' token (when the proxy has one). The completion bodies
are OpenAI's: their models check the fields the proxy reads (400 with a one-line reason) and the body is forwarded
as it was sent, every other field included (`agentlightning._server_base.validate_body`).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, StrictBool
from starlette.responses import Response

from agentlightning._netauth import MIN_TOKEN_LENGTH, bearer_matches
from agentlightning._routing import Method, Route, openapi_document
from agentlightning._server_base import Refusal, validate_body
from agentlightning._urls import check_slot_key
from agentlightning.proxy._admin import admin_routes
from agentlightning.proxy._asgi import ADMIN, COMPLETIONS_TAG, RUNNER, SLOT, ProxyRequest, error
from agentlightning.proxy._assemble import Kind
from agentlightning.proxy._responses import ResponsesBody, responses_call
from agentlightning.proxy._slots import MAX_PER_REQUEST, clear_slot, register_slot, update_slots

if TYPE_CHECKING:
    from agentlightning.proxy._proxy import LLMProxy

__all__ = ["AGENT_APIS", "AgentApi", "Target", "proxy_routes", "runner_refusal", "served_apis", "slot_refusal"]

ROLLOUT_PREFIX = "/rollout/{rollout_id}/attempt/{attempt_id}"
SLOT_PREFIX = "/slot/{slot}"


class Target(NamedTuple):
    """What a completion path names: its kind and either a rollout's attempt, a runner slot, or nothing (plain)."""

    kind: Kind
    rollout_id: str | None = None
    attempt_id: str | None = None
    slot: str | None = None


class ChatCompletionBody(BaseModel):
    """An OpenAI chat completion request (any other OpenAI field is forwarded too)."""

    model_config = ConfigDict(extra="allow")
    model: str | None = None
    messages: list[dict[str, Any]]
    stream: StrictBool = False


class CompletionBody(BaseModel):
    """An OpenAI text completion request (any other OpenAI field is forwarded too)."""

    model_config = ConfigDict(extra="allow")
    model: str | None = None
    prompt: str | list[str] | list[int] | list[list[int]]
    stream: StrictBool = False


class OpenAIAnswer(BaseModel):
    """The backend's answer, passed on unchanged (a completion, a stream of chunks, or the model list)."""

    model_config = ConfigDict(extra="allow")


class ProxyError(BaseModel):
    """Every error the proxy itself answers: ``{"error": {"message", "type", "code"}}`` as OpenAI's API does."""

    error: dict[str, Any]


class SlotBody(BaseModel):
    """The attempt a runner slot runs now (``DELETE``: optional, clears only that occupant)."""

    model_config = ConfigDict(extra="forbid")
    rollout_id: str = Field(min_length=1)
    attempt_id: str = Field(min_length=1)


class EndedAttempt(BaseModel):
    """An attempt whose agent returned: its calls are refused from now on (409), on ``slot`` too if it still runs it."""

    model_config = ConfigDict(extra="forbid")
    rollout_id: str = Field(min_length=1)
    attempt_id: str = Field(min_length=1)
    slot: str | None = None


class SlotsBody(BaseModel):
    """Many slots' attempts at once (slot key -> the attempt it runs now), and attempts that ended."""

    model_config = ConfigDict(extra="forbid")
    slots: dict[str, SlotBody] = {}
    ended: list[EndedAttempt] = []


class SlotsAnswer(BaseModel):
    """How many slots were registered and attempts ended (all of the request's)."""

    registered: int
    ended: int


class SlotAnswer(BaseModel):
    """The slot's registration, or whether it was cleared."""

    model_config = ConfigDict(extra="allow")
    slot: str


_TITLE = "Agent Lightning LLM proxy"
_DESCRIPTION = "OpenAI-compatible calls forwarded to inference backends, each recorded with its exact token ids."
_COMMON_ERRORS = {401: "missing or wrong token (the agents' api_key)", 413: "body too large"}
_SLOT_DOC = " The slot's key in the URL admits the call (no token needed while the slot is registered)."
_RUNNER_401 = "missing or wrong runner token (the agents' token does not open slot routes)"
_RESPONSES_400 = (
    "not JSON, a plain /v1 call the proxy does not record, or what it cannot honour (previous_response_id, "
    "conversation, built-in tools, image or file input) or malformed input items"
)
_COMPLETION_ERRORS = {
    400: "not JSON, or a plain /v1 call the proxy does not record",
    404: "the slot runs no attempt now, or the attempt is unknown to the store; or a path the proxy does not serve "
    "(answered before any token check, naming the APIs it serves)",
    409: "the attempt already ended (its runner said so, or the store refused its record): a late call, not recorded",
    502: "the backend could not be reached, or the call could not be recorded",
    503: "paused for a model update (Retry-After)",
}


def proxy_routes(proxy: LLMProxy) -> list[Route]:
    """Every route of ``proxy``, ``/openapi.json`` included (written from the others)."""
    routes = [*_completion_routes(proxy), *_slot_routes(proxy), *admin_routes(proxy)]
    body = json.dumps(_document(proxy, routes), separators=(",", ":")).encode()

    async def openapi(_: ProxyRequest) -> Response:
        return Response(body, media_type="application/json")

    return [*routes, Route("GET", "/openapi.json", openapi, "openapi", "This document.", documented=False)]


def _target(kind: Kind, params: dict[str, str]) -> Target | Response:
    """What a completion path names, or the 404 of a malformed slot key."""
    slot = params.get("slot")
    if slot is None:
        return Target(kind, params.get("rollout_id"), params.get("attempt_id"))
    try:
        return Target(kind, slot=check_slot_key(slot))
    except ValueError as exc:
        return error(404, f"not a runner slot's URL: {exc}", "invalid_request_error")


async def _chat(proxy: LLMProxy, target: Target, request: ProxyRequest) -> Response:
    return await proxy.complete(target, request.parsed, request.authorization, request.agent)


async def _models(proxy: LLMProxy, target: Target, request: ProxyRequest) -> Response:
    return await proxy.models(target, request.authorization)


async def _responses(proxy: LLMProxy, target: Target, request: ProxyRequest) -> Response:
    translated = responses_call(request.parsed)
    if isinstance(translated, Refusal):
        return error(translated.status, translated.message, translated.kind)
    return await proxy.complete(target, translated.chat_request, request.authorization, request.agent, translated)


class AgentApi(NamedTuple):
    """One API the proxy serves to agents, under each of the three URL shapes (one row of `AGENT_APIS`)."""

    api: str
    """What it is, as the 404 of an unserved path names it (``OpenAI Responses``)."""
    method: Method
    path: str
    """The path under the URL shape's prefix (``/v1/responses``)."""
    name: str
    """The operation name (prefixed per URL shape)."""
    kind: Kind
    """What the backend is asked for (``chat``: its chat completions; an API other than chat is translated)."""
    doc: str
    answer: Callable[[LLMProxy, Target, ProxyRequest], Awaitable[Response]]
    body: type[BaseModel] | None = None
    errors: dict[int, str] = _COMPLETION_ERRORS
    tags: tuple[str, ...] = (COMPLETIONS_TAG,)


AGENT_APIS: tuple[AgentApi, ...] = (
    AgentApi("OpenAI Chat Completions", "POST", "/v1/chat/completions", "chat_completions", "chat",
             "A chat completion, forwarded and recorded", _chat, ChatCompletionBody),
    AgentApi("OpenAI Completions", "POST", "/v1/completions", "completions", "completion",
             "A text completion, forwarded and recorded", _chat, CompletionBody),
    AgentApi("OpenAI Responses", "POST", "/v1/responses", "responses", "chat",
             "A response (OpenAI's Responses API), served through the backend's chat completions and recorded",
             _responses, ResponsesBody, {**_COMPLETION_ERRORS, 400: _RESPONSES_400}),
    AgentApi("OpenAI Models", "GET", "/v1/models", "models", "chat", "The backend's models", _models,
             errors={502: "the backend could not be reached"}, tags=("models",)),
)  # fmt: skip
"""Every API agents call, one row each: a new API is one more row (its routes under the three URL shapes, its
place in the 404 of an unserved path and in ``/openapi.json`` follow)."""


MESSAGES_APIS: tuple[tuple[str, Method, str], ...] = (
    ("Anthropic Messages", "POST", "/v1/messages"),
    ("Anthropic Messages token count", "POST", "/v1/messages/count_tokens"),
)
"""The Anthropic routes (`agentlightning.proxy._messages_routes`: their errors are Anthropic-shaped, so they are
not rows of `AGENT_APIS`), as the 404 of an unserved path names them."""


def served_apis() -> str:
    """The APIs the proxy serves, as the 404 of an unserved path lists them."""
    rows = [(api.api, api.method, api.path) for api in AGENT_APIS] + list(MESSAGES_APIS)
    apis = ", ".join(f"{api} ({method} {path})" for api, method, path in rows)
    shapes = f"{{proxy}}/v1, {{proxy}}{ROLLOUT_PREFIX}/v1 or {{proxy}}/slot/{{key}}/v1"
    return f"{apis}, under a base URL ending in /v1: {shapes}"


def _completion_routes(proxy: LLMProxy) -> list[Route]:
    """Every row of `AGENT_APIS` under each of the three URL shapes."""

    def handler(api: AgentApi) -> Callable[[ProxyRequest], Awaitable[Response]]:
        async def answer(request: ProxyRequest) -> Response:
            found = _target(api.kind, request.params)
            if isinstance(found, Response):
                return found
            return await api.answer(proxy, found, request)

        return answer

    routes: list[Route] = []
    shapes = (("", "plain", "", "bearer"), (ROLLOUT_PREFIX, "per-rollout", "rollout_", "bearer"),
              (SLOT_PREFIX, "runner slot", "slot_", SLOT))  # fmt: skip
    from agentlightning.proxy._messages_routes import messages_routes  # imports this module's names

    routes += messages_routes(proxy, _target, shapes)
    for prefix, scope, name, auth in shapes:
        where = f" ({scope} URL).{_SLOT_DOC if auth == SLOT else ''}"
        routes += [
            Route(api.method, f"{prefix}{api.path}", handler(api), f"{name}{api.name}", f"{api.doc}{where}",
                  body=api.body, response=OpenAIAnswer, errors=api.errors, tags=api.tags, auth=auth)
            for api in AGENT_APIS
        ]  # fmt: skip
    return routes


def slot_refusal(proxy: LLMProxy, authorization: str | None, key: str | None) -> Refusal | None:
    """The `SLOT` rule: a registered runner slot's key admits its agent's calls; else the agents' token.

    The runner hands its agent the slot's URL (`agentlightning.llm_base_url`) and nothing else the agent must pass
    on, so an agent written as its framework's docs write it (``api_key="none"``) works. The key is the agent's
    capability: drawn at random by the runner (24 characters, `agentlightning.runner.SlotRegistrar`), valid only
    while the slot is registered (a runner moves a slot to a new key after an unclean end), and a key shorter than
    `MIN_TOKEN_LENGTH` admits nothing (it could be guessed). The slot routes themselves (register, clear) still need
    the runner token, and the per-rollout URLs the agents' token: their ids are not secret.
    """
    if proxy.token is None or bearer_matches(authorization, proxy.token):
        return None
    if key is not None and len(key) >= MIN_TOKEN_LENGTH and proxy.slots.occupant(key) is not None:
        return None
    return Refusal(
        401,
        "this runner slot is not registered on the LLM proxy (its runner registers it before the agent starts and "
        "again with each heartbeat; a restarted proxy learns it back), so the call needs 'Authorization: Bearer "
        "<token>' (the LLM resource's api_key)",
        "unauthorized",
        {"WWW-Authenticate": "Bearer"},
    )


def runner_refusal(proxy: LLMProxy, authorization: str | None) -> Refusal | None:
    """The `RUNNER` rule: the runner token (the agents' api_key does not open the slot routes)."""
    if bearer_matches(authorization, proxy.runner_token):
        return None
    return Refusal(
        401,
        "runner slot routes need 'Authorization: Bearer <runner token>' (LLMResource.runner_token, which the "
        "trainer publishes for runners; the agents' api_key does not open them)",
        "unauthorized",
        {"WWW-Authenticate": "Bearer"},
    )


def _slot_routes(proxy: LLMProxy) -> list[Route]:
    """Register and clear runner slots (auth rule `RUNNER`: `runner_refusal`; bodies validated by their models)."""

    async def slot(request: ProxyRequest) -> Response:
        try:
            key = check_slot_key(request.params["slot"])
        except ValueError as exc:
            return error(404, f"not a runner slot's URL: {exc}", "invalid_request_error")
        if request.method == "PUT":
            body: SlotBody = request.parsed
            return register_slot(proxy.slots, key, (body.rollout_id, body.attempt_id))
        if not request.body.strip():
            return clear_slot(proxy.slots, key, None)
        occupant = validate_body(SlotBody, request.body, 400)  # DELETE's body is optional: validated here
        if isinstance(occupant, Refusal):
            return error(400, occupant.message, "invalid_request_error")
        return await _recorded(clear_slot(proxy.slots, key, (occupant.rollout_id, occupant.attempt_id)))

    async def slots(request: ProxyRequest) -> Response:
        body: SlotsBody = request.parsed
        registrations = [(key, (s.rollout_id, s.attempt_id)) for key, s in body.slots.items()]
        ends = [((e.rollout_id, e.attempt_id), e.slot) for e in body.ended]
        answer = update_slots(proxy.slots, registrations, ends)
        return await _recorded(answer) if ends else answer

    async def _recorded(answer: Response) -> Response:
        # An attempt's end is reported before its runner tells the store (which then refuses its records as late):
        # the records of its calls answered so far, still queued with record="background", are stored first.
        if proxy.record == "background":
            await proxy.flush()
        return answer

    full = {400: "invalid body", 401: _RUNNER_401, 503: "the slot table is full of live slots"}
    return [
        Route("PUT", SLOT_PREFIX, slot, "register_slot", "Register the attempt a runner slot runs from now on.",
              body=SlotBody, response=SlotAnswer, errors=full, tags=("slots",), auth=RUNNER),
        Route("DELETE", SLOT_PREFIX, slot, "clear_slot",
              "Clear a runner slot (with a body: only that occupant, whose attempt then counts as ended).",
              response=SlotAnswer, errors={400: "invalid body", 401: _RUNNER_401}, tags=("slots",), auth=RUNNER),
        Route("PUT", "/slots", slots, "register_slots",
              "Register the attempts of many runner slots and report attempts that ended (all or nothing).",
              body=SlotsBody, response=SlotsAnswer, errors={**full, 413: f"more than {MAX_PER_REQUEST} entries"},
              tags=("slots",), auth=RUNNER),
    ]  # fmt: skip


def _document(proxy: LLMProxy, routes: list[Route]) -> dict[str, Any]:
    """The OpenAPI document of ``routes``, with the auth rules this proxy enforces."""
    security: dict[str, dict[str, str]] = {}
    if proxy.token is not None:
        security["bearer"] = {"type": "http", "scheme": "bearer"}
    security[RUNNER] = {"type": "http", "scheme": "bearer", "description": "the runner token"}
    if proxy.admin_token is not None:
        security[ADMIN] = {"type": "http", "scheme": "bearer", "description": "the admin token"}
    return openapi_document(
        routes,
        title=_TITLE,
        version="1",
        description=_DESCRIPTION,
        error_model=ProxyError,
        common_errors=_COMMON_ERRORS,
        security=security,
    )
