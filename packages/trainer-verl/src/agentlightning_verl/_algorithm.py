"""`VerlAlgorithm`: Agent Lightning's training step on verl's workers (Ray, FSDP, vLLM or a local stand-in).

The class is an RL *engine* (``start_servers`` / ``update`` / ``sync_weights`` / ``save_state`` / ``load_state``):
``update`` converts a `TrainingBatch` with `to_data_proto`, recomputes ``old_log_probs`` (and entropy) with the
actor, (PPO) values with the critic, advantages with verl's ``compute_advantage``, then updates critic and actor;
``sync_weights`` pushes the new weights into the rollout servers through `RolloutServing` (vLLM's checkpoint engine
or a local server). `run` drives those methods in Agent Lightning's loop: enqueue ``tasks_per_step`` groups of
``n_rollouts_per_task`` rollouts pinned to the published model version → wait (late rollouts are cancelled) → pause
the proxy, flush its records → transitions + LightningRL credit → ``update`` → ``sync_weights(version + 1)`` →
publish → resume the proxy with the new version.

The verl side sits behind the small `VerlBackend` protocol: `RayVerlBackend` (Ray worker groups on GPUs or on the
CPU platform) or `LocalVerlBackend` (one in-process actor, no serving).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from agentlightning import LLMResource, Resources, TrainingBatch, new_id
from agentlightning.algorithm import Algorithm
from agentlightning.store import LightningStore, RolloutRequest
from agentlightning_verl._config import VerlTrainerConfig
from agentlightning_verl._convert import to_data_proto

if TYPE_CHECKING:
    from verl import DataProto

    from agentlightning.proxy import LLMProxy

__all__ = ["CHECKPOINT_STATE_FILE", "VerlAlgorithm", "VerlBackend"]

logger = logging.getLogger(__name__)

CHECKPOINT_STATE_FILE = "agentlightning_state.json"
"""The loop's part of a checkpoint (step, model version) next to verl's ``verl/actor`` and ``verl/critic``."""

_OUR_ESTIMATOR = {"grpo": "grpo", "rloo": "rloo", "reinforce_plus_plus": "reinforce_pp", "ppo": "passthrough"}


class VerlBackend(Protocol):
    """What `VerlAlgorithm` needs from verl; `RayVerlBackend` is the real one, `LocalVerlBackend` a one-process one."""

    def rollout_addresses(self) -> list[str]:
        """OpenAI-compatible base URLs of the inference servers (the LLM proxy's backends)."""
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

    async def release_rollout(self) -> None:
        """Before an update: let the inference servers give up the accelerator (vLLM sleeps)."""
        ...

    async def sync_weights(self, version: int) -> dict[str, float]:
        """Serve the actor's weights as model ``version`` from now on; returns timing metrics."""
        ...

    def save_checkpoint(self, directory: Path, step: int) -> None:
        """verl's checkpoints of actor (and critic) into ``directory``."""
        ...

    def load_checkpoint(self, directory: Path) -> None:
        """Restore what `save_checkpoint` wrote."""
        ...


class VerlAlgorithm(Algorithm):
    """Train the model behind the LLM proxy with verl (GRPO, RLOO, REINFORCE++ or PPO).

    Args:
        config: Validated settings (`VerlTrainerConfig`).
        proxy: The `LLMProxy` agents call; `run` points it at the rollout servers and pauses it while weights
            change. ``None`` if the caller manages serving itself.
        backend: A `VerlBackend`; by default a `RayVerlBackend` (GPUs, vLLM) is built on first use.
        served_model: Model name published in the `LLMResource` (defaults to ``config.model_path``).
        checkpoint_dir: Where `run` saves checkpoints (``None``: never).
        checkpoint_every: Save after every N steps (0: only at the end of `run`).
        resume: `run` continues from the checkpoint in ``checkpoint_dir`` when there is one.
    """

    def __init__(
        self,
        config: VerlTrainerConfig,
        *,
        proxy: LLMProxy | None = None,
        backend: VerlBackend | None = None,
        served_model: str | None = None,
        checkpoint_dir: str | Path | None = None,
        checkpoint_every: int = 0,
        resume: bool = False,
    ) -> None:
        if checkpoint_every < 0:
            raise ValueError(f"checkpoint_every must be >= 0, got {checkpoint_every}")
        if resume and checkpoint_dir is None:
            raise ValueError("resume=True needs a checkpoint_dir to resume from")
        self.config = config
        self.proxy = proxy
        self._backend = backend
        self.served_model = served_model or config.model_path
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir is not None else None
        self.checkpoint_every = checkpoint_every
        self.resume = resume
        self.step = 0
        self.model_version = 0
        self.updates = 0
        self.history: list[dict[str, float]] = []
        self._sync_metrics: dict[str, float] = {}

    @property
    def backend(self) -> VerlBackend:
        """The verl backend, built on first use (`RayVerlBackend` on GPUs unless one was given)."""
        if self._backend is None:
            from agentlightning_verl._ray_backend import RayVerlBackend

            self._backend = RayVerlBackend(self.config)
        return self._backend

    # ----- the engine ------------------------------------------------------------------------------------------

    async def start_servers(self, model_version: int) -> list[str]:
        """Serve the actor's current weights as ``model_version``; returns the rollout servers' base URLs."""
        backend = self.backend
        self._sync_metrics.update(await backend.sync_weights(model_version))
        return backend.rollout_addresses()

    def update(self, batch: TrainingBatch) -> dict[str, float]:
        """One verl step on ``batch``: old log-probs, (values), advantages, (critic), actor. Weights are not synced.

        Call it with no rollout in flight (the proxy paused): the rollout servers are released first (vLLM sleeps
        until `sync_weights`). Runs in a worker thread when called from `run`.

        Raises:
            ValueError: An empty batch or a sample that does not fit (see `to_data_proto`).
        """
        import torch
        from verl.trainer.ppo.core_algos import AdvantageEstimator, agg_loss
        from verl.trainer.ppo.ray_trainer import compute_advantage
        from verl.utils.config import omega_conf_to_dataclass

        cfg = self.config
        backend = self.backend
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
        asyncio.run(backend.release_rollout())
        verl_cfg = cfg.to_verl_config()
        mask = data.batch["response_mask"].float()
        # verl's default ("decoupled") mode: the PPO anchor is the trainer's own policy, recomputed here.
        log_probs, entropy = backend.compute_log_prob(data)
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
            data.batch["values"] = torch.as_tensor(backend.compute_values(data)).float().cpu()
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
            metrics.update(backend.update_critic(data))
        metrics.update(backend.update_actor(data))
        self.updates += 1
        return metrics

    async def sync_weights(self, version: int) -> None:
        """Make the rollout servers serve the updated weights, as model ``version`` (`RolloutServing`)."""
        self._sync_metrics.update(await self.backend.sync_weights(version))

    def iteration_metrics(self) -> dict[str, float]:
        """Weight-sync timings since the previous call."""
        metrics, self._sync_metrics = self._sync_metrics, {}
        return metrics

    def save_state(self, directory: Path) -> None:
        """verl's checkpoints of actor and critic (model, optimizer, scheduler, RNG) into ``directory/verl``."""
        self.backend.save_checkpoint(directory / "verl", self.updates)

    def load_state(self, directory: Path) -> None:
        """Restore what `save_state` wrote into the running workers."""
        self.backend.load_checkpoint(directory / "verl")

    # ----- the loop (Agent Lightning's RL step) ----------------------------------------------------------------

    def _task_batches(self, tasks: Sequence[Any]) -> itertools.cycle[list[Any]]:
        per = self.config.tasks_per_step
        chunks = [list(tasks[i : i + per]) for i in range(0, len(tasks), per)]
        return itertools.cycle([c for c in chunks if len(c) == per] or chunks)

    async def run(
        self, store: LightningStore, train_tasks: Sequence[Any], val_tasks: Sequence[Any] | None = None
    ) -> None:
        """Train until ``config.total_steps`` steps are done, on ``train_tasks`` (cycled); ``val_tasks`` unused.

        Raises:
            ValueError: ``train_tasks`` is empty.
            ImportError: The GPU stack is missing (see `GPU_INSTALL_HINT`).
            RuntimeError: A step in which no rollout succeeded.
        """
        from agentlightning import build_batch_from_store

        if not train_tasks:
            raise ValueError("VerlAlgorithm.run needs at least one training task")
        cfg = self.config
        if self.resume:
            self._restore()
        addresses = await self.start_servers(self.model_version)
        if self.proxy is not None:
            self.proxy.set_backends(addresses)
            self.proxy.resume(model_version=self.model_version)
        resources = await self._publish(store)
        batches = self._task_batches(train_tasks)
        for _ in range(self.step):  # a resumed run continues with the tasks it would have had
            next(batches)
        while self.step < cfg.total_steps:
            t0 = time.monotonic()
            tasks = next(batches)
            requests = [
                RolloutRequest(
                    input=task,
                    mode="train",
                    group_id=f"step{self.step}-task{i}",
                    resources_id=resources.resources_id,
                )
                for i, task in enumerate(tasks)
                for _ in range(cfg.n_rollouts_per_task)
            ]
            rollouts = await store.enqueue_rollouts(requests)
            ids = [r.rollout_id for r in rollouts]
            done = await store.wait_for_rollouts(ids, timeout=cfg.rollout_timeout_s)
            ok = [r.rollout_id for r in done if r.status == "succeeded"]
            for late in await store.query_rollouts(status=["queuing", "running"], rollout_ids=ids):
                await store.cancel_rollout(late.rollout_id)  # it would train on a stale policy
            if not ok:
                raise RuntimeError(f"step {self.step}: no rollout succeeded; check the runners and the proxy")
            if len(ok) < len(ids):
                logger.warning("step %d: %d of %d rollouts succeeded in time", self.step, len(ok), len(ids))
            t_rollouts = time.monotonic()
            if self.proxy is not None:
                await self.proxy.pause(timeout=cfg.rollout_timeout_s)
            try:
                if self.proxy is not None:
                    await self.proxy.flush()
                batch = await build_batch_from_store(
                    store, ok, credit=cfg.credit_strategy, estimator=_OUR_ESTIMATOR[cfg.algorithm]
                )
                if not batch.samples:
                    raise RuntimeError(
                        f"step {self.step}: {len(ok)} rollouts gave no training sample (batch metrics: "
                        f"{batch.metrics}); are the agent's LLM calls traced and going through the proxy?"
                    )
                metrics = await asyncio.to_thread(self.update, batch)
                t_update = time.monotonic()
                await self.sync_weights(self.model_version + 1)
                self.model_version += 1
                resources = await self._publish(store)
            finally:
                if self.proxy is not None:
                    self.proxy.resume(model_version=self.model_version)
            self.step += 1
            metrics.update(self.iteration_metrics())
            metrics.update(
                {
                    "step": float(self.step),
                    "model_version": float(self.model_version),
                    "time/rollouts_s": t_rollouts - t0,
                    "time/update_s": t_update - t_rollouts,
                    "time/step_s": time.monotonic() - t0,
                }
            )
            self.history.append(metrics)
            logger.info(
                "step %d: reward %.4f, pg_loss %.4f, entropy %.4f, grad_norm %.4f",
                self.step,
                metrics.get("batch/reward_mean", math.nan),
                metrics.get("actor/pg_loss", math.nan),
                metrics.get("actor/entropy", math.nan),
                metrics.get("actor/grad_norm", math.nan),
            )
            if self.checkpoint_every and self.step % self.checkpoint_every == 0:
                self.save_checkpoint()
        if self.checkpoint_dir is not None and not (self.checkpoint_every and self.step % self.checkpoint_every == 0):
            self.save_checkpoint()

    def save_checkpoint(self) -> Path:
        """Save verl's state, then ours (step, model version: the commit mark); returns the folder.

        Raises:
            RuntimeError: No ``checkpoint_dir`` was given.
        """
        if self.checkpoint_dir is None:
            raise RuntimeError("VerlAlgorithm has no checkpoint_dir")
        directory = self.checkpoint_dir
        directory.mkdir(parents=True, exist_ok=True)
        self.save_state(directory)
        partial = directory / f"{CHECKPOINT_STATE_FILE}.partial"
        partial.write_text(json.dumps({"step": self.step, "model_version": self.model_version}), encoding="utf-8")
        partial.replace(directory / CHECKPOINT_STATE_FILE)
        logger.info("checkpoint saved to %s (step %d, model version %d)", directory, self.step, self.model_version)
        return directory

    def _restore(self) -> None:
        assert self.checkpoint_dir is not None
        state_file = self.checkpoint_dir / CHECKPOINT_STATE_FILE
        if not state_file.exists():
            logger.info("no checkpoint in %s; starting from %s", self.checkpoint_dir, self.config.model_path)
            return
        try:
            state = json.loads(state_file.read_text(encoding="utf-8"))
            step, version = int(state["step"]), int(state["model_version"])
        except (ValueError, KeyError, TypeError) as error:
            raise ValueError(f"checkpoint state {state_file} is unreadable: {error!r}") from error
        self.load_state(self.checkpoint_dir)
        self.step, self.model_version, self.updates = step, version, step
        logger.info("resumed from %s at step %d, model version %d", self.checkpoint_dir, step, version)

    async def _publish(self, store: LightningStore) -> Resources:
        """Publish the model now served as a new resources version."""
        endpoint = self.proxy.url if self.proxy is not None else self.backend.rollout_addresses()[0]
        return await store.add_resources(
            Resources(
                resources_id=new_id("res"),
                items={"llm": LLMResource(endpoint=endpoint, model=self.served_model)},
            )
        )
