"""`VerlEngine`: verl (Ray, FSDP, vLLM or a local stand-in) as an engine behind Agent Lightning's `RLLoop`.

The RL step is core's `agentlightning.RLLoop` (rollouts pinned to the served version → wait, cancel late ones →
pause the proxy, flush → transitions + LightningRL credit → ``update`` → ``sync_weights(version + 1)`` → publish →
resume); `VerlTrainer` is that loop with a `VerlEngine` built from one `VerlTrainerConfig`. The engine: ``update``
converts the `TrainingBatch` with `to_data_proto`, recomputes ``old_log_probs`` (and entropy) with verl's actor,
(PPO) values with the critic, advantages with verl's ``compute_advantage``, then updates critic and actor;
``sync_weights`` pushes the new weights into the rollout servers through the runtime's `Serving` (vLLM's checkpoint
engine, a local server, or nothing); ``save_state``/``load_state`` are verl's own actor/critic checkpoints.

The verl side sits behind the small `VerlRuntime` protocol: `RayVerlRuntime` (Ray worker groups on GPUs or on the
CPU platform) or `LocalVerlRuntime` (one in-process actor, no serving).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from agentlightning import Engine, IterationReport, LoopConfig, RLLoop, TrainingBatch
from agentlightning.loop import Serving
from agentlightning_verl._config import VerlTrainerConfig
from agentlightning_verl._convert import to_data_proto

if TYPE_CHECKING:
    from verl import DataProto


__all__ = ["VerlEngine", "VerlRuntime", "VerlTrainer"]

logger = logging.getLogger(__name__)


class VerlRuntime(Protocol):
    """What `VerlEngine` needs from verl; `RayVerlRuntime` is the real one, `LocalVerlRuntime` a one-process one."""

    @property
    def serving(self) -> Serving:
        """The inference servers the actor's weights go to (`Serving`; `NoServing` where nothing serves)."""
        ...

    def compute_log_prob(self, data: DataProto) -> tuple[Any, Any]:
        """Current policy log-probs and entropies ``(B, R)`` of the responses."""
        ...

    def compute_values(self, data: DataProto) -> Any:
        """Critic values ``(B, R)`` (PPO only)."""
        ...

    def update_critic(self, data: DataProto) -> dict[str, float]:
        """One critic update; metrics prefixed ``critic/``."""
        ...

    def update_actor(self, data: DataProto) -> dict[str, float]:
        """One actor update; metrics prefixed ``actor/``."""
        ...

    def save_checkpoint(self, directory: Path, step: int) -> None:
        """verl's checkpoints of actor (and critic) into ``directory``."""
        ...

    def load_checkpoint(self, directory: Path) -> None:
        """Restore what `save_checkpoint` wrote."""
        ...


