"""The embedded `LocalBackend` as `TorchEngine`'s `Serving`: one policy (`BackendServing`) or several
(`BackendPoliciesServing`).

The backend generates with its own copy of the weights (it copies the model it is given; a sync copies the trainer's
weights into it), so it keeps serving the current version while the policy updates in place. The proxy reaches it
in-process (an ``inproc://`` URL registered with `agentlightning.proxy.register_backend`, no HTTP) or, with
``backend_http``, over HTTP on 127.0.0.1 (`BackendServer`). With several policies, the LoRA adapters are served
beside the frozen base by one backend, and each full-weight policy by a backend of its own (`FullBackends`) behind
the same in-process endpoint (`PolicyEndpoint`, routed by the request's ``model``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from agentlightning.proxy import register_backend, unregister_backend
from agentlightning_torch.models._checkpoint import merged_model
from agentlightning_torch.serving._backend import LocalBackend, merged_state_dict
from agentlightning_torch.serving._endpoint import OpenAIEndpoint
from agentlightning_torch.serving._policy_endpoint import FullBackends, FullWeights, PolicyEndpoint
from agentlightning_torch.serving._server import BackendServer

__all__ = ["BackendPoliciesServing", "BackendServing", "BackendSettings", "ServedPolicies", "served_state_dict"]


class _ServedLoRAs(Protocol):
    @property
    def names(self) -> Sequence[str]: ...

    @property
    def updated(self) -> Sequence[str]: ...


class ServedPolicies(Protocol):
    """What `BackendPoliciesServing` needs of the trained policies (``agentlightning_torch.TrainedPolicies``)."""

    @property
    def base(self) -> torch.nn.Module:
        """The frozen base (the peft model holding every adapter, when there are adapters)."""
        ...

    @property
    def lora(self) -> _ServedLoRAs | None:
        """The LoRA policies (their names, and those the last update changed); ``None``: none."""
        ...

    @property
    def full(self) -> FullWeights | None:
        """The full-weight policies; ``None``: none."""
        ...

    @property
    def updated(self) -> Sequence[str]:
        """The policies the last update changed."""
        ...


def served_state_dict(policy: torch.nn.Module, adapter: bool) -> dict[str, torch.Tensor]:
    """What a backend loads at a sync: the PEFT model's own state dict (``adapter``), or the merged plain model's."""
    if adapter:
        return {k: v.detach() for k, v in policy.state_dict().items()}
    return merged_state_dict(policy)


@dataclass(frozen=True)
class BackendSettings:
    """How the trainer's `LocalBackend` s are built and reached (``agentlightning_torch.training.backend_settings``
    reads them from a `TorchTrainerConfig`).

    Attributes:
        tokenizer: The model's tokenizer.
        generation_config: The model folder's generation defaults.
        model_name: The served model name.
        http: Serve over HTTP on 127.0.0.1 (``backend_http``) instead of in-process.
        options: The backend's other keyword arguments (device, batching, threads, seed, tool parser).
    """

    tokenizer: Any
    generation_config: Any
    model_name: str
    http: bool
    options: dict[str, Any]

    def build(self, model: Any, model_name: str) -> LocalBackend:
        """A `LocalBackend` serving a copy of ``model`` as ``model_name``."""
        return LocalBackend(
            model, self.tokenizer, model_name=model_name, generation_config=self.generation_config, **self.options
        )


# backend batches, requests, busy seconds, decode steps, rows, generation CPU and tokens
_Counts = tuple[int, int, float, int, int, float, int]


class _BackendServingBase:
    """What both local ways of serving share: reach the base backend, wait for it, count its work, stop it."""

    def __init__(self, settings: BackendSettings) -> None:
        self.settings = settings
        self.backend: LocalBackend | None = None
        """The backend serving the policy (with policies: the frozen base and the adapters); after `start`."""
        self.http_server: BackendServer | None = None
        self.url: str | None = None
        self._seen: _Counts = (0, 0, 0.0, 0, 0, 0.0, 0)

    def _backends(self) -> list[LocalBackend]:
        return [] if self.backend is None else [self.backend]

    def _serve(self, backend: LocalBackend, endpoint: Callable[[], OpenAIEndpoint | PolicyEndpoint]) -> str:
        """Start ``backend`` and make it reachable: over HTTP, or in-process through ``endpoint()``."""
        self.backend = backend
        if self.settings.http:
            self.http_server = BackendServer(backend).start()
            self.url = self.http_server.url
        else:
            backend.start()
            self.url = register_backend(endpoint())
        return self.url

    def _started(self) -> LocalBackend:
        if self.backend is None:
            raise RuntimeError("the backend is not started; call `await loop.start(store)` first")
        return self.backend

    async def wait_idle(self, timeout_s: float) -> int:
        """Wait (at most ``timeout_s``) until every backend's batch is empty (requests finish, or leave when their
        client cancels them); returns the sequences still generating."""
        deadline = time.monotonic() + timeout_s
        while any(b.running for b in self._backends()) and time.monotonic() < deadline:
            await asyncio.sleep(0.005)  # the decode thread drops aborted rows before its next step
        return sum(b.running for b in self._backends())

    async def abort(self, timeout_s: float) -> int:
        """Stop every request the backends hold (`LocalBackend.abort`) and wait (at most ``timeout_s``) for them to
        leave; returns the sequences left."""
        for backend in self._backends():
            backend.abort()
        return await self.wait_idle(timeout_s)

    def release(self) -> None:
        """Nothing to release: the backends generate with their own copy of the weights."""

    def metrics(self) -> dict[str, float]:
        """Admission groups and their mean size, decode steps and their mean rows, generation time (wall and the
        generation thread's CPU) and tokens since the previous call, over every backend."""
        if self.backend is None:
            return {}
        every = [b.stats for b in self._backends()]
        now: _Counts = (
            sum(s.batches for s in every),
            sum(s.requests for s in every),
            sum(s.busy_seconds for s in every),
            sum(s.steps for s in every),
            sum(s.row_steps for s in every),
            sum(s.cpu_seconds for s in every),
            sum(s.tokens for s in every),
        )
        batches, requests, busy, steps, row_steps, cpu, tokens = (a - b for a, b in zip(now, self._seen, strict=True))
        self._seen = now
        return {
            "backend_batches": float(batches),
            "backend_mean_batch": requests / max(batches, 1),
            "backend_steps": float(steps),
            "backend_mean_rows": row_steps / max(steps, 1),
            "time_generating": busy,
            "cpu_generating": cpu,
            "tokens_generated": float(tokens),
            # generated tokens per second of the backend's prefill + decode (what generation throughput is)
            "tokens_per_s": tokens / busy if busy > 0 else 0.0,
        }

    async def stop(self) -> None:
        """Unregister the in-process endpoint and stop the backend (and its HTTP server)."""
        if self.url is not None:
            unregister_backend(self.url)  # an HTTP URL was never registered: nothing happens
            self.url = None
        if self.http_server is not None:
            self.http_server.stop()
            self.http_server = None
        elif self.backend is not None:
            self.backend.stop()

    def policy_versions(self) -> dict[str, int]:
        """Empty: `LocalBackend` reports the version behind every answer itself."""
        return {}


class BackendServing(_BackendServingBase):
    """`Serving` of one policy on a `LocalBackend`: a copy of the policy (LoRA merged, or served as an adapter).

    Args:
        settings: How the backend is built and reached.
        policy: The trained model.
        serve_lora: Serve a LoRA policy as the adapter on its base (else a plain model with it merged).
    """

    def __init__(self, settings: BackendSettings, policy: torch.nn.Module, *, serve_lora: bool) -> None:
        super().__init__(settings)
        self.policy = policy
        self.serve_lora = serve_lora

    async def start(self, version: int) -> list[str]:
        """Start the backend on a copy of the policy, reported as ``version``; returns how the proxy reaches it."""
        if self.url is None:
            served: Any = self.policy if self.serve_lora else merged_model(self.policy)
            backend = self.settings.build(served, self.settings.model_name)
            backend.model_version = version
            self._serve(backend, lambda: OpenAIEndpoint(backend))
        assert self.url is not None
        return [self.url]

    async def sync(self, version: int) -> None:
        """Copy the policy's weights (`served_state_dict`) into the backend, which reports ``version`` from now on."""
        backend = self._started()
        await asyncio.to_thread(backend.load_state_dict, served_state_dict(self.policy, self.serve_lora), version)


class BackendPoliciesServing(_BackendServingBase):
    """`Serving` of several policies: every LoRA adapter beside the frozen base in one `LocalBackend`, each
    full-weight policy in a backend of its own, all behind one in-process endpoint (`PolicyEndpoint`).

    Args:
        settings: How the backends are built and reached.
        trained: The run's trained policies.
    """

    def __init__(self, settings: BackendSettings, trained: ServedPolicies) -> None:
        super().__init__(settings)
        self.trained = trained
        self.full_backends: FullBackends | None = None
        """The full-weight policies' backends (after `start`; ``None`` without such policies)."""

    def _backends(self) -> list[LocalBackend]:
        full = [] if self.full_backends is None else list(self.full_backends.backends.values())
        return [*super()._backends(), *full]

    async def start(self, version: int) -> list[str]:
        """Start the base backend with every adapter, and each full-weight policy's backend, all at ``version``."""
        if self.url is None:
            trained = self.trained
            backend = self.settings.build(trained.base, self.settings.model_name)
            backend.model_version = version
            for name in trained.lora.names if trained.lora is not None else []:
                backend.load_lora(name, trained.base, version=version)
            self._serve(backend, lambda: self._endpoint(backend, version))
        assert self.url is not None
        return [self.url]

    def _endpoint(self, backend: LocalBackend, version: int) -> OpenAIEndpoint | PolicyEndpoint:
        """The in-process endpoint: ``backend``'s, or with full-weight policies one routing to each one's backend."""
        if self.trained.full is None:
            return OpenAIEndpoint(backend)
        self.full_backends = FullBackends(self.trained.full, self.settings.build, version)
        return PolicyEndpoint(OpenAIEndpoint(backend), self.full_backends.endpoints())

    async def sync(self, version: int) -> None:
        """Load the policies the last update changed (adapters into the base backend, full weights into their
        own), which report ``version``; the others keep theirs."""
        backend = self._started()
        trained = self.trained
        for name in trained.lora.updated if trained.lora is not None else []:
            await asyncio.to_thread(backend.load_lora, name, trained.base, version=version)
        if self.full_backends is not None:
            await self.full_backends.sync(list(trained.updated), version)

    async def stop(self) -> None:
        """Stop the base backend and every full-weight policy's backend."""
        await super().stop()
        if self.full_backends is not None:
            self.full_backends.stop()
            self.full_backends = None
