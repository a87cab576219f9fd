"""Agent Lightning on verl: `TrainingBatch` -> verl `DataProto`, verl's PPO/GRPO updates, vLLM weight sync.

Importing this package imports neither verl nor torch; each entry point imports them when called.
`VerlEngine` is the `agentlightning.Engine` (verl's actor, critic and rollout servers); `VerlTrainer` is the
`agentlightning.RLLoop` that trains one, both built from a `VerlTrainerConfig`. The CPU rehearsal of verl's GPU
recipe (verl and its vLLM rollout on a CPU, for tests) is not user API: it lives in the private
`agentlightning_verl._cpu_rehearsal`; verl's vLLM rollout as both paths run it is the private
`agentlightning_verl._vllm_integration`, which lists every private verl / vLLM attribute they rely on. The engine serves
through its runtime's `Serving` (`VLLMReplicaServing`, `ExportedWeightsServing` or `NoServing`).
"""

from agentlightning_verl._config import ADV_ESTIMATORS, VerlTrainerConfig
from agentlightning_verl._convert import SequenceTooLongError, TruncationPolicy, to_data_proto
from agentlightning_verl._engine import VerlEngine, VerlRuntime, VerlTrainer
from agentlightning_verl._local_actor import LocalVerlActor, LocalVerlRuntime
from agentlightning_verl._ray_runtime import (
    CPU_WORKER_SETUP_HOOK,
    GPU_INSTALL_HINT,
    RayVerlRuntime,
    cpu_ray_init_kwargs,
)
from agentlightning_verl._serving import (
    ExportedWeightsServing,
    LocalServer,
    NoServing,
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
    "LocalVerlRuntime",
    "NoServing",
    "RayVerlRuntime",
    "SequenceTooLongError",
    "TruncationPolicy",
    "VLLMReplicaServing",
    "VerlEngine",
    "VerlRuntime",
    "VerlTrainer",
    "VerlTrainerConfig",
    "cpu_ray_init_kwargs",
    "named_tensors_checksum",
    "to_data_proto",
]
