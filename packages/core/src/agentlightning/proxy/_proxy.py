"""The LLM proxy: forwards OpenAI-style requests to an inference backend and records exact token ids.

Agents call ``{proxy}/rollout/{rollout_id}/attempt/{attempt_id}/v1`` (see `LLMResource.base_url`), or the stable
URL of the runner slot they run in, ``{proxy}/slot/{key}/v1``, which the runner maps to the slot's current attempt
(``PUT /slot/{key}``, ``PUT /slots``; see `agentlightning.proxy._slots`; what `agentlightning.llm_base_url` returns
under a runner). A call for an attempt that already ended is refused (409 ``attempt_finished``) and counted
(`late_calls`): at once when its runner reported the end, else when the store refuses its record (an end through the
store's API, a timeout, a cancel, an end before this proxy started); the attempt is then remembered as ended.
In ``record="background"`` the store's refusal comes after the answer: the record is dropped (and counted), the
attempt's next calls get 409. For each
``chat/completions`` or ``completions`` request the proxy asks the backend for token ids and logprobs
(``return_token_ids: true``, ``logprobs``), returns the backend's answer to the agent as the backend answers the
agent's own request (the token ids and logprobs the agent did not ask for taken out: `AgentView`), and records an
`LLMCall` in the store *before* the agent sees the end of the response (``record="sync"``, default), so the
record exists by the time the agent's LLM span ends. ``record="background"`` queues records and writes them in
batches instead; call `LLMProxy.flush` before reading them.

A call whose record the store refuses (an attempt it never started, say) is not answered 200: the agent gets
the error (a stream ends with an error event instead of ``[DONE]``). Request bodies over ``max_body_bytes`` get
413 before they reach a backend. An agent that hangs up while the backend works has its backend request
cancelled (the connection closes; the embedded backend then frees the sequence). ``/v1/responses`` (OpenAI's
Responses API) is served through the backend's chat completions, translated both ways (``_responses.py``,
``_responses_answer.py``, ``_translate.py``): recorded, refused and limited as a chat call is.

Anthropic's ``/v1/messages`` is translated to a chat completion and answered and recorded by the same path
(``_messages_routes.py``).

Plain ``/v1/chat/completions`` and ``/v1/completions`` (no rollout in the URL) are rejected with HTTP 400 that
names the per-rollout URL, because calls that are silently not recorded are lost training data; pass
``allow_unrecorded=True`` to forward them unrecorded instead. ``/v1/models`` is always forwarded.

Model versions: each recorded call carries the version of the weights that generated it. A backend reports it on
its answer: a top-level ``model_version`` integer in the response body or in any stream chunk (`MODEL_VERSION_FIELD`;
the embedded torch backend and `agentlightning.testing.ScriptedModelServer` send it), or the
``x-agentlightning-model-version`` header (`MODEL_VERSION_HEADER`). For a backend that reports nothing (vLLM), the
version the proxy was told (``model_version=`` / ``resume(model_version=...)``, set by the trainer after each weight
sync while the proxy is paused) *when it admitted the request* is recorded. The store's resources version is never
used: one model version may be published as several resources.

Who may call it: with a ``token`` the per-rollout and plain routes need ``Authorization: Bearer <token>`` (the
trainer publishes it as `LLMResource.api_key`). A runner slot's URL needs nothing more: the slot's random key in it is
its agent's credential while the slot is registered, so an agent that passes a literal ``api_key`` works (see
`agentlightning.proxy._routes.slot_refusal`). Off loopback a token of at least 16 characters is required. The slot
routes (register, clear) need the ``runner_token`` instead (always: one is drawn when none is given), which the
trainer publishes as `LLMResource.runner_token` and runners keep from their agents (`llm_resource` builds the
resource to publish). The ``/admin/*`` routes (pause, backends...) need the separate ``admin_token`` and
are refused (403) when the proxy has none, wherever it is bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import secrets
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Literal

import aiohttp
from starlette.datastructures import State

from agentlightning._models import LLMCall, LLMResource
from agentlightning._netauth import bearer_matches, check_bind_token, is_wildcard
from agentlightning._policies import PolicyMap
from agentlightning._routing import RouteTable
from agentlightning._server_base import STORE_MAX_BODY_BYTES, Authorizer, Refusal
from agentlightning._urls import rollout_base_url, slot_base_url
from agentlightning.proxy._admin import admin_refusal
from agentlightning.proxy._asgi import ADMIN, RUNNER, SLOT, ProxyASGI
from agentlightning.proxy._assemble import MODEL_VERSION_FIELD, MODEL_VERSION_HEADER
from agentlightning.proxy._forwarding import CALL_ID_HEADER, Forwarder
from agentlightning.proxy._policy_routing import PolicyRouter
from agentlightning.proxy._routes import proxy_routes, runner_refusal, served_apis, slot_refusal
from agentlightning.proxy._slots import SlotTable
from agentlightning.proxy._transport import IN_PROCESS_SCHEME
from agentlightning.store import LightningStore

__all__ = ["CALL_ID_HEADER", "MODEL_VERSION_FIELD", "MODEL_VERSION_HEADER", "LLMProxy", "create_proxy_app"]

logger = logging.getLogger(__name__)


def _normalize_backend(url: str) -> str:
    url = url.strip().rstrip("/")
    if not url.startswith(("http://", "https://", IN_PROCESS_SCHEME)):
        raise ValueError(
            f"backend URL must start with http:// or https:// (or {IN_PROCESS_SCHEME} for a backend registered in "
            f"this process with agentlightning.proxy.register_backend), got {url!r}"
        )
    return url[: -len("/v1")] if url.endswith("/v1") else url


class LLMProxy(Forwarder):
    """Records every LLM call of every rollout with its exact token ids.

    Args:
        store: Where `LLMCall` records go.
        backends: OpenAI-compatible backend base URLs (with or without ``/v1``), or ``inproc://`` URLs of backends
            served in this process (`register_backend`: called without HTTP). A rollout sticks to the backend it
            was first sent to, so the backend's prefix cache is reused across its turns.
        token: If set, the agent routes require ``Authorization: Bearer <token>`` (the agents' ``api_key``), except
            under a registered runner slot's URL, whose random key admits the call; required, with at least 16
            characters, when ``host`` is not a loopback address.
        admin_token: The ``/admin/*`` routes require ``Authorization: Bearer <admin_token>``; without one they
            are refused (403). Use a different value than ``token``: agents know ``token``.
        runner_token: The slot routes (``PUT`` / ``DELETE /slot/{key}``, ``PUT /slots``) require
            ``Authorization: Bearer <runner_token>``; publish it to runners as `LLMResource.runner_token` (see
            `llm_resource`). Default: a random one (`runner_token` reads it). Must differ from ``token``.
        model_version: Version recorded on calls whose backend does not report one (see the module docs); the
            trainer updates it with ``resume(model_version=...)`` after each weight sync. ``None``: unknown.
        served_model: If set, replaces the ``model`` of every forwarded request (the name the backend serves).
        policies: Route each call to the policy of the agent that makes it (`agentlightning.PolicyMap`; the
            agent is named by the `agentlightning.AGENT_HEADER` our openai instrumentation sends): the backend is
            asked for the policy's adapter (its name as the model), or for ``served_model`` (the base) for
            `agentlightning.FROZEN`; the call's `LLMCall` records its policy and agent. Calls no entry matches go to
            the default policy and are counted (``/admin/status``: ``unmapped_calls``, ``unmapped_agents``).
        record: ``"sync"`` writes each record before answering; ``"background"`` batches writes (see `flush`).
        allow_unrecorded: Forward plain ``/v1/...`` completions unrecorded instead of rejecting them.
        backend_api_key: Sent to backends as a bearer token; by default the agent's ``Authorization`` is forwarded.
        request_timeout: Seconds a backend may take to answer one request.
        max_body_bytes: Larger requests get 413 (default: half the store's request limit, so that the record of
            any accepted call, request and response together, fits in the store).
        retry_after: Seconds advertised in ``Retry-After`` while paused.
        host: Interface to bind in `start` / `start_in_thread` (``0.0.0.0`` for every interface).
        port: Port to bind (0 = a free one).
        advertise_url: The address agents use to reach the proxy (``http://trainer.example:4748``), published
            as `url`; needed when ``host`` is a wildcard or the proxy sits behind NAT or a load balancer.
            Default: ``http://{host}:{port}``.
    """

    def __init__(
        self,
        store: LightningStore,
        backends: Sequence[str],
        *,
        token: str | None = None,
        admin_token: str | None = None,
        runner_token: str | None = None,
        model_version: int | None = None,
        served_model: str | None = None,
        policies: PolicyMap | None = None,
        record: Literal["sync", "background"] = "sync",
        allow_unrecorded: bool = False,
        backend_api_key: str | None = None,
        request_timeout: float = 600.0,
        max_body_bytes: int = STORE_MAX_BODY_BYTES // 2,
        retry_after: int = 1,
        host: str = "127.0.0.1",
        port: int = 0,
        advertise_url: str | None = None,
    ) -> None:
        if record not in ("sync", "background"):
            raise ValueError(f"record must be 'sync' or 'background', got {record!r}")
        if advertise_url is not None and not advertise_url.startswith(("http://", "https://")):
            raise ValueError(f"advertise_url must start with http:// or https://, got {advertise_url!r}")
        self.token = token or None
        if runner_token and runner_token == self.token:
            raise ValueError("runner_token must differ from token: every agent holds token (its api_key)")
        self.runner_token = runner_token or secrets.token_urlsafe(32)
        self.advertise_url = advertise_url.rstrip("/") if advertise_url else None
        self.store = store
        self._backends: list[str] = []
        self.set_backends(backends)
        self.admin_token = admin_token or None
        self._model_version = model_version
        self.served_model = served_model
        self.policy_router = PolicyRouter(policies, served_model) if policies is not None else None
        self.record = record
        self.allow_unrecorded = allow_unrecorded
        self.backend_api_key = backend_api_key
        self.request_timeout = request_timeout
        if max_body_bytes <= 0:
            raise ValueError(f"max_body_bytes must be positive, got {max_body_bytes}")
        self.max_body_bytes = max_body_bytes
        self.retry_after = retry_after
        self.host = host
        self.port = port
        self._sticky: OrderedDict[str, str] = OrderedDict()
        self._round_robin = itertools.count()
        self._session: aiohttp.ClientSession | None = None
        self._paused = False
        self._hold_s = 0.0
        self._held = 0
        self._resumed: asyncio.Event | None = None
        self._in_flight = 0
        self._idle: asyncio.Event | None = None
        self._calls: dict[str, dict[object, Any]] = {}
        self._aborted: set[asyncio.Task[Any]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending: list[LLMCall] = []
        self._flush_wakeup: asyncio.Event | None = None
        self._flusher: asyncio.Task[None] | None = None
        self._writes: set[asyncio.Task[Any]] = set()
        self._missing_ids_count: dict[str, int] = {}
        self.resent = 0
        self._server: Any = None  # agentlightning.proxy._serve.ServerHandle while started
        self.slots = SlotTable()
        self._late_calls = 0
        self.app = self._build_app()

    # ------------------------------------------------------------------ public controls
    @property
    def backends(self) -> list[str]:
        """Current backend base URLs."""
        return list(self._backends)

    def set_backends(self, backends: Sequence[str]) -> None:
        """Replace the backends; rollouts on a removed backend move to a remaining one on their next call."""
        normalized = [_normalize_backend(b) for b in backends]
        if not normalized:
            raise ValueError("the LLM proxy needs at least one backend URL")
        self._backends = normalized

    @property
    def model_version(self) -> int | None:
        """The version recorded on calls admitted from now on whose backend reports none."""
        return self._model_version

    @model_version.setter
    def model_version(self, version: int | None) -> None:
        self._model_version = version

    @property
    def held(self) -> int:
        """Requests waiting for `resume` (a pause with ``hold_s``)."""
        return self._held

    @property
    def paused(self) -> bool:
        """Whether new requests are refused (503)."""
        return self._paused

    @property
    def in_flight(self) -> int:
        """Requests forwarded and not yet answered by their backend (streams: until the stream ends)."""
        return self._in_flight

    @property
    def late_calls(self) -> int:
        """Calls refused because their attempt had already ended (409 ``attempt_finished``) since the start."""
        return self._late_calls

    @property
    def url(self) -> str:
        """The address agents use (the `LLMResource.endpoint` to publish): ``advertise_url`` or ``http://host:port``."""
        if self._server is None:
            raise RuntimeError("LLMProxy is not started; call start() or start_in_thread()")
        if self.advertise_url is not None:
            return self.advertise_url
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self._server.port}"

    @property
    def bound_port(self) -> int:
        """The port the proxy listens on (useful with ``port=0``)."""
        if self._server is None:
            raise RuntimeError("LLMProxy is not started; call start() or start_in_thread()")
        return int(self._server.port)

    def _check_bind(self) -> None:
        check_bind_token(self.host, self.token, "the LLM proxy", "token=... (agl proxy serve --token)")
        check_bind_token(self.host, self.runner_token, "the LLM proxy's slot routes", "a longer runner token")
        if self.admin_token is not None:
            check_bind_token(self.host, self.admin_token, "the LLM proxy's admin routes", "a longer admin token")
        if is_wildcard(self.host) and self.advertise_url is None:
            raise ValueError(
                f"the LLM proxy binds {self.host!r} (every interface): pass advertise_url (e.g. "
                "http://<this machine's address>:<port>) so agents are told an address they can reach"
            )

    def authorized(self, authorization: str | None) -> bool:
        """Whether a request with this ``Authorization`` header may use the non-admin routes."""
        return self.token is None or bearer_matches(authorization, self.token)

    def base_url(self, rollout_id: str, attempt_id: str) -> str:
        """The OpenAI base URL an agent uses for one attempt."""
        return rollout_base_url(self.url, rollout_id, attempt_id)

    def slot_url(self, key: str) -> str:
        """The OpenAI base URL of the runner slot ``key`` (calls go to the attempt registered on it)."""
        return slot_base_url(self.url, key)

    def llm_resource(self, model: str, sampling_parameters: dict[str, Any] | None = None) -> LLMResource:
        """The `LLMResource` to publish for this proxy: its `url`, the agents' ``token`` and the ``runner_token``.

        Runners use ``runner_token`` to register their slots and to report attempts' ends (agents get the resource
        without it); a resource published without it still works, with per-rollout URLs and no late-call refusal.
        """
        return LLMResource(
            endpoint=self.url,
            model=model,
            sampling_parameters=sampling_parameters or {},
            api_key=self.token,
            runner_token=self.runner_token,
        )

    async def pause(self, timeout: float | None = None, *, hold_s: float = 0.0) -> None:
        """Stop admitting new requests and wait until in-flight ones are answered.

        A new request is refused (503 + ``Retry-After``), or with ``hold_s`` > 0 held until `resume` (a short pause,
        e.g. a weight sync while agents keep working) and refused only if the proxy is still paused after
        ``hold_s`` seconds.

        Raises:
            TimeoutError: If requests are still in flight after ``timeout`` seconds (the proxy stays paused).
        """
        loop = self._loop
        if loop is not None and loop is not asyncio.get_running_loop():  # started in another thread
            future = asyncio.run_coroutine_threadsafe(self.pause(timeout, hold_s=hold_s), loop)
            await asyncio.wrap_future(future)
            return
        self._paused = True
        self._hold_s = hold_s
        self._resumed_event().clear()
        idle = self._idle_event()
        if self._in_flight == 0:
            idle.set()
        try:
            async with asyncio.timeout(timeout):  # not wait_for: 3.11's may swallow a cancellation
                await idle.wait()
        except TimeoutError:
            raise TimeoutError(f"{self._in_flight} request(s) still in flight after {timeout} s") from None
        logger.info("LLM proxy paused (no request in flight)")

    def resume(self, model_version: int | None = None, policy_versions: dict[str, int] | None = None) -> None:
        """Admit requests again, optionally recording a new ``model_version`` from now on.

        Args:
            model_version: The version recorded on calls whose backend reports none.
            policy_versions: Per policy, the version recorded on its calls instead (with ``policies``; a policy's
                adapter is updated on its own, so each has its own version).
        """
        if model_version is not None:
            self.model_version = model_version
        if policy_versions:
            if self.policy_router is None:
                raise ValueError("policy_versions needs a proxy started with policies=PolicyMap(...)")
            self.policy_router.versions.update(policy_versions)
        self._paused = False
        self._resumed_event().set()
        logger.info("LLM proxy resumed (model_version=%s)", self._model_version)

    # ------------------------------------------------------------------ serving
    async def start(self) -> LLMProxy:
        """Serve on ``host:port`` inside the running event loop; returns self once listening."""
        from agentlightning.proxy._serve import ServerHandle

        if self._server is None:
            self._check_bind()
            self._server = await ServerHandle.start_in_loop(self.app, self.host, self.port)
        return self

    def start_in_thread(self) -> LLMProxy:
        """Serve from a background thread with its own event loop (the store must be thread-safe)."""
        from agentlightning.proxy._serve import ServerHandle

        if self._server is None:
            self._check_bind()
            self._server = ServerHandle.start_in_thread(self.app, self.host, self.port)
        return self

    async def stop(self) -> None:
        """Flush records and stop serving."""
        if self._server is not None:
            server, self._server = self._server, None
            await server.stop()

    async def __aenter__(self) -> LLMProxy:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # ------------------------------------------------------------------ app
    def _build_app(self) -> ProxyASGI:
        table = RouteTable(proxy_routes(self), decode=True)  # matched on the raw path: ids may hold an encoded "/"
        authorizers: dict[str, Authorizer] = {
            "bearer": lambda authorization, _: self._authorize(authorization),
            SLOT: lambda authorization, params: slot_refusal(self, authorization, params.get("slot")),
            ADMIN: lambda authorization, _: admin_refusal(self, authorization),
            RUNNER: lambda authorization, _: runner_refusal(self, authorization),
        }
        state = State({"llm_proxy": self})
        return ProxyASGI(table, authorizers, self.max_body_bytes, self._open, self._close, state, served_apis())

    async def _open(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._idle = asyncio.Event()
        self._flush_wakeup = asyncio.Event()
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
        timeout = aiohttp.ClientTimeout(total=self.request_timeout, sock_connect=10)
        self._session = aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=True)
        if self.record == "background":
            self._flusher = asyncio.create_task(self._flush_loop())

    async def _close(self) -> None:
        while self._pending or self._writes:  # records of calls that ended while closing too
            await self.flush()
        if self._flusher is not None:
            self._flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flusher
            self._flusher = None
        if self._session is not None:
            await self._session.close()
            self._session = None
        self._loop = None

    def _authorize(self, authorization: str | None) -> Refusal | None:
        """The refusal for a request that lacks the agents' token, or ``None``."""
        if self.authorized(authorization):
            return None
        return Refusal(
            401,
            "this LLM proxy needs 'Authorization: Bearer <token>' (the agent's api_key; the trainer publishes it "
            "as the LLM resource's api_key)",
            "unauthorized",
            {"WWW-Authenticate": "Bearer"},
        )


def create_proxy_app(store: LightningStore, backends: Sequence[str], **options: Any) -> ProxyASGI:
    """Build the proxy's ASGI app (serve it with uvicorn); ``options`` are those of `LLMProxy`.

    The `LLMProxy` behind it (for ``pause()``, ``resume()``, ``set_backends()``) is ``app.state.llm_proxy``.
    """
    return LLMProxy(store, backends, **options).app
