"""The validated, frozen settings of `RLLoop` (shared by every engine)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from agentlightning._netauth import check_bind_token, is_wildcard
from agentlightning._policies import PolicyMap
from agentlightning.credit import CreditConfig, is_group_estimator
from agentlightning.judge import JudgeConfig

__all__ = ["LoopConfig", "ProxySettings"]


class ProxySettings(BaseModel):
    """Where the loop's LLM proxy listens and how agents reach it.

    Attributes:
        host: Interface to bind (``0.0.0.0`` for runners on other machines; then ``token`` is required).
        port: Port to bind (0: a free one).
        advertised_url: The URL published to agents in `LLMResource.endpoint` when it differs from
            ``http://host:port`` (a bind address of ``0.0.0.0``, NAT, a load balancer); ``None``: ``http://host:port``.
        token: Bearer token agents must send on every route (published to them as `LLMResource.api_key`);
            mandatory, 16+ characters, off loopback; ``None`` on loopback: the loop makes one (a web page in the
            user's browser can reach a loopback port too).
        admin_token: Bearer token of the proxy's ``/admin/*`` routes (pause, backends); without one they are
            closed. The loop itself controls the proxy in-process and needs none.
        record: ``background`` batches the proxy's record writes (the loop flushes them before it reads them);
            ``sync`` writes each before answering.
        pause_timeout_s: Longest wait for in-flight requests when the proxy is paused for an update.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(default=0, ge=0, le=65535)
    advertised_url: str | None = None
    token: str | None = Field(default=None, min_length=1)
    admin_token: str | None = Field(default=None, min_length=1)
    record: Literal["sync", "background"] = "background"
    pause_timeout_s: float = Field(default=300.0, gt=0)

    @field_validator("advertised_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError(f"advertised_url must start with http:// or https://, got {value!r}")
        return value.rstrip("/") if value is not None else None

    def check_exposure(self) -> None:
        """Refuse to bind off loopback without a long enough token, or every interface without an advertised URL.

        Raises:
            ValueError: ``host`` is not a loopback address and ``token`` is missing or shorter than 16
                characters, or ``host`` is a wildcard (``0.0.0.0``) and ``advertised_url`` is not set.
        """
        check_bind_token(self.host, self.token, "the LLM proxy", "ProxySettings.token (--proxy-token)")
        if self.admin_token is not None:
            check_bind_token(self.host, self.admin_token, "the LLM proxy's admin routes", "a longer admin token")
        if is_wildcard(self.host) and self.advertised_url is None:
            raise ValueError(
                f"the LLM proxy binds {self.host!r} (every interface): set advertised_url (--advertise-url) to the "
                "address runners reach it at"
            )


class LoopConfig(BaseModel):
    """Everything `RLLoop` needs besides its engine; every field is checked when the config is built.

    Attributes:
        output_dir: Where ``metrics.jsonl`` and ``checkpoint/`` go.
        model_name: Name the policy is published under (the ``model`` agents pass).
        iterations: Most RL iterations to run.
        time_budget_s: Stop starting new iterations once this many seconds of RL have passed (``None``: no limit).
        tasks_per_iteration: Distinct tasks per iteration (one group each).
        samples_per_task: Rollouts per task (the group size of GRPO-style estimators).
        task_order: ``random`` draws tasks with replacement (seeded); ``cycle`` walks the task list in order.
        temperature: Sampling temperature published for training rollouts (evaluation is greedy: 0).
        max_tokens: Most tokens per LLM call published to agents (``None``: the agent's or backend's default).
        credit: LightningRL credit strategy (``identical``, ``discounted``, ``per_step`` or a registered name).
        estimator: Advantage estimator (``grpo``, ``rloo``, ``reinforce_pp``, ``passthrough``...).
        credit_config: Credit settings (discount, dropping equal-reward groups...).
        transition_mode: ``per_call`` (one sample per LLM call) or ``trajectory`` (merge prefix-extending calls).
        agent_filter: Agent names (or one regex) to train; ``None`` trains every agent.
        rollout_timeout_s: How long an iteration waits for its rollouts; later ones are cancelled (they would
            train on a stale policy) and the iteration trains on what finished.
        max_staleness: The staleness bound k: how many versions older than the weights being updated a trained
            sample may be. ``0``: synchronous (every sample comes from the weights being updated). ``k > 0``:
            rollouts keep being generated while the engine updates: as soon as an iteration's rollouts are
            collected, those of the next k iterations are enqueued (the ones not enqueued yet), so the runners work
            on them while the batch is built and the engine updates (the proxy is paused only around the weight
            sync, and holds the calls that arrive meanwhile until it resumes). A batch enqueued at version v is
            trained by version v + k at most: no rollout is started whose samples would be more than k versions
            old when trained (admission control), and a sample older than that at training time is dropped and
            counted (``samples_dropped_stale``), as is one of unknown version or without behaviour log-probs
            (needed for the engine's importance correction). Needs an engine that serves while it updates
            (`Engine.serves_during_update`).
        max_idle_iterations: Raise after this many consecutive iterations in which no rollout finished (runners
            down?) instead of spinning forever.
        eval_every: With validation tasks, evaluate greedily every N iterations (0: never during `run`); each such
            evaluation that beats every earlier one saves the policy to ``checkpoint/best`` (see `best_metric`).
        best_metric: The held-out figure that picks ``checkpoint/best``: ``reward_mean``, or a key of the evaluation
            report's ``metrics`` (``accuracy``: the fraction of held-out rollouts reaching ``success_reward``).
        checkpoint_every: Save a checkpoint every N iterations (0: only at the end of `run`).
        resume: Continue from the checkpoint in ``output_dir`` when there is one (iteration, model version and
            the engine's state).
        seed: Seeds task sampling.
        success_reward: A finished rollout whose final reward reaches this counts as a success (the reports'
            ``accuracy``).
        proxy: Where the LLM proxy listens and how agents reach it.
        policies: Train several policies in one run (one LoRA adapter per agent, say): which agent uses which
            policy (`agentlightning.PolicyMap`). The proxy routes each call to its agent's policy and records it;
            samples carry it, and the engine trains each policy on its own samples. ``None``: one policy.
        judge: Rewards from an LLM judge that reads each finished rollout's trace (`agentlightning.judge`): group
            scores become final rewards, step scores intermediate rewards (use ``credit="per_step"``), both read
            before credit assignment; evaluations keep the checker's reward. ``None``: the agent's own rewards.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    output_dir: Path = Path("runs/rl")
    model_name: str = Field(default="policy", min_length=1)
    iterations: int = Field(default=200, ge=1)
    time_budget_s: float | None = Field(default=None, gt=0)
    tasks_per_iteration: int = Field(default=16, ge=1)
    samples_per_task: int = Field(default=8, ge=1)
    task_order: Literal["random", "cycle"] = "random"
    temperature: float = Field(default=1.0, ge=0)
    max_tokens: int | None = Field(default=None, ge=1)
    credit: str = "identical"
    estimator: str = "grpo"
    credit_config: CreditConfig = Field(default_factory=CreditConfig)
    transition_mode: Literal["per_call", "trajectory"] = "per_call"
    agent_filter: tuple[str, ...] | str | None = None
    rollout_timeout_s: float = Field(default=120.0, gt=0)
    max_staleness: int = Field(default=0, ge=0)
    max_idle_iterations: int = Field(default=3, ge=1)
    eval_every: int = Field(default=0, ge=0)
    best_metric: str = Field(default="reward_mean", min_length=1)
    checkpoint_every: int = Field(default=25, ge=0)
    resume: bool = False
    seed: int = 0
    success_reward: float = 1.0
    proxy: ProxySettings = Field(default_factory=ProxySettings)
    policies: PolicyMap | None = None
    judge: JudgeConfig | None = None

    @model_validator(mode="after")
    def _step_scores_need_per_step(self) -> LoopConfig:
        if self.judge is not None and self.judge.judges_steps and self.credit in ("identical", "discounted"):
            raise ValueError(
                f"the judge scores each step (mode={self.judge.mode!r}), and credit={self.credit!r} ignores step "
                "rewards: use credit='per_step'"
            )
        return self

    @model_validator(mode="after")
    def _group_estimator_needs_groups(self) -> LoopConfig:
        if self.samples_per_task == 1 and is_group_estimator(self.estimator):
            raise ValueError(
                f"samples_per_task=1 with estimator={self.estimator!r} gives every sample advantage 0 "
                f"({self.estimator} compares the rollouts of one task); use samples_per_task >= 2 or "
                "estimator='reinforce_pp'"
            )
        return self
