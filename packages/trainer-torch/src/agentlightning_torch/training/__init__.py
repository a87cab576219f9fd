"""The torch trainer's RL training: the PPO/GRPO step, the engine and trainer, and policies trained side by side.

- `PPOConfig` + `ppo_update` (the clipped policy-gradient step on an `agentlightning.TrainingBatch`).
- `TorchEngine` (policy, optimizer and the `agentlightning.loop.Serving` that `make_serving` picks, as an
  `agentlightning.Engine`) and `TorchTrainer` (the engine and the `agentlightning.RLLoop` that trains it, from one
  `TorchTrainerConfig`; `backend_settings` and `vllm_model` read a config's serving settings).
- What the engine trains, modelled once (`Policies`): one `SinglePolicy`, or several policies in one run
  (`agentlightning.PolicyMap`): `LoRAPolicies` (a LoRA adapter each on one base),
  `FullPolicies` (a full copy each), `TrainedPolicies` (both kinds), each with its `PolicySettings`;
  `PolicyProgress` warns about a policy whose weights barely move.
"""

from agentlightning_torch.training._full_policies import FullPolicies
from agentlightning_torch.training._lora_policies import LoRAPolicies, policy_metric
from agentlightning_torch.training._policies import Policies, SinglePolicy
from agentlightning_torch.training._policy_progress import PolicyProgress
from agentlightning_torch.training._policy_set import TrainedPolicies
from agentlightning_torch.training._policy_settings import PolicySettings
from agentlightning_torch.training._ppo import (
    PPOConfig,
    make_optimizer,
    plan_micro_batches,
    ppo_update,
    prepare_policy,
    response_logprobs,
)
from agentlightning_torch.training._serving_choice import backend_settings, make_serving, vllm_model
from agentlightning_torch.training._trainer import IterationReport, TorchEngine, TorchTrainer
from agentlightning_torch.training._trainer_config import TorchTrainerConfig

__all__ = [
    "FullPolicies",
    "IterationReport",
    "LoRAPolicies",
    "PPOConfig",
    "Policies",
    "PolicyProgress",
    "PolicySettings",
    "SinglePolicy",
    "TorchEngine",
    "TorchTrainer",
    "TorchTrainerConfig",
    "TrainedPolicies",
    "backend_settings",
    "make_optimizer",
    "make_serving",
    "plan_micro_batches",
    "policy_metric",
    "ppo_update",
    "prepare_policy",
    "response_logprobs",
    "vllm_model",
]
