"""Agent Lightning on verl: `TrainingBatch` -> verl `DataProto`, verl's PPO/GRPO updates, vLLM weight sync.

Importing this package imports neither verl nor torch; each entry point imports them when called.
`VerlEngine` is the `agentlightning.Engine` (verl's actor, critic and rollout servers); `VerlTrainer` is the
`agentlightning.RLLoop` that trains one, both built from a `VerlTrainerConfig`. ``VerlAlgorithm`` is the deprecated
old name of `VerlTrainer` (removed in 0.3.0). The CPU rehearsal of verl's GPU recipe (verl and its vLLM rollout on
a CPU, for tests) is not user API: it lives in the private `agentlightning_verl._cpu_rehearsal`, which lists every
private verl / vLLM attribute it relies on; ``install_cpu_platform`` here is its deprecated alias (removed in 0.3.0).
The engine serves through its backend's `Serving` (`VLLMReplicaServing`, `ExportedWeightsServing` or `NoServing`);
``RolloutServing``, ``VllmServing`` and ``LocalServing`` are deprecated old names of `Serving`, `VLLMReplicaServing`
and `ExportedWeightsServing` (removed in 0.3.0).
"""

import warnings
from typing import Any

from agentlightning_verl._config import ADV_ESTIMATORS, VerlTrainerConfig
from agentlightning_verl._convert import SequenceTooLongError, TruncationPolicy, to_data_proto
from agentlightning_verl._engine import VerlBackend, VerlEngine, VerlTrainer
from agentlightning_verl._local_actor import LocalVerlActor, LocalVerlBackend
from agentlightning_verl._ray_backend import (
    CPU_WORKER_SETUP_HOOK,
    GPU_INSTALL_HINT,
    RayVerlBackend,
    cpu_ray_init_kwargs,
)
from agentlightning_verl._serving import (
    ExportedWeightsServing,
    LocalServer,
    NoServing,
    Serving,
    VLLMReplicaServing,
    named_tensors_checksum,
)

VERL_VERSION = "0.9.1"
"""The verl release this package is written and tested against (pinned in pyproject)."""

__all__ = [
    "ADV_ESTIMATORS",
    "CPU_WORKER_SETUP_HOOK",
    "GPU_INSTALL_HINT",
    "VERL_VERSION",
    "ExportedWeightsServing",
    "LocalServer",
    "LocalVerlActor",
    "LocalVerlBackend",
    "NoServing",
    "RayVerlBackend",
    "SequenceTooLongError",
    "Serving",
    "TruncationPolicy",
    "VLLMReplicaServing",
    "VerlBackend",
    "VerlEngine",
    "VerlTrainer",
    "VerlTrainerConfig",
    "cpu_ray_init_kwargs",
    "named_tensors_checksum",
    "to_data_proto",
]


def __getattr__(name: str) -> Any:
    """Deprecated names, removed in 0.3.0 (each warns): ``VerlAlgorithm`` (`VerlTrainer`),
    ``install_cpu_platform`` (the CPU rehearsal's, now private: ``agentlightning_verl._cpu_rehearsal``),
    ``RolloutServing`` (`Serving`), ``VllmServing`` (`VLLMReplicaServing`), ``LocalServing``
    (`ExportedWeightsServing`)."""
    if name == "RolloutServing":
        warnings.warn(
            "agentlightning_verl.RolloutServing is deprecated: use Serving (steps start, drain, sync, metrics, stop, "
            "release); it is removed in 0.3.0",
            DeprecationWarning,
            stacklevel=2,
        )
        return Serving
    if name == "VllmServing":
        warnings.warn(
            "agentlightning_verl.VllmServing is deprecated: use VLLMReplicaServing (a Serving: start, drain, sync, "
            "metrics, stop, release); it is removed in 0.3.0",
            DeprecationWarning,
            stacklevel=2,
        )
        return VLLMReplicaServing
    if name == "LocalServing":
        warnings.warn(
            "agentlightning_verl.LocalServing is deprecated: use ExportedWeightsServing (a Serving: start, drain, "
            "sync, metrics, stop, release); it is removed in 0.3.0",
            DeprecationWarning,
            stacklevel=2,
        )
        return ExportedWeightsServing
    if name == "install_cpu_platform":
        warnings.warn(
            "agentlightning_verl.install_cpu_platform is deprecated: the CPU rehearsal is not user API "
            "(agentlightning_verl._cpu_rehearsal.install_cpu_platform; RayVerlBackend(device='cpu') calls it); "
            "it is removed in 0.3.0",
            DeprecationWarning,
            stacklevel=2,
        )
        from agentlightning_verl._cpu_rehearsal import install_cpu_platform

        return install_cpu_platform
    if name == "VerlAlgorithm":
        warnings.warn(
            "agentlightning_verl.VerlAlgorithm is deprecated: use VerlTrainer (an agentlightning.RLLoop whose "
            "engine, a VerlEngine, is trainer.engine); it is removed in 0.3.0",
            DeprecationWarning,
            stacklevel=2,
        )
        return VerlTrainer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
