"""How trained weights reach the inference servers: one implementation of core's serving contract
(`agentlightning.loop.Serving`) per way of serving.

`VerlEngine` delegates its server steps to its runtime's `Serving` (``VerlRuntime.serving``) whatever serves the
rollouts: ``start_servers`` → `Serving.start`, ``wait_servers_idle`` → `Serving.wait_idle`, ``abort_servers`` →
`Serving.abort`, ``sync_weights`` → `Serving.sync`, ``iteration_metrics`` → `Serving.metrics`, ``stop_servers`` →
`Serving.stop`, and `Serving.release` at the start of ``update`` (the proxy is paused, nothing is generating).
trainer-torch's servings implement the same protocol; ``tests/test_serving_contract.py`` runs every implementation
it can against it.

* `VLLMReplicaServing`: verl's colocated vLLM replicas. ``release`` is verl's
  ``CheckpointEngineManager.sleep_replicas`` (vLLM frees its weights and KV cache so FSDP can use the GPU); ``sync``
  is verl's ``CheckpointEngineManager.update_weights`` (with the default ``naive`` backend: each actor rank streams
  ``engine.get_per_tensor_param()`` into its colocated vLLM worker, then vLLM wakes up) — exactly what
  ``RayPPOTrainer.fit`` does around its update.
* `ExportedWeightsServing`: any server that can load a state dict (the embedded torch backend,
  ``agentlightning_torch``'s ``LocalBackend``, standing in for vLLM on a machine without GPUs): ``sync`` gathers the
  actor's full weights from verl's FSDP engine (the same generator verl feeds vLLM) and loads them, tagged with the
  version.
* `NoServing`: nothing serves (`LocalVerlRuntime`: updates only); ``sync`` records the version.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

__all__ = [
    "ExportedWeightsServing",
    "LocalServer",
    "NoServing",
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


async def _wait_until_idle(running: Callable[[], int], timeout_s: float) -> int:
    """Poll ``running()`` until it is 0 or ``timeout_s`` passed; returns its last value."""
    deadline = time.monotonic() + timeout_s
    while (count := running()) and time.monotonic() < deadline:
        await asyncio.sleep(0.005)
    return count


class _Timings:
    """`Serving.metrics` of the implementations below: what `sync` recorded since the previous call."""

    def __init__(self) -> None:
        self._metrics: dict[str, float] = {}

    def metrics(self) -> dict[str, float]:
        """The weight syncs' timings since the previous call."""
        metrics, self._metrics = self._metrics, {}
        return metrics

    async def stop(self) -> None:
        """Nothing to stop here: the servers belong to the runtime (``RayVerlRuntime.shutdown``)."""

    def policy_versions(self) -> dict[str, int]:
        """Empty: one policy, whose version the proxy records from the loop."""
        return {}


class LocalServer(Protocol):
    """A server that serves what it is given: ``agentlightning_torch``'s ``LocalBackend`` behind its HTTP server."""

    @property
    def base_url(self) -> str:
        """Its OpenAI base URL."""
        ...

    @property
    def running(self) -> int:
        """Requests it generates now."""
        ...

    def abort(self) -> None:
        """Stop every request it generates now."""
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

    async def wait_idle(self, timeout_s: float) -> int:
        """Wait (at most ``timeout_s``) until the local server generates nothing; returns the requests left."""
        return await _wait_until_idle(lambda: self.server.running, timeout_s)

    async def abort(self, timeout_s: float) -> int:
        """Stop what the local server generates and wait (at most ``timeout_s``) for it to leave."""
        self.server.abort()
        return await self.wait_idle(timeout_s)

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

    async def wait_idle(self, timeout_s: float) -> int:
        """Wait (at most ``timeout_s``) until vLLM's engines hold no request (`running_requests`); returns the
        requests left."""
        deadline = time.monotonic() + timeout_s
        while (count := await self.running_requests()) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return count

    async def abort(self, timeout_s: float) -> int:
        """Abort whatever vLLM still generates (verl's ``abort_replicas``, as its partial-rollout sync does), wait
        (at most ``timeout_s``) for it to leave, then let new requests in again (``resume_generation_replicas``:
        aborting holds them); returns the requests left."""
        await _maybe_await(self.checkpoints.abort_replicas())
        left = await self.wait_idle(timeout_s)
        await _maybe_await(self.checkpoints.resume_generation_replicas())
        return left

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
    """`Serving` where nothing serves (`LocalVerlRuntime`: updates only): no address, nothing to wait for, abort or
    release; `sync` records the version."""

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

    async def wait_idle(self, timeout_s: float) -> int:
        """Nothing generates."""
        del timeout_s
        return 0

    async def abort(self, timeout_s: float) -> int:
        """Nothing generates."""
        del timeout_s
        return 0

    def release(self) -> None:
        """Nothing to release."""

    async def sync(self, version: int) -> None:
        """Nothing to sync to; records the version."""
        self.synced_versions.append(version)
