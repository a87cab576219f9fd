"""`VerlAlgorithm`: Agent Lightning's training loop on verl's workers (Ray, FSDP, vLLM rollout servers).

One step: enqueue ``tasks_per_step`` tasks x ``n_rollouts_per_task`` rollouts (one group per task), wait for the
runners, build a `TrainingBatch` from the store (transitions + LightningRL credit), convert it with `to_data_proto`,
then with the LLM proxy paused: recompute ``old_log_probs`` with the actor, (PPO) values with the critic, advantages
with verl's ``compute_advantage``, update critic and actor, push the new weights into the vLLM servers, publish the new
model version in the store, resume the proxy.

The verl side sits behind a small `VerlBackend` protocol. `RayVerlBackend` builds the same worker groups verl's
``RayPPOTrainer.init_workers`` builds (``ActorRolloutRefWorker`` colocated with vLLM replicas, a ``TrainingWorker``
critic for PPO) and needs Ray, vLLM and GPUs; everything it needs is imported when it is built, and a missing piece
fails with `GPU_INSTALL_HINT`.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import logging
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from agentlightning import LLMResource, Resources, TrainingBatch, new_id
from agentlightning.algorithm import Algorithm
from agentlightning.store import LightningStore, RolloutRequest
from agentlightning_verl._config import VerlTrainerConfig
from agentlightning_verl._convert import to_data_proto

if TYPE_CHECKING:
    from verl import DataProto

    from agentlightning.proxy import LLMProxy

__all__ = ["GPU_INSTALL_HINT", "RayVerlBackend", "VerlAlgorithm", "VerlBackend"]

logger = logging.getLogger(__name__)

GPU_INSTALL_HINT = "pip install 'agentlightning-verl[gpu]'"
"""The command that installs the GPU stack (verl 0.9.1 with vLLM, Ray) this path needs."""

_OUR_ESTIMATOR = {"grpo": "grpo", "rloo": "rloo", "reinforce_plus_plus": "reinforce_pp", "ppo": "passthrough"}


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


class VerlBackend(Protocol):
    """What `VerlAlgorithm` needs from verl; `RayVerlBackend` is the real one, tests may pass a local one."""

    def rollout_addresses(self) -> list[str]:
        """OpenAI-compatible base URLs of the inference servers (the LLM proxy's backends)."""
        ...

    def compute_log_prob(self, data: DataProto) -> Any:
        """Current policy log-probs ``(B, R)`` of the responses."""
        ...

    def compute_values(self, data: DataProto) -> Any:
        """Critic values ``(B, R)`` (PPO only)."""
        ...

    def update_critic(self, data: DataProto) -> dict[str, float]:
        """One critic update; metrics."""
        ...

    def update_actor(self, data: DataProto) -> dict[str, float]:
        """One actor update; metrics."""
        ...

    async def sync_weights(self, step: int) -> None:
        """Push the actor's weights into the inference servers."""
        ...


def _require_gpu_stack() -> None:
    missing: list[str] = []
    for module in ("ray", "vllm", "verl"):
        try:
            __import__(module)
        except ImportError:
            missing.append(module)
    if missing:
        raise ImportError(f"the verl GPU path needs {', '.join(missing)}; install it with: {GPU_INSTALL_HINT}")


def _metrics_of(output: Any) -> dict[str, float]:
    from verl.utils import tensordict_utils as tu

    raw = tu.get(output, "metrics") or {}
    out: dict[str, float] = {}
    for key, value in raw.items():
        values = value if isinstance(value, list) else [value]
        numbers = [float(v) for v in values if isinstance(v, int | float)]
        if numbers:
            out[key] = sum(numbers) / len(numbers)
    return out


class RayVerlBackend:
    """verl 0.9.1 worker groups on a Ray cluster, assembled as ``RayPPOTrainer.init_workers`` does.

    Args:
        config: Our settings.
        verl_config: verl's full config; defaults to ``config.to_verl_config()``.

    Raises:
        ImportError: Ray, vLLM or verl is missing (message gives `GPU_INSTALL_HINT`).
    """

    def __init__(self, config: VerlTrainerConfig, verl_config: Any = None) -> None:
        _require_gpu_stack()
        from functools import partial

        import ray
        from verl.checkpoint_engine import CheckpointEngineManager
        from verl.single_controller.ray import RayClassWithInitArgs, RayWorkerGroup, ResourcePoolManager
        from verl.single_controller.ray.base import create_colocated_worker_cls
        from verl.trainer.ppo.utils import Role
        from verl.utils.config import omega_conf_to_dataclass
        from verl.workers.config import TrainingWorkerConfig
        from verl.workers.engine_workers import ActorRolloutRefWorker, TrainingWorker
        from verl.workers.rollout.llm_server import LLMServerManager
        from verl.workers.utils.losses import value_loss

        self.config = config
        self.cfg = verl_config if verl_config is not None else config.to_verl_config()
        if not ray.is_initialized():
            ray.init()  # joins RAY_ADDRESS when set (multi-node), else starts a local cluster
        pool = "global_pool"
        roles = [Role.ActorRollout] + ([Role.Critic] if config.use_critic else [])
        mapping: dict[Any, str] = {role: pool for role in roles}  # verl keys it by Role (annotated as int)
        self.pools = ResourcePoolManager(
            resource_pool_spec={pool: [config.n_gpus_per_node] * config.nnodes}, mapping=mapping
        )
        self.pools.create_resource_pool()
        resource_pool = self.pools.get_resource_pool(Role.ActorRollout)
        classes: dict[str, Any] = {
            str(Role.ActorRollout): RayClassWithInitArgs(
                cls=ray.remote(ActorRolloutRefWorker),
                config=self.cfg.actor_rollout_ref,
                role=str(Role.ActorRollout),
            )
        }
        critic_cfg = None
        if config.use_critic:
            critic_cfg = omega_conf_to_dataclass(self.cfg.critic)
            engine = critic_cfg.engine
            engine.infer_max_token_len_per_gpu = critic_cfg.ppo_infer_max_token_len_per_gpu
            engine.max_token_len_per_gpu = critic_cfg.ppo_max_token_len_per_gpu
            classes[str(Role.Critic)] = RayClassWithInitArgs(
                cls=ray.remote(TrainingWorker),
                config=TrainingWorkerConfig(
                    model_type="value_model",
                    model_config=critic_cfg.model,
                    engine_config=engine,
                    optimizer_config=critic_cfg.optim,
                    checkpoint_config=critic_cfg.checkpoint,
                ),
            )
        group = RayWorkerGroup(
            resource_pool=resource_pool,
            ray_cls_with_init=create_colocated_worker_cls(class_dict=classes),
            device_name="cuda",
        )
        spawned = group.spawn(prefix_set=classes.keys())
        self.critic_wg: Any = None
        if critic_cfg is not None:
            self.critic_wg = spawned[str(Role.Critic)]
            self.critic_wg.reset()
            self.critic_wg.set_loss_fn(partial(value_loss, config=critic_cfg))
        self.actor_wg: Any = spawned[str(Role.ActorRollout)]
        self.actor_wg.init_model()
        self.llm_servers: Any = LLMServerManager.create(
            config=self.cfg, worker_group=self.actor_wg, rollout_resource_pool=resource_pool
        )
        self.checkpoints: Any = CheckpointEngineManager(
            config=omega_conf_to_dataclass(self.cfg.actor_rollout_ref.rollout.checkpoint_engine),
            actor_wg=self.actor_wg,
            replicas=self.llm_servers.get_replicas(),
        )
        # vLLM serves the initial weights right away; sync_weights sleeps/wakes it around updates.
        logger.info("verl workers ready; vLLM servers at %s", self.rollout_addresses())

    def rollout_addresses(self) -> list[str]:
        """``http://host:port`` of every vLLM replica (verl's ``LLMServerManager.get_addresses``)."""
        return [a if a.startswith("http") else f"http://{a}" for a in self.llm_servers.get_addresses()]

    def _td(self, data: DataProto, **meta: Any) -> Any:
        from verl.utils import tensordict_utils as tu
        from verl.workers.utils.padding import left_right_2_no_padding

        data.meta_info.setdefault("temperature", self.config.temperature)
        td = left_right_2_no_padding(data.to_tensordict())
        tu.assign_non_tensor(td, **meta)
        return td

    def compute_log_prob(self, data: DataProto) -> Any:
        """As ``RayPPOTrainer._compute_old_log_prob`` (no entropy)."""
        from verl.utils import tensordict_utils as tu
        from verl.workers.utils.padding import no_padding_2_padding

        td = self._td(data, calculate_entropy=False, compute_loss=False)
        output = self.actor_wg.compute_log_prob(td)
        return no_padding_2_padding(tu.get(output, "log_probs"), td).float()

    def compute_values(self, data: DataProto) -> Any:
        """As ``RayPPOTrainer._compute_values``."""
        from verl.utils import tensordict_utils as tu
        from verl.workers.utils.padding import no_padding_2_padding

        td = self._td(data, compute_loss=False)
        output = self.critic_wg.infer_batch(td).get()
        return no_padding_2_padding(tu.get(output, "values"), td).float()

    def _mini_batch_meta(self, section: Any) -> dict[str, Any]:
        mini = int(section.ppo_mini_batch_size) * self.config.n_rollouts_per_task
        return {
            "global_batch_size": mini,
            "mini_batch_size": mini,
            "epochs": int(section.ppo_epochs),
            "seed": int(section.data_loader_seed),
            "dataloader_kwargs": {"shuffle": bool(section.shuffle)},
        }

    def update_critic(self, data: DataProto) -> dict[str, float]:
        """As ``RayPPOTrainer._update_critic``."""
        td = self._td(data, **self._mini_batch_meta(self.cfg.critic))
        metrics = _metrics_of(self.critic_wg.train_mini_batch(td).get())
        return {k if k.startswith("critic/") else f"critic/{k}": v for k, v in metrics.items()}

    def update_actor(self, data: DataProto) -> dict[str, float]:
        """As ``RayPPOTrainer._update_actor``."""
        actor = self.cfg.actor_rollout_ref.actor
        td = self._td(
            data,
            calculate_entropy=bool(actor.calculate_entropy) or float(actor.entropy_coeff) != 0.0,
            distillation_use_topk=False,
            distillation_only=False,
            compute_loss=True,
            **self._mini_batch_meta(actor),
        )
        metrics = _metrics_of(self.actor_wg.update_actor(td))
        return {k if k.startswith("actor/") else f"actor/{k}": v for k, v in metrics.items()}

    async def sync_weights(self, step: int) -> None:
        """verl's ``CheckpointEngineManager.update_weights``: actor weights -> every vLLM replica."""
        await _maybe_await(self.checkpoints.update_weights(step))


class VerlAlgorithm(Algorithm):
    """Train the model behind the LLM proxy with verl (GRPO, RLOO, REINFORCE++ or PPO).

    Args:
        config: Validated settings (`VerlTrainerConfig`).
        proxy: The `LLMProxy` agents call; its backends are pointed at verl's vLLM servers, and it is paused while
            weights change. ``None`` if the caller manages serving itself.
        backend: A `VerlBackend`; by default a `RayVerlBackend` is built on the first `run`/`update`.
        served_model: Model name published in the `LLMResource` (defaults to ``config.model_path``).
    """

    def __init__(
        self,
        config: VerlTrainerConfig,
        *,
        proxy: LLMProxy | None = None,
        backend: VerlBackend | None = None,
        served_model: str | None = None,
    ) -> None:
        self.config = config
        self.proxy = proxy
        self._backend = backend
        self.served_model = served_model or config.model_path
        self.step = 0
        self.history: list[dict[str, float]] = []

    @property
    def backend(self) -> VerlBackend:
        """The verl backend, built on first use (`RayVerlBackend` unless one was given)."""
        if self._backend is None:
            self._backend = RayVerlBackend(self.config)
        return self._backend

    def update(self, batch: TrainingBatch) -> dict[str, float]:
        """One verl step on ``batch``: old log-probs, (values), advantages, (critic), actor. Weights are not synced.

        Raises:
            ValueError: An empty batch or a sample that does not fit (see `to_data_proto`).
        """
        import torch
        from verl.trainer.ppo.core_algos import AdvantageEstimator
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
        mask = data.batch["response_mask"].float()
        # verl's default ("decoupled") mode: the PPO anchor is the trainer's own policy, recomputed here.
        data.batch["old_log_probs"] = torch.as_tensor(backend.compute_log_prob(data)).float().cpu() * mask
        if cfg.use_critic:
            data.batch["values"] = torch.as_tensor(backend.compute_values(data)).float().cpu()
        if cfg.advantages_from == "verl":
            algo_cfg = omega_conf_to_dataclass(cfg.to_verl_config().algorithm)
            data = compute_advantage(
                data,
                adv_estimator=AdvantageEstimator(cfg.adv_estimator),
                gamma=cfg.gamma,
                lam=cfg.lam,
                num_repeat=cfg.n_rollouts_per_task,
                config=algo_cfg,
            )
        metrics: dict[str, float] = {f"batch/{k}": float(v) for k, v in batch.metrics.items()}
        metrics["batch/samples"] = float(len(data))
        metrics["batch/tokens"] = float(data.batch["attention_mask"].sum())
        metrics["batch/reward_mean"] = float(data.batch["token_level_scores"].sum(-1).mean())
        if cfg.use_critic:
            metrics.update(backend.update_critic(data))
        metrics.update(backend.update_actor(data))
        return metrics

    def _task_batches(self, tasks: Sequence[Any]) -> itertools.cycle[list[Any]]:
        per = self.config.tasks_per_step
        chunks = [list(tasks[i : i + per]) for i in range(0, len(tasks), per)]
        return itertools.cycle([c for c in chunks if len(c) == per] or chunks)

    async def run(
        self, store: LightningStore, train_tasks: Sequence[Any], val_tasks: Sequence[Any] | None = None
    ) -> None:
        """Train for ``config.total_steps`` steps on ``train_tasks`` (cycled); ``val_tasks`` are not used yet.

        Raises:
            ValueError: ``train_tasks`` is empty.
            ImportError: The GPU stack is missing (see `GPU_INSTALL_HINT`).
        """
        from agentlightning import build_batch_from_store

        if not train_tasks:
            raise ValueError("VerlAlgorithm.run needs at least one training task")
        cfg = self.config
        backend = self.backend
        if self.proxy is not None:
            self.proxy.set_backends(backend.rollout_addresses())
        await self._publish(store)
        batches = self._task_batches(train_tasks)
        while self.step < cfg.total_steps:
            tasks = next(batches)
            requests = [
                RolloutRequest(input=task, mode="train", group_id=f"step{self.step}-task{i}")
                for i, task in enumerate(tasks)
                for _ in range(cfg.n_rollouts_per_task)
            ]
            rollouts = await store.enqueue_rollouts(requests)
            done = await store.wait_for_rollouts([r.rollout_id for r in rollouts], timeout=cfg.rollout_timeout_s)
            ok = [r.rollout_id for r in done if r.status == "succeeded"]
            if len(ok) < len(rollouts):
                logger.warning("step %d: %d of %d rollouts succeeded in time", self.step, len(ok), len(rollouts))
            if not ok:
                raise RuntimeError(f"step {self.step}: no rollout succeeded; check the runners and the proxy")
            batch = await build_batch_from_store(
                store, ok, credit=cfg.credit_strategy, estimator=_OUR_ESTIMATOR[cfg.algorithm]
            )
            if not batch.samples:
                logger.warning("step %d: the rollouts gave no training samples (see batch metrics)", self.step)
                self.step += 1
                continue
            version: int | None = None
            if self.proxy is not None:
                await self.proxy.pause(timeout=cfg.rollout_timeout_s)
            try:
                metrics = await asyncio.to_thread(self.update, batch)
                await backend.sync_weights(self.step + 1)
                version = await self._publish(store)
            finally:
                if self.proxy is not None:
                    self.proxy.resume(model_version=version)
            self.step += 1
            metrics["step"] = float(self.step)
            self.history.append(metrics)
            logger.info(
                "step %d: reward %.4f, pg_loss %.4f, grad_norm %.4f",
                self.step,
                metrics.get("batch/reward_mean", math.nan),
                metrics.get("actor/pg_loss", math.nan),
                metrics.get("actor/grad_norm", math.nan),
            )

    async def _publish(self, store: LightningStore) -> int:
        """Publish the model now served as a new resources version; returns the version."""
        endpoint = self.proxy.url if self.proxy is not None else self.backend.rollout_addresses()[0]
        resources = await store.add_resources(
            Resources(
                resources_id=new_id("res"),
                items={"llm": LLMResource(endpoint=endpoint, model=self.served_model)},
            )
        )
        return resources.version
