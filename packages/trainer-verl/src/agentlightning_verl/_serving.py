"""How trained weights reach the inference servers: one `Serving` protocol, one implementation per way of serving.

`VerlEngine` delegates its server steps to its backend's `Serving` (``VerlBackend.serving``) whatever serves the
rollouts: ``start_servers`` → `Serving.start`, ``drain_servers`` → `Serving.drain`, ``sync_weights`` →
`Serving.sync`, ``iteration_metrics`` → `Serving.metrics`, ``stop_servers`` → `Serving.stop`, and `Serving.release`
at the start of ``update`` (the proxy is paused, nothing is generating). trainer-torch has a `Serving` protocol of its
own with the same steps (``agentlightning_torch.Serving``); a test (``tests/test_serving_contract.py``) keeps the two
alike.

* `VLLMReplicaServing`: verl's colocated vLLM replicas. ``release`` is verl's
  ``CheckpointEngineManager.sleep_replicas`` (vLLM frees its weights and KV cache so FSDP can use the GPU); ``sync``
  is verl's ``CheckpointEngineManager.update_weights`` (with the default ``naive`` backend: each actor rank streams
  ``engine.get_per_tensor_param()`` into its colocated vLLM worker, then vLLM wakes up) — exactly what
  ``RayPPOTrainer.fit`` does around its update.
* `ExportedWeightsServing`: any server that can load a state dict (the embedded torch backend,
  ``agentlightning_torch``'s ``LocalBackend``, standing in for vLLM on a machine without GPUs): ``sync`` gathers the
  actor's full weights from verl's FSDP engine (the same generator verl feeds vLLM) and loads them, tagged with the
  version.
* `NoServing`: nothing serves (`LocalVerlBackend`: updates only); ``sync`` records the version.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import logging
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

__all__ = [
    "ExportedWeightsServing",
    "LocalServer",
    "NoServing",
    "Serving",
    "VLLMReplicaServing",
    "named_tensors_checksum",
]

logger = logging.getLogger(__name__)


def named_tensors_checksum(tensors: Iterable[tuple[str, torch.Tensor]]) -> str:
    """SHA-256 over names, dtypes, shapes and raw bytes of named tensors, in name order.

    Two models serve the same weights exactly when their checksums are equal (same names, same dtype, same bits).
    """
    import torch

    digest = hashlib.sha256()
    for name, tensor in sorted(tensors, key=lambda item: item[0]):
        value = tensor.detach().to("cpu").contiguous()
        digest.update(f"{name}|{value.dtype}|{tuple(value.shape)}|".encode())
        digest.update(value.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


async def _maybe_await(value: Any) -> Any:
    """verl's managers answer a coroutine or a result depending on the caller (``auto_await``): either, awaited."""
    return await value if inspect.isawaitable(value) else value


@runtime_checkable
class Serving(Protocol):
    """The inference servers behind the LLM proxy, and how the actor's weights get into them."""

    async def start(self, version: int) -> list[str]:
        """Serve the actor's current weights as ``version``; returns the servers' OpenAI-compatible base URLs (the
        LLM proxy's backends; none where nothing serves)."""
        ...

    async def drain(self, timeout_s: float) -> int:
        """Stop whatever the servers still generate (calls of cancelled rollouts), waiting at most ``timeout_s``;
        returns the requests left."""
        ...

    async def sync(self, version: int) -> None:
        """Serve the actor's current weights from now on, as model ``version`` (timings go to `metrics`)."""
        ...

    def metrics(self) -> dict[str, float]:
        """The weight syncs' timings since the previous call."""
        ...

    async def stop(self) -> None:
        """Stop what `start` started (the servers verl's workers host stay: they go with the backend)."""
        ...

    def release(self) -> None:
        """Called at the start of an update, with no request in flight and from the update's worker thread: give
        the accelerator to the trainer if needed (synchronous: the update runs outside the event loop)."""
        ...


class _Timings:
    """`Serving.metrics` of the implementations below: what `sync` recorded since the previous call."""

    def __init__(self) -> None:
        self._metrics: dict[str, float] = {}

    def metrics(self) -> dict[str, float]:
        """The weight syncs' timings since the previous call."""
        metrics, self._metrics = self._metrics, {}
        return metrics

    async def stop(self) -> None:
        """Nothing to stop here: the servers belong to the backend (``RayVerlBackend.shutdown``)."""


class LocalServer(Protocol):
    """A server that serves what it is given: ``agentlightning_torch``'s ``LocalBackend`` behind its HTTP server."""

    @property
    def base_url(self) -> str:
        """Its OpenAI base URL."""
        ...

    def load_state_dict(self, state_dict: Mapping[str, torch.Tensor], version: int | None = None) -> int:
        """Swap in new weights between batches; returns the version now served."""
        ...


