"""Agent Lightning on verl: `TrainingBatch` -> verl `DataProto`, verl's PPO/GRPO updates, vLLM weight sync.

Importing this package imports neither verl nor torch; each entry point imports them when called.
"""

from agentlightning_verl._algorithm import GPU_INSTALL_HINT, RayVerlBackend, VerlAlgorithm, VerlBackend
from agentlightning_verl._config import ADV_ESTIMATORS, VerlTrainerConfig
from agentlightning_verl._convert import SequenceTooLongError, TruncationPolicy, to_data_proto
from agentlightning_verl._cpu_platform import install_cpu_platform
from agentlightning_verl._local_actor import LocalVerlActor, LocalVerlBackend

VERL_VERSION = "0.9.1"
"""The verl release this package is written and tested against (pinned in pyproject)."""

__all__ = [
    "ADV_ESTIMATORS",
    "GPU_INSTALL_HINT",
    "VERL_VERSION",
    "LocalVerlActor",
    "LocalVerlBackend",
    "RayVerlBackend",
    "SequenceTooLongError",
    "TruncationPolicy",
    "VerlAlgorithm",
    "VerlBackend",
    "VerlTrainerConfig",
    "install_cpu_platform",
    "to_data_proto",
]
