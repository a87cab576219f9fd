"""The validated, frozen configuration of `TorchTrainer`."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from agentlightning import CreditConfig, LoopConfig, PolicyMap, ProxySettings
from agentlightning.judge import JudgeConfig
from agentlightning_torch.training._policy_settings import PolicySettings
from agentlightning_torch.training._ppo import PPOConfig
from agentlightning_torch.vllm._lora import vllm_lora_args
from agentlightning_torch.vllm._serving import VLLMSettings

__all__ = ["TorchTrainerConfig"]

_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


class TorchTrainerConfig(BaseModel):
    """Everything `TorchTrainer` needs; every field is checked when the config is built.

    Attributes:
        model_dir: A Hugging Face model folder (config, weights, tokenizer with a chat template; e.g.
            ``examples/calc/checkpoint``) or a hub id such as ``Qwen/Qwen2.5-0.5B-Instruct``.
        output_dir: Where metrics (``metrics.jsonl``) and checkpoints go.
        model_name: Name the model is served under (what the agent passes as ``model``).
        tool_parser: Tool-call parser of the served model (``hermes``, ``llama3_json``, ``calc``...); ``None``
            lets the backend pick one from the chat template.
        device: ``cpu``, ``cuda`` or ``cuda:N``; the same code runs on either.
        num_threads: ``torch.set_num_threads`` for the whole process; few threads on a small shared CPU.
        iterations: Most RL iterations to run.
        time_budget_s: Stop starting new iterations once this many seconds of RL have passed (``None``: no limit).
        tasks_per_iteration: Distinct tasks per iteration.
        samples_per_task: Rollouts per task (one GRPO group).
        temperature: Sampling temperature of training rollouts.
        max_tokens: Most tokens per LLM call.
        credit: LightningRL credit strategy (``identical``, ``discounted``, ``per_step`` or a registered name).
        estimator: Advantage estimator (``grpo``, ``rloo``, ``reinforce_pp``, ``passthrough``...).
        transition_mode: ``per_call`` (one sample per LLM call) or ``trajectory`` (merge prefix-extending calls).
        agent_filter: Agent names (or one regex) to train; ``None`` trains every agent.
        drop_equal_groups: Drop groups whose rollouts all earned the same reward (they carry no signal).
        ppo: The policy update settings.
        rollout_timeout_s: How long an iteration waits for its rollouts before training on what finished.
        max_staleness: ``0``: synchronous; ``k > 0``: the next k iterations' rollouts run on the backend's copy of
            the current weights while the policy is updated, samples up to k versions old are trained, corrected by
            truncated importance sampling (``ppo.is_correction`` and ``ppo.is_cap``; see `LoopConfig.max_staleness`).
        checkpoint_every: Save a checkpoint every N iterations (0: only at the end).
        eval_every: With validation tasks, `TorchTrainer.run` evaluates greedily every N iterations (0: never) and
            keeps the best evaluation's checkpoint in ``checkpoint/best`` (see `LoopConfig.eval_every`).
        best_metric: The held-out figure that picks ``checkpoint/best`` (``reward_mean``, ``accuracy``...).
        resume: Continue from the latest checkpoint in ``output_dir`` when there is one (weights or LoRA adapter,
            optimizer state, iteration and model version).
        max_batch_size: Most concurrent generations the local backend batches together.
        batch_wait_ms: The backend starts a batch once no request has arrived for this long.
        max_batch_wait_ms: ...or this long after the batch's first request, whichever comes first.
        seed: Seeds task sampling.
        backend_http: Serve the local backend over HTTP on 127.0.0.1 and have the LLM proxy call it there, instead of
            calling it in-process (the default: same answers and records, without the HTTP machinery's CPU).
        proxy: Where the LLM proxy listens and how agents reach it (loopback by default).
        backend: ``local``: the embedded `LocalBackend`; ``vllm``: a real vLLM server (launched for ``model_dir``, or
            the one at ``vllm.url``), each weight sync verified by log-probs (see `VLLMSettings`).
        vllm: How vLLM runs and syncs (``backend="vllm"`` only).
        policies: One LoRA adapter per policy on one base model (`agentlightning.PolicyMap`: agent names or
            patterns -> policy; ``frozen`` is the untrained base). Each trained policy gets its own adapter (rank and
            targets from ``ppo.lora``, or `LoRASettings`' defaults), its own optimizer and its own samples; the
            backend serves every adapter beside the base (`LocalBackend`, or vLLM's multi-LoRA serving, each adapter
            loaded in place after its update and verified by log-probs). ``None``: one shared policy.
        policy_settings: Per trained policy, a LoRA adapter or full weights of its own, its own learning rate, KL
            weight and LoRA shape (`PolicySettings`; a LoRA policy's learning rate defaults to 10x ``ppo.lr``, its
            shape to ``ppo.lora``; a full one's to ``ppo.lr``; full-weight policies are served by the local backend
            in-process, each by a backend of its own).
        judge: Rewards from an LLM judge that reads each rollout's trace (`agentlightning.judge.JudgeConfig`;
            `LoopConfig.judge`).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    model_dir: Path | str
    output_dir: Path = Path("runs/torch-trainer")
    model_name: str = Field(default="local", min_length=1)
    tool_parser: str | None = None
    device: str = "cpu"
    num_threads: int = Field(default=1, ge=1, le=256)
    iterations: int = Field(default=200, ge=1)
    time_budget_s: float | None = Field(default=None, gt=0)
    tasks_per_iteration: int = Field(default=16, ge=1)
    samples_per_task: int = Field(default=8, ge=1)
    temperature: float = Field(default=1.0, ge=0)
    max_tokens: int = Field(default=24, ge=1)
    credit: str = "identical"
    estimator: str = "grpo"
    transition_mode: Literal["per_call", "trajectory"] = "per_call"
    agent_filter: tuple[str, ...] | str | None = None
    drop_equal_groups: bool = True
    ppo: PPOConfig = Field(default_factory=PPOConfig)
    rollout_timeout_s: float = Field(default=120.0, gt=0)
    max_staleness: int = Field(default=0, ge=0)
    checkpoint_every: int = Field(default=25, ge=0)
    eval_every: int = Field(default=0, ge=0)
    best_metric: str = Field(default="reward_mean", min_length=1)
    resume: bool = False
    max_batch_size: int = Field(default=256, ge=1)
    batch_wait_ms: float = Field(default=5.0, ge=0)
    max_batch_wait_ms: float = Field(default=50.0, ge=0)
    seed: int = 0
    backend_http: bool = False
    proxy: ProxySettings = Field(default_factory=ProxySettings)
    backend: Literal["local", "vllm"] = "local"
    vllm: VLLMSettings = Field(default_factory=VLLMSettings)
    policies: PolicyMap | None = None
    policy_settings: dict[str, PolicySettings] = Field(default_factory=dict[str, PolicySettings])
    judge: JudgeConfig | None = None

    def update_settings(self) -> PPOConfig:
        """``ppo`` with ``is_correction`` decided: on when samples may be stale (``max_staleness > 0``) unless set."""
        if self.ppo.is_correction is not None:
            return self.ppo
        return self.ppo.model_copy(update={"is_correction": self.max_staleness > 0})

    def loop_config(self) -> LoopConfig:
        """The `LoopConfig` of the trainer's `RLLoop` (the loop's share of these settings)."""
        return LoopConfig(
            output_dir=self.output_dir,
            model_name=self.model_name,
            iterations=self.iterations,
            time_budget_s=self.time_budget_s,
            tasks_per_iteration=self.tasks_per_iteration,
            samples_per_task=self.samples_per_task,
            temperature=self.temperature,
            max_tokens=self.max_tokens,
            credit=self.credit,
            estimator=self.estimator,
            credit_config=CreditConfig(drop_equal_groups=self.drop_equal_groups),
            transition_mode=self.transition_mode,
            agent_filter=self.agent_filter,
            rollout_timeout_s=self.rollout_timeout_s,
            max_staleness=self.max_staleness,
            checkpoint_every=self.checkpoint_every,
            eval_every=self.eval_every,
            best_metric=self.best_metric,
            resume=self.resume,
            seed=self.seed,
            proxy=self.proxy,
            policies=self.policies,
            judge=self.judge,
        )

    @field_validator("model_dir")
    @classmethod
    def _model_dir_exists(cls, value: Path | str) -> Path | str:
        path = Path(value)
        if path.is_dir():
            return path
        text = str(value)
        if _HUB_ID.fullmatch(text) and not text.startswith((".", "~")):
            return text  # a hub id, downloaded by transformers when the trainer loads it
        raise ValueError(f"model folder {text!r} does not exist (expected a Hugging Face model folder or hub id)")

    @field_validator("device")
    @classmethod
    def _known_device(cls, value: str) -> str:
        if value != "cpu" and not value.startswith("cuda"):
            raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {value!r}")
        return value

    @model_validator(mode="after")
    def _policies_train_lora(self) -> TorchTrainerConfig:
        if self.policies is None:
            if self.policy_settings:
                raise ValueError("policy_settings need policies (a PolicyMap): one shared policy trains with ppo")
            return self
        trained = self.policies.trained
        if not trained:
            raise ValueError("policies map every agent to 'frozen': nothing would train (map an agent to an adapter)")
        unknown = sorted(set(self.policy_settings) - set(trained))
        if unknown:
            raise ValueError(f"policy_settings name policies that are not trained: {unknown} (trained: {trained})")
        settings = {name: self.policy_settings.get(name, PolicySettings()) for name in trained}
        full = [name for name in trained if settings[name].weights == "full"]
        if full and self.backend == "vllm":
            raise ValueError(f"vLLM serves LoRA policies only: policies {full} have full weights (use backend='local')")
        if full and self.backend_http:
            raise ValueError(f"full-weight policies {full} are served in-process only: unset backend_http")
        if self.backend == "vllm":  # vLLM serves every adapter at once, up to the ranks it knows
            vllm_lora_args(len(trained), max(settings[name].lora_settings(self.ppo).r for name in trained))
        return self
