"""`TorchEngine`: the embedded-default engine — a local batched backend behind the LLM proxy, PPO on one machine.

The RL step itself is core's `agentlightning.RLLoop` (rollouts → transitions → LightningRL credit → update → new
model version served); `TorchEngine` is the engine behind it: it builds the policy and its optimizer, serves the
policy with `LocalBackend` (which reports the version of the weights behind every answer) or vLLM, runs
`ppo_update`, swaps the weights into the backend, and saves/loads checkpoints. `TorchTrainer` is the convenience
that builds both from one `TorchTrainerConfig`: an `RLLoop` whose ``engine`` is a `TorchEngine`. Rollouts run
wherever runners are (other processes, other machines); the trainer only talks to the store and serves the model.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import torch

from agentlightning import Engine, IterationReport, RLLoop, TrainingBatch
from agentlightning.loop import Serving
from agentlightning_torch.models._loading import load_model
from agentlightning_torch.models._lora import is_lora
from agentlightning_torch.training._lora_policies import LoRAPolicies
from agentlightning_torch.training._policies import Policies, SinglePolicy
from agentlightning_torch.training._policy_set import TrainedPolicies
from agentlightning_torch.training._ppo import make_optimizer, prepare_policy
from agentlightning_torch.training._serving_choice import make_serving
from agentlightning_torch.training._trainer_config import TorchTrainerConfig

__all__ = ["IterationReport", "TorchEngine", "TorchTrainer"]

logger = logging.getLogger(__name__)


class TorchEngine(Engine):
    """PPO/GRPO on one machine (CPU or one CUDA GPU): the policy, its optimizer and its inference server.

    Train it with ``agentlightning.RLLoop(config.loop_config(), TorchEngine(config))``, or build both at once with
    `TorchTrainer`. A subclass (to check or record each batch, say) goes to `RLLoop` the same way.

    The backend generates with its own copy of the weights (`LocalBackend` copies the model it is given; a
    weight sync copies the policy's state dict into it), so the model's parameters are held twice, plus the
    optimizer state; in exchange the backend keeps serving the current version while `update` changes the policy in
    place, which ``max_staleness`` k > 0 (the next iterations' rollouts run during the update) relies on; then the
    update corrects for the samples' lag by truncated importance sampling (`PPOConfig.is_correction`).

    Args:
        config: Validated settings (the loop's share is ``config.loop_config()``).
    """

    serves_during_update = True
    """The backend serves its own copy of the weights until `sync_weights`, so it can serve while `update` runs."""

    def __init__(self, config: TorchTrainerConfig) -> None:
        self.config = config
        torch.set_num_threads(config.num_threads)
        self.ppo = config.update_settings()
        """The update's settings: ``config.ppo`` with the importance correction decided (`update_settings`)."""
        loaded = load_model(config.model_dir, device=config.device)
        self.tokenizer = loaded.tokenizer
        self.generation_config = loaded.generation_config
        self.trained: TrainedPolicies | None = None
        """With ``config.policies``: every trained policy, a LoRA adapter on the base or full weights of its own."""
        self.loras: LoRAPolicies | None = None
        """The LoRA policies (served together by one backend, or by vLLM's multi-LoRA serving)."""
        self.policies_unsupported = None if config.policies else "TorchTrainerConfig.policies is not set"
        self.policies: Policies
        """What `update`, `save_state` and `load_state` act on: the `TrainedPolicies`, or one `SinglePolicy`."""
        if config.policies is not None:
            trained = TrainedPolicies(loaded.model, config.policies.trained, self.ppo, config.policy_settings)
            self.trained, self.loras, self.policies = trained, trained.lora, trained
            self.policy: torch.nn.Module = trained.base
            self.optimizer = next(iter(trained.optimizers.values()))
        else:
            self.policy = prepare_policy(loaded.model, config.ppo)
            self.optimizer = make_optimizer(self.policy, config.ppo)
            # The KL penalty's reference exists only when the penalty does; a LoRA policy's reference is its own base
            # with the adapters switched off (no copy at all).
            ref_model = None
            if config.ppo.kl_coef > 0 and not is_lora(self.policy):
                ref_model = load_model(config.model_dir, device=config.device).model.requires_grad_(False)
            self.policies = SinglePolicy(self.policy, self.optimizer, self.ppo, ref_model)
        self.serving: Serving = make_serving(
            config,
            policy=self.policy,
            trained=self.trained,
            tokenizer=self.tokenizer,
            generation_config=self.generation_config,
        )
        """How the policies are served (`make_serving` picks one way from ``config.backend`` and ``config.policies``):
        every server step below is this object's."""

    async def start_servers(self, model_version: int) -> list[str]:
        """Start the servers (`Serving.start`), serving the current weights as ``model_version``; returns how the
        proxy reaches them: the local backend in-process (an ``inproc://`` URL, no HTTP) or its HTTP server's URL
        with ``backend_http``; with ``backend="vllm"`` vLLM's, once the policy's weights (or every policy's adapter)
        are loaded into it and verified."""
        return await self.serving.start(model_version)

    async def stop_servers(self) -> None:
        """Stop the servers (`Serving.stop`): the backends, or a vLLM server the trainer launched."""
        await self.serving.stop()

    async def wait_servers_idle(self, timeout_s: float) -> int:
        """Wait (at most ``timeout_s``) until the servers generate nothing (`Serving.wait_idle`): the calls the proxy
        aborted have left `LocalBackend`'s batch, or vLLM's ``vllm:num_requests_running`` is 0; returns the requests
        still running."""
        return await self.serving.wait_idle(timeout_s)

    async def abort_servers(self, timeout_s: float) -> int:
        """Stop what the servers still generate (`Serving.abort`), waiting at most ``timeout_s``; returns the requests
        left."""
        return await self.serving.abort(timeout_s)

    def update(self, batch: TrainingBatch) -> dict[str, float]:
        """One PPO step on ``batch`` (the `Engine` contract); with policies, one per policy with samples."""
        return self.policies.update(batch, self.config.device)

    async def sync_weights(self, version: int) -> None:
        """Load the updated weights into the servers, which report ``version`` from now on (`Serving.sync`).

        vLLM: the merged weights are loaded and verified by log-probs; a mismatch raises `WeightSyncMismatch`
        naming ``version``, which stops the run. With policies, only the policies the update changed are loaded
        (adapters in place under their names, full-weight policies into their own backends) and, on vLLM, verified
        (the error names the policy too)."""
        await self.serving.sync(version)

    def policy_versions(self) -> dict[str, int]:
        """Per policy, the version vLLM serves it with (`Serving.policy_versions`; `LocalBackend` reports its own)."""
        return self.serving.policy_versions()

    def iteration_metrics(self) -> dict[str, float]:
        """Serving metrics since the previous call (`Serving.metrics`): the backends' admission groups and their mean
        size, decode steps and their mean rows, generation time (wall and CPU) and tokens; with vLLM, the last
        sync's timings and probe difference."""
        return self.serving.metrics()

    def save_state(self, directory: Path) -> None:
        """A plain ``save_pretrained`` folder (LoRA merged; ``adapter/`` too for LoRA) plus the optimizer state.

        With policies: every adapter as ``adapters/<policy>/`` (``save_pretrained``) with every optimizer's state,
        every full-weight policy as ``policies/<policy>/`` (``save_pretrained`` and ``optimizer.pt``),
        and the tokenizer. The best checkpoint inside it (``best/``) is kept."""
        self.policies.save(directory, self.tokenizer)

    def load_state(self, directory: Path) -> None:
        """Load the weights (or LoRA adapter) and optimizer state `save_state` wrote (with policies: all of them)."""
        self.policies.load(directory, self.config.device)


class TorchTrainer(RLLoop[TorchEngine]):
    """The `RLLoop` of a `TorchEngine`, both built from one `TorchTrainerConfig`.

    Everything loop-side (`run`, `train_iteration`, `evaluate`, `start`, `stop`, `proxy`, `history`, `iteration`,
    `model_version`, checkpoints) is `RLLoop`'s own; everything model-side is on ``trainer.engine`` (``policy``,
    ``tokenizer``, ``update``, ``sync_weights``...). With ``config.resume`` the latest checkpoint in
    ``config.output_dir`` is loaded here, so ``iteration`` and the weights are restored before `start`.

    Args:
        config: Validated settings.
        on_iteration: Called after every iteration with its report (progress bars, early stopping).
    """

    def __init__(
        self, config: TorchTrainerConfig, on_iteration: Callable[[IterationReport], None] | None = None
    ) -> None:
        super().__init__(config.loop_config(), TorchEngine(config), on_iteration=on_iteration)
        if config.resume:
            self.restore()
