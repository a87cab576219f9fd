"""Core's serving contract (`agentlightning.loop.Serving`), run against every implementation this machine can run.

Each implementation gets a real server (the embedded `LocalBackend` behind its HTTP server on 127.0.0.1, a tiny
random model) and a real request that generates for a while (``ignore_eos``, many tokens), then:

* `Serving.wait_idle` waits: it returns 0 only once that request has finished, and the request got its whole answer
  (nothing was stopped);
* `Serving.abort` aborts: the request ends early (an error, or fewer tokens than asked), `abort` returns 0, and the
  servers answer the next request as before (aborting does not pause them).

Implementations: trainer-torch's `BackendServing` and `BackendPoliciesServing`; trainer-verl's
`ExportedWeightsServing` (its weight source, verl's actor worker group, is stood in for by the model's own state dict:
the serving steps under test never reach verl) and `NoServing` (nothing to serve: both verbs answer 0 at once).
The vLLM ones (trainer-torch's `VLLMWeightsServing` and `VLLMLoRAServing`, verl's `VLLMReplicaServing`) need a vLLM
server: trainer-torch's two wait and abort through `VLLMClient` (``wait_idle``: vLLM's running count reaches 0;
``abort``: ``POST /abort_requests``), run here against the session's real vLLM server; verl's through verl's own
``abort_replicas`` (``test_verl_vllm_loop.py`` runs its engine, with vLLM's CPU build).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import torch

from agentlightning.loop import Serving
from agentlightning_torch import BackendPoliciesServing, BackendServing, LocalBackend, PPOConfig, TrainedPolicies
from agentlightning_torch.models import load_model
from agentlightning_torch.serving import BackendSettings
from agentlightning_torch.testing import make_tiny_chat_model
from agentlightning_verl import ExportedWeightsServing, NoServing

LONG = 300
ABORT_LONG = 1000  # of the session vLLM's 1,024-token context: the longest a held request can be
ABORT_ATTEMPTS = 20
"""Tokens the in-flight request asks for: many decode steps, so it is surely still generating when a verb is called."""


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_chat_model(tmp_path_factory.mktemp("contract") / "model", max_positions=1024)


@dataclass
class Subject:
    """One implementation under test, started: the serving, how to read how many requests its servers hold, and
    where a request goes (its URL and model name)."""

    serving: Serving
    running: Callable[[], int]
    url: str = ""
    model: str = "tiny"


class _ServedBackend:
    """verl's `LocalServer` over a `LocalBackend` behind its HTTP server (what ``verl_ray_loop.py`` serves with)."""

    def __init__(self, backend: LocalBackend) -> None:
        from agentlightning_torch import serve_backend

        self.backend = backend
        self.server = serve_backend(backend)

    @property
    def base_url(self) -> str:
        return self.server.base_url

    @property
    def running(self) -> int:
        return self.backend.running

    def abort(self) -> None:
        self.backend.abort()

    def load_state_dict(self, state_dict: Mapping[str, torch.Tensor], version: int | None = None) -> int:
        return self.backend.load_state_dict(state_dict, version)


