"""How the LLM proxy answers a call: pick the rollout's backend, forward the request, relay the answer, record it.

`Forwarder` is the forwarding half of `LLMProxy` (``_proxy.py``, which holds the settings, controls and serving);
it records through `CallRecorder`. A rollout sticks to the backend it was first sent to, so the backend's prefix
cache is reused across its turns.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any, cast

import aiohttp
from starlette.responses import Response

from agentlightning._models import new_id, now
from agentlightning._policies import decode_agent_header
from agentlightning.proxy._asgi import RawResponse, error, raw_headers
from agentlightning.proxy._assemble import (
    MODEL_VERSION_HEADER,
    AgentView,
    Extracted,
    Kind,
    StreamAssembler,
    dumps,
    extract,
    loads,
    model_version_of,
)
from agentlightning.proxy._policy_routing import PolicyRouter
from agentlightning.proxy._recording import CallRecorder, unrecorded
from agentlightning.proxy._routes import Target
from agentlightning.proxy._slots import ATTEMPT_FINISHED, SLOT_NOT_REGISTERED, SlotTable
from agentlightning.proxy._streaming import Meta, StreamState, TrackedStream, relay
from agentlightning.proxy._translate import Translation, relay_translated
from agentlightning.proxy._transport import UNREACHABLE, BackendReply, send

__all__ = ["CALL_ID_HEADER", "Forwarder"]

logger = logging.getLogger("agentlightning.proxy._proxy")  # the proxy's logger

_MAX_STICKY = 100_000
_AS_IS = AgentView()  # nothing to take out: the proxy added no options (it does not record the call)
CALL_ID_HEADER = "x-agentlightning-call-id"


class Forwarder(CallRecorder):
    """The forwarding half of `LLMProxy` (which sets the attributes below in its constructor)."""

    token: str | None
    served_model: str | None
    policy_router: PolicyRouter | None
    allow_unrecorded: bool
    backend_api_key: str | None
    retry_after: int
    request_timeout: float
    slots: SlotTable
    _backends: list[str]
    _model_version: int | None
    _sticky: OrderedDict[str, str]
    _round_robin: itertools.count[int]
    _session: aiohttp.ClientSession | None
    _paused: bool
    _hold_s: float
    _held: int
    _resumed: asyncio.Event | None
    _in_flight: int
    _idle: asyncio.Event | None
    _calls: dict[str, dict[object, Callable[[], None]]]
    """Per rollout, its calls in flight: key (the handler task, or a stream's backend reply) -> how to abort it."""
    _aborted: set[asyncio.Task[Any]]
    resent: int
    """Requests sent to a backend a second time because their pooled connection had been closed (`send`)."""

    def _count_resend(self) -> None:
        self.resent += 1

    def _resumed_event(self) -> asyncio.Event:
        if self._resumed is None:
            self._resumed = asyncio.Event()
        return self._resumed

    async def _held_until_resumed(self) -> bool:
        """While paused with a hold: wait (at most ``_hold_s``) for `resume`; whether the proxy admits again."""
        if self._hold_s <= 0:
            return False
        self._held += 1
        try:
            async with asyncio.timeout(self._hold_s):  # not wait_for: 3.11's may swallow a cancellation
                await self._resumed_event().wait()
        except TimeoutError:
            return False
        finally:
            self._held -= 1
        return not self._paused

    def _idle_event(self) -> asyncio.Event:
        if self._idle is None:
            self._idle = asyncio.Event()
        return self._idle

    def _pick_backend(self, rollout_id: str | None) -> str:
        backends = self._backends
        if rollout_id is None:
            return backends[next(self._round_robin) % len(backends)]
        backend = self._sticky.get(rollout_id)
        if backend is None or backend not in backends:
            backend = backends[next(self._round_robin) % len(backends)]
            self._sticky[rollout_id] = backend
            if len(self._sticky) > _MAX_STICKY:
                self._sticky.popitem(last=False)
        return backend

    def _backend_headers(self, authorization: str | None) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self.backend_api_key:
            headers["Authorization"] = f"Bearer {self.backend_api_key}"
        elif authorization is not None and self.token is None:  # never hand the proxy's own token on
            headers["Authorization"] = authorization
        return headers

    # ------------------------------------------------------------------ answers
    def _unregistered(self, key: str) -> Response:
        return error(
            404,
            f"no rollout runs on runner slot {key!r} now (its rollout ended or was abandoned, or its runner has not "
            "registered it): the call is refused so that it is never recorded under another rollout",
            SLOT_NOT_REGISTERED,
        )

    def _late(self, rollout_id: str, attempt_id: str) -> Response:
        """Refuse (and count) a call for an attempt known to have ended (its runner said so, or the store did)."""
        self._count_late(rollout_id, attempt_id)
        return error(
            409,
            f"attempt {attempt_id!r} of rollout {rollout_id!r} has already ended: "
            "this late call is refused and not recorded, so a finished rollout's training data never grows",
            ATTEMPT_FINISHED,
        )

    async def models(self, target: Target, authorization: str | None) -> Response:
        """The model list of the backend that ``target``'s rollout sticks to (``/v1/models``)."""
        return await self.unrecorded_call(target, "GET", "/v1/models", b"", authorization)

    async def unrecorded_call(
        self, target: Target, method: str, path: str, body: bytes, authorization: str | None
    ) -> Response:
        """The answer of the backend that ``target``'s rollout sticks to for a request it does not record (the model
        list, ``/tokenize``), as it came; 502 if it cannot be reached."""
        rollout_id = target.rollout_id
        if target.slot is not None:
            occupant = self.slots.resolve(target.slot)
            rollout_id = occupant[0] if occupant is not None else None
        backend = self._pick_backend(rollout_id)
        headers = self._backend_headers(authorization)
        try:
            resp = await send(
                self._session, backend, method, path, body, headers, self.request_timeout, self._count_resend
            )
            try:
                body = await resp.read()
            finally:
                resp.release()
            return Response(body, resp.status, media_type=resp.content_type)
        except UNREACHABLE as exc:
            return error(502, f"LLM proxy could not reach backend {backend}: {exc!r}", "proxy_backend_error")

    async def complete(
        self,
        target: Target,
        agent_request: dict[str, Any],
        authorization: str | None,
        agent: str | None = None,
        translation: Translation | None = None,
    ) -> Response:
        """Forward one completion request and record it (the handler of every completion route).

        ``agent_request`` is the request body as the agent sent it, a JSON object whose fields the proxy reads were
        validated by the route's model. ``agent`` is the raw `agentlightning.AGENT_HEADER` of the request (the
        agent that makes the call). With a ``translation`` (an agent API served through chat completions),
        ``agent_request`` is its chat request and the agent is answered, and the call recorded, in its own API.
        """
        start = now()
        kind, rollout_id, attempt_id = target.kind, target.rollout_id, target.attempt_id
        if target.slot is not None:
            slot = self.slots.occupant(target.slot)
            if slot is None:
                return self._unregistered(target.slot)
            rollout_id, attempt_id = slot.rollout_id, slot.attempt_id
            if slot.ended:
                return self._late(rollout_id, attempt_id)
        elif rollout_id is None and not self.allow_unrecorded:
            path = "chat/completions" if kind == "chat" else "completions"
            return error(
                400,
                f"this LLM proxy records calls per rollout: use base URL "
                f"{{proxy}}/rollout/{{rollout_id}}/attempt/{{attempt_id}}/v1 (then POST .../v1/{path}) or a runner "
                "slot's URL (agentlightning.llm_base_url()); "
                "plain /v1 is refused so that no training data is silently lost",
                "invalid_request_error",
            )
        if rollout_id is not None and attempt_id is not None and self.slots.has_ended(rollout_id, attempt_id):
            return self._late(rollout_id, attempt_id)
        if self._paused and not await self._held_until_resumed():
            return error(
                503,
                "LLM proxy is paused for a model update; retry shortly",
                "proxy_paused",
                headers={"Retry-After": str(self.retry_after)},
            )
        self._in_flight += 1
        self._idle_event().clear()
        streamed = False
        task = asyncio.current_task()
        if rollout_id is not None and task is not None:
            self._calls.setdefault(rollout_id, {})[task] = task.cancel  # pyright: ignore[reportArgumentType]
        try:
            response, streamed = await self._forward(
                agent_request, kind, rollout_id, attempt_id, start, authorization, decode_agent_header(agent),
                translation,
            )  # fmt: skip
            return response
        except asyncio.CancelledError:
            if task is None or task not in self._aborted:
                raise  # the agent hung up, or the server stops
            task.uncancel()
            return error(409, f"rollout {rollout_id} was cancelled; the LLM proxy aborted this call", "call_aborted")
        finally:
            if rollout_id is not None and task is not None:
                self._untrack(rollout_id, task)
                self._aborted.discard(task)
            if not streamed:
                self._done()

    def _untrack(self, rollout_id: str, key: object) -> None:
        calls = self._calls.get(rollout_id)
        if calls is not None:
            calls.pop(key, None)
            if not calls:
                del self._calls[rollout_id]

    def abort_rollouts(self, rollout_ids: Iterable[str]) -> int:
        """Abort the calls in flight of these rollouts (cancelled ones: their answers would train nothing).

        A call still waiting for its answer is cancelled (its backend connection closes: vLLM aborts the request, the
        embedded backend frees the sequence) and its agent gets 409; a stream being relayed ends with an error (the
        backend connection closed, or the in-process stream stopped at its next chunk). Call it on the proxy's event
        loop.

        Returns:
            How many calls were aborted.
        """
        aborted = 0
        for rollout_id in rollout_ids:
            for key, abort in list(self._calls.get(rollout_id, {}).items()):
                if isinstance(key, asyncio.Task):
                    self._aborted.add(cast("asyncio.Task[Any]", key))
                abort()
                aborted += 1
        return aborted

    def _done(self) -> None:
        self._in_flight -= 1
        if self._in_flight == 0:
            self._idle_event().set()

    def _backend_body(
        self, agent_request: dict[str, Any], kind: Kind, record: bool, agent: str | None
    ) -> tuple[dict[str, Any], str | None, int | None]:
        """The body the backend gets, the call's policy, and the model version admitted with the request.

        A recorded call asks for token ids and logprobs; the served model (or the policy's) replaces ``model``.
        The admitted version is what a backend that reports none was serving (the trainer pauses the proxy and
        drains it before it swaps weights, and resumes with the new version).
        """
        forwarded = dict(agent_request)
        if record:
            forwarded["return_token_ids"] = True
            if kind == "chat":
                forwarded["logprobs"] = True
            elif not isinstance(forwarded.get("logprobs"), int) or forwarded["logprobs"] < 1:
                forwarded["logprobs"] = 1
        if self.served_model:
            forwarded["model"] = self.served_model
        policy: str | None = None
        admitted = self._model_version
        if self.policy_router is not None:
            policy, model = self.policy_router.route(agent, agent_request.get("model"))
            if model is not None:
                forwarded["model"] = model
            admitted = self.policy_router.version(policy, admitted)
        return forwarded, policy, admitted

    async def _forward(
        self,
        agent_request: dict[str, Any],
        kind: Kind,
        rollout_id: str | None,
        attempt_id: str | None,
        start: float,
        authorization: str | None,
        agent: str | None = None,
        translation: Translation | None = None,
    ) -> tuple[Response, bool]:
        """Send the call to its backend and answer the agent: (the response, whether it is a stream still open)."""
        record = rollout_id is not None and attempt_id is not None
        forwarded, policy, admitted = self._backend_body(agent_request, kind, record, agent)
        backend = self._pick_backend(rollout_id)
        path = "/v1/chat/completions" if kind == "chat" else "/v1/completions"
        call_id = new_id("call")
        headers = {CALL_ID_HEADER: call_id} if record else {}
        recorded_request = agent_request if translation is None else translation.request
        meta: Meta = (
            call_id, rollout_id or "", attempt_id or "", recorded_request, backend, start, admitted, policy, agent
        )  # fmt: skip
        try:
            resp = await send(
                self._session,
                backend,
                "POST",
                path,
                dumps(forwarded),
                self._backend_headers(authorization),
                self.request_timeout,
                self._count_resend,
            )
        except UNREACHABLE as exc:
            message = f"LLM proxy could not reach backend {backend}: {exc!r}"
            if record:
                await self._record_shielded(meta, None, Extracted(), error=message)
            return error(502, message, "proxy_backend_error", headers=headers), False
        header_version = model_version_of(resp.header(MODEL_VERSION_HEADER))
        if header_version is not None:
            meta = (*meta[:6], header_version, policy, agent)
            headers[MODEL_VERSION_HEADER] = str(header_version)
        view = AgentView.of(agent_request, kind) if record else _AS_IS
        kept = meta if record else None
        if agent_request.get("stream") and resp.status < 400:
            return self._relay_stream(resp, kind, kept, backend, view, headers, rollout_id, translation), True
        return await self._whole_answer(resp, kind, kept, backend, view, headers, translation), False

    def _relay_stream(
        self,
        resp: BackendReply,
        kind: Kind,
        meta: Meta | None,
        backend: str,
        view: AgentView,
        headers: dict[str, str],
        rollout_id: str | None,
        translation: Translation | None = None,
    ) -> Response:
        """Relay a streamed answer chunk by chunk; it is recorded once the stream is over (``meta``: recorded)."""
        state = StreamState(StreamAssembler(kind), meta, backend, view=view)
        media = resp.header("content-type") or "text/event-stream"
        if translation is None:
            body = relay(resp, state, self._record)
        else:
            body, media = relay_translated(resp, state, self._record, translation), "text/event-stream"
        streaming = TrackedStream(body, resp.status, headers=headers, media_type=media)
        streaming.on_close = lambda: self._stream_closed(resp, state, rollout_id, translation)
        if rollout_id is not None:
            self._calls.setdefault(rollout_id, {})[resp] = resp.abort
        return streaming

    async def _whole_answer(
        self,
        resp: BackendReply,
        kind: Kind,
        meta: Meta | None,
        backend: str,
        view: AgentView,
        headers: dict[str, str],
        translation: Translation | None = None,
    ) -> Response:
        """Read a whole answer, record it (``meta``: recorded) and pass it on without the proxy's token-id options
        (with a ``translation``: the agent's API's answer, recorded as such)."""
        data = resp.parsed if resp.status < 400 else None
        try:  # an in-process backend's parsed answer need not be encoded when the agent gets a stripped copy
            raw = b"" if isinstance(data, dict) and meta is not None and view != _AS_IS else await resp.read()
        except UNREACHABLE as exc:
            resp.release()
            message = f"LLM proxy lost backend {backend} while reading the response: {exc!r}"
            if meta is not None:
                await self._record_shielded(meta, None, Extracted(), error=message)
            return error(502, message, "proxy_backend_error", headers=headers)
        resp.release()
        if resp.status >= 400:
            retry_after = resp.header("retry-after")
            if retry_after is not None:
                headers["Retry-After"] = retry_after
            if meta is not None:
                text = raw.decode("utf-8", errors="replace")[:4000]
                await self._record_shielded(meta, None, Extracted(), error=f"backend HTTP {resp.status}: {text}")
            return RawResponse(raw, resp.status, raw_headers(raw, resp.status, resp.content_type, headers))
        if meta is not None or translation is not None:
            if data is None:
                try:
                    data = loads(raw)
                except ValueError:
                    data = None
            if translation is not None and not isinstance(data, dict):
                message = "backend answered 200 with a body that is not JSON"
                if meta is not None:
                    await self._record_shielded(meta, None, Extracted(), error=message)
                return error(502, message, "proxy_backend_error", headers=headers)
            if isinstance(data, dict):
                data = cast(dict[str, Any], data)
                answer = data if translation is None else translation.answer(data)
                failure = await self._record_shielded(meta, answer, extract(data, kind)) if meta is not None else None
                stripped = view.strip(data) if translation is None else answer
                if stripped is not None:  # the agent gets what it asked for, not the proxy's token-id options
                    raw = dumps(stripped)
                elif not raw:  # not read (released above): the parsed value is the body's meaning
                    raw = dumps(data)
            else:
                assert meta is not None
                failure = await self._record_shielded(
                    meta, None, Extracted(), error="backend answered 200 with a body that is not JSON"
                )
            if failure is not None:  # never 200 for a call whose training data was not stored
                return unrecorded(failure, headers)
        return RawResponse(raw, resp.status, raw_headers(raw, resp.status, resp.content_type, headers))

    def _stream_closed(
        self, resp: BackendReply, state: StreamState, rollout_id: str | None, translation: Translation | None = None
    ) -> None:
        """Runs once the streamed response is over, whether it completed, broke, or was never started."""
        if rollout_id is not None:
            self._untrack(rollout_id, resp)
        resp.release()
        self._done()
        if state.meta is not None and not state.recorded:
            state.recorded = True
            error = state.error or "stream ended before the agent received it"
            if state.assembler.finish_reason is not None and state.error is None:
                error = None  # a complete stream without [DONE]
            answer = state.assembler.response()
            if translation is not None:
                answer = translation.answer(answer)
            self._spawn(self._record(state.meta, answer, state.assembler.extracted(), error=error))