class VerlEngine(Engine):
    """Train the model behind the LLM proxy with verl (GRPO, RLOO, REINFORCE++ or PPO): an `Engine` for `RLLoop`.

    Train it with ``agentlightning.RLLoop(config.loop_config(), VerlEngine(config))``, or build both at once with
    `VerlTrainer`.

    Args:
        config: Validated settings (`VerlTrainerConfig`).
        runtime: A `VerlRuntime`; by default a `RayVerlRuntime` (GPUs, vLLM) is built on first use. A runtime passed
            in stays the caller's: stopping the loop does not shut it down.
    """

    serves_during_update = False
    """The colocated vLLM servers sleep while verl updates (they give the accelerator to the actor) and verl's PPO
    anchor is the actor's own recomputed log-probs, so any ``LoopConfig.max_staleness`` above 0 is refused."""

    max_staleness_supported = 0
    """No off-policy samples until verl's own async rollout is wired in (a k > 0 is refused in one line)."""

    policies_unsupported = (
        "verl trains one actor model (no per-agent LoRA adapters yet; see the trainer-verl README, 'Several policies')"
    )
    """``LoopConfig.policies`` is refused: see the README for what per-policy adapters would take in verl."""

    def __init__(self, config: VerlTrainerConfig, *, runtime: VerlRuntime | None = None) -> None:
        self.config = config
        self._runtime = runtime
        self.steps = 0
        """verl updates this engine applied (verl's ``global_step`` bookkeeping in its checkpoints)."""

    @property
    def runtime(self) -> VerlRuntime:
        """The verl runtime, built on first use (`RayVerlRuntime` on GPUs unless one was given)."""
        if self._runtime is None:
            from agentlightning_verl._ray_runtime import RayVerlRuntime

            self._runtime = RayVerlRuntime(self.config)
        return self._runtime

    @property
    def serving(self) -> Serving:
        """The runtime's inference servers (`VerlRuntime.serving`): every server step below is this object's."""
        return self.runtime.serving

    async def start_servers(self, model_version: int) -> list[str]:
        """Serve the actor's current weights as ``model_version``; returns the rollout servers' base URLs."""
        return await self.serving.start(model_version)

    async def wait_servers_idle(self, timeout_s: float) -> int:
        """Wait (at most ``timeout_s``) until the rollout servers generate nothing (`Serving.wait_idle`); returns the
        requests left."""
        return await self.serving.wait_idle(timeout_s)

    async def abort_servers(self, timeout_s: float) -> int:
        """Stop what the rollout servers still generate (`Serving.abort`: vLLM's replicas through verl's abort),
        waiting at most ``timeout_s``; returns the requests left."""
        return await self.serving.abort(timeout_s)

    async def stop_servers(self) -> None:
        """`Serving.stop` (the servers verl's workers host go with the runtime: ``RayVerlRuntime.shutdown``)."""
        await self.serving.stop()

    def update(self, batch: TrainingBatch) -> dict[str, float]:
        """One verl step on ``batch``: old log-probs, (values), advantages, (critic), actor. Weights are not synced.

        Call it with no rollout in flight (the proxy paused): the rollout servers are released first
        (`Serving.release`: vLLM sleeps until `sync_weights`). Runs in a worker thread when called from `run`.

        Raises:
            ValueError: An empty batch or a sample that does not fit (see `to_data_proto`).
        """
        import torch
        from verl.trainer.ppo.core_algos import AdvantageEstimator, agg_loss
        from verl.trainer.ppo.ray_trainer import compute_advantage
        from verl.utils.config import omega_conf_to_dataclass

        cfg = self.config
        runtime = self.runtime
        data = to_data_proto(
            batch,
            max_prompt_length=cfg.max_prompt_length,
            max_response_length=cfg.max_response_length,
            # verl strips padding (left_right_2_no_padding) before the model sees it, so the id is irrelevant here.
            pad_token_id=0,
            truncation=cfg.truncation,
            include_old_log_probs=False,
            include_advantages=cfg.advantages_from == "agentlightning",
            meta_info={"temperature": cfg.temperature},
        )
        self.serving.release()  # in the update's worker thread: vLLM sleeps until `sync_weights`
        verl_cfg = cfg.to_verl_config()
        mask = data.batch["response_mask"].float()
        # verl's default ("decoupled") mode: the PPO anchor is the trainer's own policy, recomputed here.
        log_probs, entropy = runtime.compute_log_prob(data)
        data.batch["old_log_probs"] = torch.as_tensor(log_probs).float().cpu() * mask
        metrics: dict[str, float] = {f"batch/{k}": float(v) for k, v in batch.metrics.items()}
        metrics["actor/entropy"] = float(
            agg_loss(
                loss_mat=torch.as_tensor(entropy).float().cpu(),
                loss_mask=mask,
                loss_agg_mode=str(verl_cfg.actor_rollout_ref.actor.loss_agg_mode),
            )
        )
        if "rollout_log_probs" in data.batch.keys():  # noqa: SIM118 - TensorDict refuses `in`
            # the server's log-probs vs the actor's on the same tokens: ~0 when it served the actor's weights
            gap = (data.batch["rollout_log_probs"].float() - data.batch["old_log_probs"]).abs() * mask
            metrics["rollout/logprob_diff_max"] = float(gap.max())
            metrics["rollout/logprob_diff_mean"] = float(gap.sum() / mask.sum().clamp(min=1))
        if cfg.use_critic:
            data.batch["values"] = torch.as_tensor(runtime.compute_values(data)).float().cpu()
        if cfg.advantages_from == "verl":
            data = compute_advantage(
                data,
                adv_estimator=AdvantageEstimator(cfg.adv_estimator),
                gamma=cfg.gamma,
                lam=cfg.lam,
                num_repeat=cfg.n_rollouts_per_task,
                config=omega_conf_to_dataclass(verl_cfg.algorithm),
            )
        metrics["batch/samples"] = float(len(data))
        metrics["batch/tokens"] = float(data.batch["attention_mask"].sum())
        metrics["batch/response_tokens"] = float(mask.sum())
        metrics["batch/reward_mean"] = float(data.batch["token_level_scores"].sum(-1).mean())
        if cfg.use_critic:
            metrics.update(runtime.update_critic(data))
        metrics.update(runtime.update_actor(data))
        self.steps += 1
        return metrics

    async def sync_weights(self, version: int) -> None:
        """Make the rollout servers serve the updated weights, as model ``version`` (`Serving.sync`)."""
        await self.serving.sync(version)

    def iteration_metrics(self) -> dict[str, float]:
        """Weight-sync timings since the previous call (`Serving.metrics`)."""
        return self.serving.metrics()

    def save_state(self, directory: Path) -> None:
        """verl's checkpoints of actor and critic (model, optimizer, scheduler, RNG) into ``directory/verl``."""
        self.runtime.save_checkpoint(directory / "verl", self.steps)

    def load_state(self, directory: Path) -> None:
        """Restore what `save_state` wrote into the running workers."""
        self.runtime.load_checkpoint(directory / "verl")


class VerlTrainer(RLLoop[VerlEngine]):
    """The `RLLoop` of a `VerlEngine`, both built from one `VerlTrainerConfig`.

    Everything loop-side (`run`, `train_iteration`, `evaluate`, `start`, `stop`, `history`, checkpoints, the LLM
    proxy) is `RLLoop`'s own; everything verl-side is on ``trainer.engine`` (``runtime``, ``update``...). `stop`
    stops the LLM proxy; the verl runtime keeps running.

    Args:
        config: Validated settings (`VerlTrainerConfig`); ``config.total_steps`` is the loop's ``iterations``.
        runtime: A `VerlRuntime` for the engine (default: a `RayVerlRuntime`, built on first use).
        loop: The loop's settings; default ``config.loop_config()`` (pass ``config.loop_config(output_dir=...,
            checkpoint_every=..., resume=True)`` to change them).
        on_iteration: Called with every training iteration's report.

    Raises:
        ValueError: ``loop.max_staleness`` is above 0 (verl's engine does not serve during an update).
    """

    def __init__(
        self,
        config: VerlTrainerConfig,
        *,
        runtime: VerlRuntime | None = None,
        loop: LoopConfig | None = None,
        on_iteration: Callable[[IterationReport], None] | None = None,
    ) -> None:
        super().__init__(loop or config.loop_config(), VerlEngine(config, runtime=runtime), on_iteration=on_iteration)