class _OneRankActor:
    """Stands in for verl's actor worker group: rank 0 exports the model's weights (``ActorWorker.export_weights``)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def export_weights(self) -> list[dict[str, torch.Tensor] | None]:
        return [{k: v.detach().clone() for k, v in self.model.state_dict().items()}]


def _settings(tokenizer: Any) -> BackendSettings:
    return BackendSettings(tokenizer, None, "tiny", http=True, options={"seed": 0})


@contextlib.asynccontextmanager
async def _subject(kind: str, model_dir: Path) -> AsyncGenerator[Subject]:
    loaded = load_model(model_dir)
    model, tokenizer = loaded.model, loaded.tokenizer
    stop: Callable[[], None] = lambda: None  # noqa: E731
    if kind == "torch:BackendServing":
        serving = BackendServing(_settings(tokenizer), model, serve_lora=False)
        subject = Subject(serving, lambda: sum(b.running for b in serving._backends()))  # pyright: ignore[reportPrivateUsage]
    elif kind == "torch:BackendPoliciesServing":
        trained = TrainedPolicies(model, ["writer"], PPOConfig(), {})
        policies = BackendPoliciesServing(_settings(tokenizer), trained)
        subject = Subject(policies, lambda: sum(b.running for b in policies._backends()))  # pyright: ignore[reportPrivateUsage]
    else:
        server = _ServedBackend(LocalBackend(model, tokenizer, model_name="tiny"))
        stop = server.server.stop
        subject = Subject(ExportedWeightsServing(_OneRankActor(model), server), lambda: server.running)
    try:
        (subject.url,) = await subject.serving.start(0)
        subject.model = "writer" if kind.endswith("PoliciesServing") else "tiny"
        yield subject
    finally:
        await subject.serving.stop()
        stop()


async def _complete(url: str, model: str, max_tokens: int) -> dict[str, Any]:
    """One completion over HTTP; the parsed answer, or ``{"error": status}`` when the server failed it."""
    body = {"model": model, "prompt": [5, 6, 7, 8], "max_tokens": max_tokens, "ignore_eos": True, "temperature": 1.0}
    async with aiohttp.ClientSession() as session, session.post(_v1(url) + "/completions", json=body) as answer:
        if answer.status != 200:
            return {"error": answer.status}
        return await answer.json()


def _v1(url: str) -> str:
    return url.rstrip("/").removesuffix("/v1") + "/v1"


def _tokens(answer: dict[str, Any]) -> int:
    return int(answer.get("usage", {}).get("completion_tokens", 0))


async def _in_flight(subject: Subject) -> asyncio.Task[dict[str, Any]]:
    """Send a long request and return once the servers hold it (the condition, not a clock)."""
    request = asyncio.create_task(_complete(subject.url, subject.model, LONG))
    while subject.running() == 0:
        assert not request.done(), f"the request ended before it was seen generating: {request.result()}"
        await asyncio.sleep(0.002)
    return request


KINDS = ["torch:BackendServing", "torch:BackendPoliciesServing", "verl:ExportedWeightsServing"]


@pytest.mark.parametrize("kind", KINDS)
async def test_wait_idle_waits_for_the_request_in_flight_and_stops_nothing(kind: str, model_dir: Path) -> None:
    async with _subject(kind, model_dir) as subject:
        assert isinstance(subject.serving, Serving)
        request = await _in_flight(subject)
        assert await subject.serving.wait_idle(120.0) == 0
        assert subject.running() == 0
        answer = await request
        assert _tokens(answer) == LONG, f"wait_idle stopped the request: {answer}"


@pytest.mark.parametrize("kind", KINDS)
async def test_abort_stops_the_request_in_flight_and_serving_goes_on(kind: str, model_dir: Path) -> None:
    async with _subject(kind, model_dir) as subject:
        request = await _in_flight(subject)
        assert await subject.serving.abort(120.0) == 0
        assert subject.running() == 0
        answer = await request
        assert "error" in answer or _tokens(answer) < LONG, f"abort let the request finish: {answer}"
        after = await _complete(subject.url, subject.model, 3)  # abort is not a pause: the next request is served
        assert _tokens(after) == 3, after


async def test_a_serving_with_no_server_has_nothing_to_wait_for_or_abort() -> None:
    serving = NoServing()
    assert isinstance(serving, Serving)
    assert await serving.start(0) == []
    assert await serving.wait_idle(0.0) == 0
    assert await serving.abort(0.0) == 0


def test_every_serving_implementation_of_both_trainer_packages_is_run_here_or_named() -> None:
    """A new `Serving` implementation must join this test (or say here why it cannot run on this machine)."""
    import agentlightning_torch
    import agentlightning_verl

    exported = {
        f"{package.__name__.split('_')[1]}:{name}"
        for package in (agentlightning_torch, agentlightning_verl)
        for name in package.__all__
        if name.endswith("Serving")
    }
    elsewhere = {"torch:VLLMWeightsServing", "torch:VLLMLoRAServing", "verl:VLLMReplicaServing", "verl:NoServing"}
    assert exported == set(KINDS) | elsewhere


async def _streamed(url: str, model: str, max_tokens: int, started: asyncio.Event) -> dict[str, Any]:
    """One streamed completion; sets ``started`` at its first generated chunk (the server is generating it: the
    condition itself, not a running count sampled from ``/metrics``, which a fast request can slip between).
    Returns ``{"tokens": n, "finish_reason": ...}``, or ``{"error": status}``."""
    body = {
        "model": model, "prompt": [5, 6, 7, 8], "max_tokens": max_tokens, "ignore_eos": True, "temperature": 1.0,
        "stream": True, "stream_options": {"include_usage": True},
    }  # fmt: skip
    tokens, finish = 0, None
    async with aiohttp.ClientSession() as session, session.post(_v1(url) + "/completions", json=body) as answer:
        if answer.status != 200:
            return {"error": answer.status}
        async for line in answer.content:
            data = line.decode().strip().removeprefix("data:").strip()
            if not data or data == "[DONE]":
                continue
            chunk = json.loads(data)
            if "error" in chunk:
                return {"error": chunk["error"]}
            for choice in chunk.get("choices") or []:
                started.set()
                finish = choice.get("finish_reason") or finish
            tokens = int((chunk.get("usage") or {}).get("completion_tokens", tokens))
    return {"tokens": tokens, "finish_reason": finish}


async def test_vllm_wait_idle_waits_and_abort_aborts(lora_vllm_server: Any) -> None:
    """What trainer-torch's vLLM servings' `wait_idle` and `abort` are, against a real vLLM.

    Each request is known to have started (its first streamed chunk arrived); before the abort it is held by vLLM's
    ``/pause?mode=keep`` (frozen in vLLM, it cannot finish while the abort is sent)."""
    from agentlightning_torch.vllm import VLLMClient

    client = VLLMClient(lora_vllm_server.url, "tiny")
    url = lora_vllm_server.url

    async def in_flight(tokens: int = LONG) -> asyncio.Task[dict[str, Any]]:
        started = asyncio.Event()
        request = asyncio.create_task(_streamed(url, "tiny", tokens, started))
        waiting = asyncio.create_task(started.wait())
        await asyncio.wait([request, waiting], return_when=asyncio.FIRST_COMPLETED)
        waiting.cancel()
        assert started.is_set(), f"the request ended before it generated: {request.result()}"
        return request

    request = await in_flight()
    assert await client.wait_idle(120.0) == 0
    assert (await request)["tokens"] == LONG  # waited for, not stopped

    # abort: a request held in vLLM mid-generation is cut. Held by `/pause?mode=keep` right after its first chunk;
    # a tiny model may have generated all of it by then on a busy machine (the pause then holds nothing): such an
    # attempt says nothing about abort, so another is made. An abort that cuts nothing never passes (after the resume,
    # the held request would run to its last token).
    answer: dict[str, Any] = {}
    for _ in range(ABORT_ATTEMPTS):
        request = await in_flight(ABORT_LONG)
        await client.pause("keep")
        try:
            await client.abort()
        finally:
            await client.resume()
        assert await client.wait_idle(60.0) == 0
        answer = await request
        if "error" in answer or answer["tokens"] < ABORT_LONG:
            break
    else:
        pytest.fail(f"in {ABORT_ATTEMPTS} attempts, no request held mid-generation was cut by the abort: {answer}")
    assert _tokens(await _complete(url, "tiny", 3)) == 3  # served as before