class ExportedWeightsServing(_Timings):
    """`Serving` of a `LocalServer`: the actor's full weights, exported by verl's engine, loaded into it.

    Args:
        actor_wg: verl's actor worker group built from `agentlightning_verl._workers.ActorWorker`.
        server: The server to load them into.
    """

    def __init__(self, actor_wg: Any, server: LocalServer) -> None:
        super().__init__()
        self.actor_wg = actor_wg
        self.server = server

    def addresses(self) -> list[str]:
        """The local server's URL."""
        return [self.server.base_url]

    async def start(self, version: int) -> list[str]:
        """Load the actor's weights into the server as ``version``; returns its URL."""
        await self.sync(version)
        return self.addresses()

    async def drain(self, timeout_s: float) -> int:
        """The local server finishes its batch between calls; nothing to abort."""
        del timeout_s
        return 0

    def release(self) -> None:
        """Nothing to release: the local server does not share an accelerator with the trainer."""

    async def sync(self, version: int) -> None:
        """Export the actor's weights (rank 0's copy) and load them into the server as ``version``.

        Raises:
            RuntimeError: The server reports another version than ``version`` after loading.
        """
        started = time.perf_counter()
        exported = await asyncio.to_thread(self.actor_wg.export_weights)
        state_dict = next(w for w in exported if w is not None)
        exported_at = time.perf_counter()
        served = await asyncio.to_thread(self.server.load_state_dict, state_dict, version)
        if served != version:
            raise RuntimeError(f"the local server reports model version {served} after loading version {version}")
        logger.info("local server now serves model version %d (%d tensors)", version, len(state_dict))
        self._metrics.update({"sync/export_s": exported_at - started, "sync/load_s": time.perf_counter() - exported_at})


class VLLMReplicaServing(_Timings):
    """`Serving` of verl's vLLM replicas (``LLMServerManager``), synced by ``CheckpointEngineManager``.

    Args:
        llm_servers: verl's ``LLMServerManager`` (its replicas run colocated with the actor workers).
        checkpoints: verl's ``CheckpointEngineManager`` over the actor worker group and those replicas.
    """

    def __init__(self, llm_servers: Any, checkpoints: Any) -> None:
        super().__init__()
        self.llm_servers = llm_servers
        self.checkpoints = checkpoints
        self.requests_at_release: list[int] = []
        """vLLM's request count at each `release` (0 when no late rollout still generates during an update)."""

    def addresses(self) -> list[str]:
        """``http://host:port`` of every vLLM replica (``LLMServerManager.get_addresses``)."""
        return [a if a.startswith("http") else f"http://{a}" for a in self.llm_servers.get_addresses()]

    def _servers(self) -> list[Any]:
        """Each replica's first server (the one holding vLLM's engine; others run headless)."""
        return [replica.servers[0] for replica in self.llm_servers.get_replicas()]

    async def start(self, version: int) -> list[str]:
        """Wake the replicas with the actor's weights as ``version`` (`sync`); returns their URLs."""
        await self.sync(version)
        return self.addresses()

    async def drain(self, timeout_s: float) -> int:
        """Abort whatever vLLM still generates and hold new requests until the next sync (verl's
        ``abort_replicas``, as its partial-rollout sync does: nothing to wait for); returns the requests left (0)."""
        del timeout_s
        await _maybe_await(self.checkpoints.abort_replicas())
        return await self.running_requests()

    async def running_requests(self) -> int:
        """Requests vLLM's engines hold now, over all replicas (needs our server class, `llm_server_manager`)."""
        counts = await asyncio.gather(*[server.agl_running_requests.remote() for server in self._servers()])
        return int(sum(counts))

    async def received_checksums(self) -> list[str]:
        """Per vLLM worker: the checksum of the tensors verl's last sync handed to vLLM's loader."""
        results = await asyncio.gather(
            *[server.agl_collective_rpc.remote("agl_received_checksum") for server in self._servers()]
        )
        return [str(checksum) for per_server in results for checksum in per_server]

    def release(self) -> None:
        """Nothing may generate during the update: abort, then verl's ``sleep_replicas`` (vLLM frees weights and KV
        cache; a no-op where sleep mode is off, as on CPU). verl's managers are synchronous when called outside an
        event loop (``auto_await``), as ``RayPPOTrainer.fit`` calls them."""
        import ray

        self.checkpoints.abort_replicas()
        counts = ray.get([server.agl_running_requests.remote() for server in self._servers()])
        self.requests_at_release.append(int(sum(counts)))
        self.checkpoints.sleep_replicas()

    async def sync(self, version: int) -> None:
        """``CheckpointEngineManager.update_weights(version)`` (actor weights into every replica, then wake up),
        then generation resumes (verl's ``resume_generation_replicas``)."""
        started = time.perf_counter()
        result = await _maybe_await(self.checkpoints.update_weights(version))
        await _maybe_await(self.checkpoints.resume_generation_replicas())
        metrics = {f"sync/{k}": float(v) for k, v in (result or {}).items() if isinstance(v, int | float)}
        self._metrics.update({**metrics, "sync/update_weights_s": time.perf_counter() - started})


class NoServing(_Timings):
    """`Serving` where nothing serves (`LocalVerlBackend`: updates only): no address, nothing to drain or release;
    `sync` records the version."""

    def __init__(self) -> None:
        super().__init__()
        self.synced_versions: list[int] = []
        """Every version `sync` (and `start`) was given."""

    def addresses(self) -> list[str]:
        """None: nothing serves."""
        return []

    async def start(self, version: int) -> list[str]:
        """No server: records the version, returns no address."""
        await self.sync(version)
        return []

    async def drain(self, timeout_s: float) -> int:
        """Nothing generates."""
        del timeout_s
        return 0

    def release(self) -> None:
        """Nothing to release."""

    async def sync(self, version: int) -> None:
        """Nothing to sync to; records the version."""
        self.synced_versions.append(version)
