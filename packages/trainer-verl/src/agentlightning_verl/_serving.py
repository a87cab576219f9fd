"""How trained weights reach the inference servers: one interface, `RolloutServing`, two implementations.

`VerlEngine` calls the same two methods whatever serves the rollouts: `RolloutServing.release` before an update
(the proxy is paused, nothing is generating) and `RolloutServing.sync_weights` after it.

* `VllmServing`: verl's colocated vLLM replicas. ``release`` is verl's ``CheckpointEngineManager.sleep_replicas``
  (vLLM frees its weights and KV cache so FSDP can use the GPU); ``sync_weights`` is verl's
  ``CheckpointEngineManager.update_weights`` (with the default ``naive`` backend: each actor rank streams
  ``engine.get_per_tensor_param()`` into its colocated vLLM worker, then vLLM wakes up) — exactly what
  ``RayPPOTrainer.fit`` does around its update.
* `LocalServing`: any server that can load a state dict (the embedded torch backend, ``agentlightning_torch``'s
  ``LocalBackend``, standing in for vLLM on a machine without GPUs): ``sync_weights`` gathers the actor's full
  weights from verl's FSDP engine (the same generator verl feeds vLLM) and loads them, tagged with the version.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import logging
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

__all__ = ["LocalServer", "LocalServing", "RolloutServing", "VllmServing", "named_tensors_checksum"]

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
    return await value if inspect.isawaitable(value) else value


class RolloutServing(Protocol):
    """The inference servers behind the LLM proxy, and how the actor's weights get into them."""

    def addresses(self) -> list[str]:
        """OpenAI-compatible base URLs of the servers (the LLM proxy's backends)."""
        ...

    async def drain(self) -> int:
        """Stop whatever the servers still generate (calls of cancelled rollouts); returns the requests left."""
        ...

    async def release(self) -> None:
        """Called before an update, with no request in flight: give the accelerator to the trainer if needed."""
        ...

    async def sync_weights(self, version: int) -> dict[str, float]:
        """Serve the actor's current weights from now on, as model ``version``; returns timing metrics."""
        ...


class LocalServer(Protocol):
    """A server that serves what it is given: ``agentlightning_torch``'s ``LocalBackend`` behind its HTTP server."""

    @property
    def base_url(self) -> str:
        """Its OpenAI base URL."""
        ...

    def load_state_dict(self, state_dict: Mapping[str, torch.Tensor], version: int | None = None) -> int:
        """Swap in new weights between batches; returns the version now served."""
        ...


class LocalServing:
    """`RolloutServing` for a `LocalServer`: the actor's full weights, exported by verl's engine, loaded into it.

    Args:
        actor_wg: verl's actor worker group built from `agentlightning_verl._workers.ActorWorker`.
        server: The server to load them into.
    """

    def __init__(self, actor_wg: Any, server: LocalServer) -> None:
        self.actor_wg = actor_wg
        self.server = server

    def addresses(self) -> list[str]:
        """The local server's URL."""
        return [self.server.base_url]

    async def drain(self) -> int:
        """The local server finishes its batch between calls; nothing to abort."""
        return 0

    async def release(self) -> None:
        """Nothing to release: the local server does not share an accelerator with the trainer."""

    async def sync_weights(self, version: int) -> dict[str, float]:
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
        return {"sync/export_s": exported_at - started, "sync/load_s": time.perf_counter() - exported_at}


class VllmServing:
    """`RolloutServing` for verl's vLLM replicas (``LLMServerManager``), synced by ``CheckpointEngineManager``.

    Args:
        llm_servers: verl's ``LLMServerManager`` (its replicas run colocated with the actor workers).
        checkpoints: verl's ``CheckpointEngineManager`` over the actor worker group and those replicas.
    """

    def __init__(self, llm_servers: Any, checkpoints: Any) -> None:
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

    async def drain(self) -> int:
        """Abort whatever vLLM still generates and hold new requests until the next sync (verl's
        ``abort_replicas``, as its partial-rollout sync does); returns the requests left (0)."""
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

    async def release(self) -> None:
        """Nothing may generate during the update: abort (`drain`), then verl's ``sleep_replicas`` (vLLM frees
        weights and KV cache; a no-op where sleep mode is off, as on CPU)."""
        self.requests_at_release.append(await self.drain())
        await _maybe_await(self.checkpoints.sleep_replicas())

    async def sync_weights(self, version: int) -> dict[str, float]:
        """``CheckpointEngineManager.update_weights(version)`` (actor weights into every replica, then wake up),
        then generation resumes (verl's ``resume_generation_replicas``)."""
        started = time.perf_counter()
        result = await _maybe_await(self.checkpoints.update_weights(version))
        await _maybe_await(self.checkpoints.resume_generation_replicas())
        metrics = {f"sync/{k}": float(v) for k, v in (result or {}).items() if isinstance(v, int | float)}
        return {**metrics, "sync/update_weights_s": time.perf_counter() - started}
