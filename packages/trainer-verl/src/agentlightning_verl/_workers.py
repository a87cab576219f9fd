"""verl 0.9.1's own worker classes, made ready to run as Ray actors on GPUs or on the CPU platform.

`ActorWorker` is verl's ``ActorRolloutRefWorker`` and `CriticWorker` verl's ``TrainingWorker``; both add only what
our loop needs and verl does not offer:

* on the CPU platform (`install_cpu_platform`) they open the worker group's ``gloo`` process group themselves before
  verl does, because verl's ``initialize_global_process_group_ray`` asks torch for ``cpu:gloo,cpu:gloo`` there,
  which torch refuses (``ValueError: Duplicate device type cpu``); on GPUs verl opens it as usual;
* ``export_weights`` / ``weights_checksum`` on the actor: the full, HF-named weights as the actor's FSDP engine
  exports them for a weight sync (``engine.get_per_tensor_param()``, the generator verl feeds vLLM), so a server
  that is not vLLM can load them and a test can compare what is served with what was trained.

This module imports verl and torch at import time; the package imports it only when Ray workers are built. In a
Ray worker process on the CPU platform, ``install_cpu_platform`` must already have run (``RayVerlRuntime`` passes it
as Ray's ``worker_process_setup_hook``), since unpickling these classes imports verl's workers.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch
from verl.single_controller.base.decorator import Dispatch, register
from verl.utils.device import get_device_name
from verl.workers.engine_workers import ActorRolloutRefWorker, TrainingWorker

from agentlightning_verl._serving import named_tensors_checksum

__all__ = ["ActorWorker", "CriticWorker"]

logger = logging.getLogger(__name__)

_ONE_TO_ALL: Any = Dispatch.ONE_TO_ALL  # pyright: ignore[reportAttributeAccessIssue]  # added by Dispatch.register


def _open_cpu_process_group() -> None:
    """On the CPU platform, join the worker group's gloo process group (ranks and address set by verl)."""
    import torch.distributed as dist

    if get_device_name() != "cpu" or dist.is_initialized():
        return
    address, port = os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]
    dist.init_process_group(
        backend="gloo",
        rank=int(os.environ["RANK"]),
        world_size=int(os.environ["WORLD_SIZE"]),
        init_method=f"tcp://{address}:{port}",
    )


class ActorWorker(ActorRolloutRefWorker):
    """verl's actor (+ vLLM rollout when the role says so), plus weight export for non-vLLM servers."""

    def __init__(self, config: Any, role: str, **kwargs: Any) -> None:
        _open_cpu_process_group()
        super().__init__(config, role, **kwargs)

    def _full_weights(self) -> dict[str, torch.Tensor]:
        assert self.actor is not None, "init_model() first"
        params, _ = self.actor.engine.get_per_tensor_param()
        # every rank takes part in the gathers; each ends up with the full tensors
        return {name: tensor.detach().to("cpu").clone() for name, tensor in params}

    @register(dispatch_mode=_ONE_TO_ALL)
    def reset_actor(self) -> None:
        """Rebuild the actor's model and optimizer from the model folder (``TrainingWorker.reset``)."""
        assert self.actor is not None, "init_model() first"
        self.actor.reset()

    @register(dispatch_mode=_ONE_TO_ALL)
    def export_weights(self) -> dict[str, torch.Tensor] | None:
        """The actor's full weights (HF names, CPU tensors) on rank 0; ``None`` on the other ranks."""
        weights = self._full_weights()
        return weights if self.rank == 0 else None

    @register(dispatch_mode=_ONE_TO_ALL)
    def weights_checksum(self) -> str:
        """`named_tensors_checksum` of the actor's full weights (the same on every rank)."""
        return named_tensors_checksum(self._full_weights().items())

    @register(dispatch_mode=_ONE_TO_ALL)
    def node_id(self) -> str:
        """The Ray node this rank runs on (multi-node placement checks)."""
        import ray

        return str(ray.get_runtime_context().get_node_id())


class CriticWorker(TrainingWorker):
    """verl's training worker for the value model (PPO's critic), able to start on the CPU platform."""

    def __init__(self, config: Any) -> None:
        _open_cpu_process_group()
        super().__init__(config)
