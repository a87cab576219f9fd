"""`VerlTrainerConfig`: the few settings people change, validated, turned into verl 0.9.1's full OmegaConf config."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from agentlightning import LoopConfig
from agentlightning.credit import canonical_estimator_name, is_group_estimator

if TYPE_CHECKING:
    from omegaconf import DictConfig

__all__ = ["ADV_ESTIMATORS", "VerlTrainerConfig"]

AlgorithmName = Literal["grpo", "ppo", "reinforce_pp", "rloo"]
"""The core's advantage estimator names (``agentlightning.credit``), plus ``ppo`` (GAE with a critic)."""

ADV_ESTIMATORS: dict[str, str] = {
    "grpo": "grpo",
    "ppo": "gae",
    "reinforce_pp": "reinforce_plus_plus",
    "rloo": "rloo",
}
"""Our algorithm name -> verl's ``algorithm.adv_estimator`` (``verl.trainer.ppo.core_algos.AdvantageEstimator``)."""

_OUR_ESTIMATOR = {"grpo": "grpo", "rloo": "rloo", "reinforce_pp": "reinforce_pp", "ppo": "passthrough"}
"""Agent Lightning's advantage estimator per algorithm: what the batch carries before verl's own estimator runs."""


class VerlTrainerConfig(BaseModel):
    """Settings of a verl training run; `to_verl_config` expands them into verl's own config tree.

    Batch sizes count TASKS, as verl's do: a step trains on ``tasks_per_step * n_rollouts_per_task`` samples (more
    in trajectory-split mode, where one rollout can give several samples).

    Attributes:
        model_path: Hugging Face model id or local directory (actor, rollout and, for PPO, critic).
        algorithm: ``grpo`` | ``rloo`` (group baselines, no critic), ``reinforce_pp`` (REINFORCE++, batch-whitened
            returns; verl's ``reinforce_plus_plus``, also accepted under that name), ``ppo`` (GAE with a critic
            model).
        n_rollouts_per_task: Rollouts per task (``actor_rollout_ref.rollout.n``); group estimators need >= 2.
        tasks_per_step: Tasks per training step (``data.train_batch_size``).
        total_steps: Training steps to run.
        lr: Actor learning rate.
        critic_lr: Critic learning rate (``ppo`` only).
        ppo_mini_batch_size: Tasks per optimizer step (verl multiplies by ``n_rollouts_per_task``).
        micro_batch_size_per_gpu: Samples per forward/backward on one GPU (gradient accumulation below it).
        ppo_epochs: Passes over each batch.
        clip_ratio: PPO clip epsilon.
        entropy_coeff: Entropy bonus weight.
        kl_loss_coef: KL-to-reference loss weight; 0 disables the reference model.
        gamma: Discount (GAE, REINFORCE++).
        lam: GAE lambda.
        max_prompt_length: Longest prompt in tokens (longer ones: see ``truncation``).
        max_response_length: Longest response in tokens.
        truncation: ``error`` or ``truncate`` over-long samples (see `to_data_proto`).
        advantages_from: ``verl``: verl's estimator (``compute_advantage``, grouped by task) sets the advantages;
            ``agentlightning``: keep the advantages our credit assignment computed (``ppo`` needs ``verl``: GAE).
        credit_strategy: LightningRL credit strategy spreading a rollout's reward over its transitions
            (``agentlightning.credit``: ``identical``, ``discounted``, ``per_step``...).
        temperature: Sampling temperature the rollout used (the actor scales logits by it).
        lora_rank: LoRA rank; 0 trains all weights.
        lora_alpha: LoRA alpha.
        rollout_tensor_parallel_size: vLLM tensor parallel size per rollout replica.
        gpu_memory_utilization: Share of GPU memory vLLM may take (colocated with the trainer).
        nnodes: Machines in the Ray cluster.
        n_gpus_per_node: GPUs per machine.
        strategy: verl training engine (``fsdp2`` recommended).
        dtype: Compute dtype of the FSDP forward/backward (``mixed_precision.param_dtype``); master weights and
            gradient reduction stay float32.
        attn_implementation: Attention kernel; ``flash_attention_2`` needs flash-attn installed.
        use_remove_padding: Pack sequences without padding (needs ``flash_attention_2``).
        gradient_checkpointing: Recompute activations to save memory.
        rollout_timeout_s: How long to wait for a step's rollouts before training on what finished.
        experiment_name: Name used in verl's logs and checkpoint paths.
        overrides: Extra verl settings as ``{"dotted.key": value}``, applied last (escape hatch; keys must exist).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    model_path: str = Field(min_length=1)
    algorithm: AlgorithmName = "grpo"
    n_rollouts_per_task: int = Field(default=8, ge=1)
    tasks_per_step: int = Field(default=32, ge=1)
    total_steps: int = Field(default=100, ge=1)
    lr: float = Field(default=1e-6, gt=0, le=1.0)
    critic_lr: float = Field(default=1e-5, gt=0, le=1.0)
    ppo_mini_batch_size: int = Field(default=16, ge=1)
    micro_batch_size_per_gpu: int = Field(default=4, ge=1)
    ppo_epochs: int = Field(default=1, ge=1)
    clip_ratio: float = Field(default=0.2, gt=0, lt=1)
    entropy_coeff: float = Field(default=0.0, ge=0)
    kl_loss_coef: float = Field(default=0.0, ge=0)
    gamma: float = Field(default=1.0, gt=0, le=1)
    lam: float = Field(default=1.0, ge=0, le=1)
    max_prompt_length: int = Field(default=2048, ge=1)
    max_response_length: int = Field(default=2048, ge=1)
    truncation: Literal["error", "truncate"] = "truncate"
    advantages_from: Literal["verl", "agentlightning"] = "verl"
    credit_strategy: str = Field(default="identical", min_length=1)
    temperature: float = Field(default=1.0, gt=0)
    lora_rank: int = Field(default=0, ge=0)
    lora_alpha: int = Field(default=16, ge=1)
    rollout_tensor_parallel_size: int = Field(default=1, ge=1)
    gpu_memory_utilization: float = Field(default=0.5, gt=0, le=1)
    nnodes: int = Field(default=1, ge=1)
    n_gpus_per_node: int = Field(default=1, ge=1)
    strategy: Literal["fsdp", "fsdp2"] = "fsdp2"
    dtype: Literal["bfloat16", "float32"] = "bfloat16"
    attn_implementation: Literal["flash_attention_2", "sdpa", "eager"] = "sdpa"
    use_remove_padding: bool = False
    gradient_checkpointing: bool = True
    rollout_timeout_s: float = Field(default=3600.0, gt=0)
    experiment_name: str = Field(default="agentlightning", min_length=1)
    overrides: dict[str, Any] = Field(default_factory=dict)

    @field_validator("algorithm", mode="before")
    @classmethod
    def _one_name(cls, value: object) -> object:
        # verl's spelling of an estimator (reinforce_plus_plus) names the core's one (reinforce_pp)
        return canonical_estimator_name(value) if isinstance(value, str) else value

    @model_validator(mode="after")
    def _check(self) -> VerlTrainerConfig:
        world = self.nnodes * self.n_gpus_per_node
        if is_group_estimator(_OUR_ESTIMATOR[self.algorithm]) and self.n_rollouts_per_task < 2:
            raise ValueError(
                f"algorithm={self.algorithm!r} normalises within a task's group and needs n_rollouts_per_task >= 2 "
                f"(got {self.n_rollouts_per_task})"
            )
        if self.ppo_mini_batch_size > self.tasks_per_step or self.tasks_per_step % self.ppo_mini_batch_size:
            raise ValueError(
                f"tasks_per_step ({self.tasks_per_step}) must be a multiple of ppo_mini_batch_size "
                f"({self.ppo_mini_batch_size})"
            )
        if (self.ppo_mini_batch_size * self.n_rollouts_per_task) % world:
            raise ValueError(
                f"ppo_mini_batch_size * n_rollouts_per_task ({self.ppo_mini_batch_size * self.n_rollouts_per_task}) "
                f"must be divisible by the number of GPUs ({world}) so every data-parallel rank gets equal work"
            )
        if world % self.rollout_tensor_parallel_size:
            raise ValueError(
                f"rollout_tensor_parallel_size ({self.rollout_tensor_parallel_size}) must divide the number of GPUs "
                f"({world})"
            )
        if self.algorithm == "ppo" and self.advantages_from != "verl":
            raise ValueError("algorithm='ppo' computes GAE advantages from the critic: use advantages_from='verl'")
        if self.use_remove_padding and self.attn_implementation != "flash_attention_2":
            raise ValueError("use_remove_padding=True needs attn_implementation='flash_attention_2' (flash-attn)")
        for key in self.overrides:
            if not key or key.startswith(".") or key.endswith("."):
                raise ValueError(f"override key {key!r} must be a dotted path such as 'trainer.save_freq'")
        return self

    @property
    def adv_estimator(self) -> str:
        """verl's ``algorithm.adv_estimator`` for `algorithm`."""
        return ADV_ESTIMATORS[self.algorithm]

    @property
    def use_critic(self) -> bool:
        """Whether the algorithm trains a value model (only ``ppo``)."""
        return self.algorithm == "ppo"

    def loop_config(self, **settings: Any) -> LoopConfig:
        """The `LoopConfig` of `VerlTrainer` (a `VerlEngine`'s `RLLoop`): the loop's share of these, + ``settings``.

        Maps ``total_steps`` → ``iterations``, ``tasks_per_step`` → ``tasks_per_iteration``,
        ``n_rollouts_per_task`` → ``samples_per_task``, ``credit_strategy`` → ``credit``, the algorithm to our
        estimator (``passthrough`` for PPO: verl's GAE sets the advantages), ``temperature`` and
        ``rollout_timeout_s``; the model is published under ``model_path`` (the name vLLM serves it under).
        Tasks are taken in order (``task_order="cycle"``).

        Args:
            settings: Other `LoopConfig` fields (``output_dir``, ``checkpoint_every``, ``resume``, ``proxy``...).

        Raises:
            ValueError: ``settings`` sets a field this config owns, or an invalid `LoopConfig`.
        """
        owned: dict[str, Any] = {
            "iterations": self.total_steps,
            "tasks_per_iteration": self.tasks_per_step,
            "samples_per_task": self.n_rollouts_per_task,
            "credit": self.credit_strategy,
            "estimator": _OUR_ESTIMATOR[self.algorithm],
            "temperature": self.temperature,
            "rollout_timeout_s": self.rollout_timeout_s,
        }
        clash = sorted(set(owned) & set(settings))
        if clash:
            raise ValueError(f"{clash} come from VerlTrainerConfig; set them there, not in loop_config()")
        fields: dict[str, Any] = {"model_name": self.model_path, "task_order": "cycle", **owned, **settings}
        return LoopConfig(**fields)

    def to_verl_config(self) -> DictConfig:
        """verl's full PPO trainer config (``verl/trainer/config/_generated_ppo_trainer.yaml``) with ours applied.

        Returns:
            A resolved ``omegaconf.DictConfig`` that verl's ``omega_conf_to_dataclass`` accepts.

        Raises:
            ImportError: verl is not installed (with the install command).
            KeyError: An ``overrides`` key that does not exist in verl's config.
        """
        try:
            import verl
            from omegaconf import OmegaConf, open_dict
        except ImportError as exc:  # pragma: no cover - only without verl
            raise ImportError("VerlTrainerConfig.to_verl_config needs verl: pip install 'agentlightning-verl'") from exc

        base = Path(verl.__file__).parent / "trainer" / "config" / "_generated_ppo_trainer.yaml"
        cfg = OmegaConf.load(base)
        settings = self._verl_settings()
        for key, value in {**settings, **self.overrides}.items():
            if OmegaConf.select(cfg, key, default="__missing__") == "__missing__" and key not in settings:
                raise KeyError(f"override {key!r} is not a key of verl 0.9.1's PPO trainer config")
            with open_dict(cfg):
                OmegaConf.update(cfg, key, value, merge=False, force_add=True)
        OmegaConf.resolve(cfg)
        return cfg  # pyright: ignore[reportReturnType]

    def _verl_settings(self) -> dict[str, Any]:
        """Our fields as verl config keys (dotted paths into verl's PPO trainer config)."""
        world = self.nnodes * self.n_gpus_per_node
        # FSDP's MixedPrecision param dtype is what the forward/backward run in (verl's default: bf16).
        mixed_precision = {
            "param_dtype": "bf16" if self.dtype == "bfloat16" else "fp32",
            "reduce_dtype": "fp32",
            "buffer_dtype": "fp32",
        }
        settings: dict[str, Any] = {
            "data.train_batch_size": self.tasks_per_step,
            "data.max_prompt_length": self.max_prompt_length,
            "data.max_response_length": self.max_response_length,
            "data.train_files": None,
            "data.val_files": None,
            "algorithm.adv_estimator": self.adv_estimator,
            "algorithm.gamma": self.gamma,
            "algorithm.lam": self.lam,
            "actor_rollout_ref.model.path": self.model_path,
            "actor_rollout_ref.model.use_remove_padding": self.use_remove_padding,
            "actor_rollout_ref.model.enable_gradient_checkpointing": self.gradient_checkpointing,
            "actor_rollout_ref.model.override_config": {"attn_implementation": self.attn_implementation},
            "actor_rollout_ref.model.lora_rank": self.lora_rank,
            "actor_rollout_ref.model.lora_alpha": self.lora_alpha,
            "actor_rollout_ref.actor.strategy": self.strategy,
            "actor_rollout_ref.actor.fsdp_config.strategy": self.strategy,
            "actor_rollout_ref.actor.fsdp_config.mixed_precision": mixed_precision,
            "actor_rollout_ref.actor.optim.lr": self.lr,
            "actor_rollout_ref.actor.optim.total_training_steps": self.total_steps,
            "actor_rollout_ref.actor.ppo_mini_batch_size": self.ppo_mini_batch_size,
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": self.micro_batch_size_per_gpu,
            "actor_rollout_ref.actor.ppo_epochs": self.ppo_epochs,
            "actor_rollout_ref.actor.clip_ratio": self.clip_ratio,
            "actor_rollout_ref.actor.clip_ratio_low": self.clip_ratio,
            "actor_rollout_ref.actor.clip_ratio_high": self.clip_ratio,
            "actor_rollout_ref.actor.entropy_coeff": self.entropy_coeff,
            "actor_rollout_ref.actor.use_kl_loss": self.kl_loss_coef > 0,
            "actor_rollout_ref.actor.kl_loss_coef": self.kl_loss_coef,
            "actor_rollout_ref.rollout.name": "vllm",
            "actor_rollout_ref.rollout.n": self.n_rollouts_per_task,
            "actor_rollout_ref.rollout.temperature": self.temperature,
            "actor_rollout_ref.rollout.tensor_model_parallel_size": self.rollout_tensor_parallel_size,
            "actor_rollout_ref.rollout.gpu_memory_utilization": self.gpu_memory_utilization,
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": self.micro_batch_size_per_gpu,
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": self.micro_batch_size_per_gpu,
            "critic.enable": self.use_critic,
            "critic.optim.lr": self.critic_lr,
            "critic.model.path": self.model_path,
            "critic.model.use_remove_padding": self.use_remove_padding,
            "critic.model.enable_gradient_checkpointing": self.gradient_checkpointing,
            "critic.model.override_config": {"attn_implementation": self.attn_implementation},
            "critic.strategy": self.strategy,
            "critic.fsdp.strategy": self.strategy,
            "critic.fsdp.mixed_precision": mixed_precision,
            "critic.ppo_micro_batch_size_per_gpu": self.micro_batch_size_per_gpu,
            "trainer.nnodes": self.nnodes,
            "trainer.n_gpus_per_node": self.n_gpus_per_node,
            "trainer.total_training_steps": self.total_steps,
            "trainer.experiment_name": self.experiment_name,
            "trainer.project_name": "agentlightning",
            "trainer.logger": ["console"],
        }
        if world == 1:
            settings["actor_rollout_ref.actor.fsdp_config.fsdp_size"] = 1
            settings["critic.fsdp.fsdp_size"] = 1
        return settings
