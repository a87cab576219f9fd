"""`TorchTrainer`: the embedded-default Algorithm — local batched backend behind the LLM proxy, PPO on one machine.

One iteration: enqueue ``tasks_per_iteration × samples_per_task`` rollouts (one group per task) pinned to the
current resources version → wait for runners → rebuild transitions from spans + the proxy's token records →
LightningRL credit and advantages → `ppo_update` → pause the proxy, swap the backend's weights, resume with the
new model version → publish the new resources. Rollouts run wherever runners are (other processes, other
machines); the trainer only talks to the store and serves the model.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from agentlightning import (
    Algorithm,
    CreditConfig,
    LightningStore,
    LLMResource,
    Resources,
    RolloutRequest,
    TrainingBatch,
    TransitionConfig,
    build_training_batch,
)
from agentlightning.proxy import LLMProxy
from agentlightning.transitions import TransitionDiagnostics, results_from_store
from agentlightning_torch._backend import LocalBackend
from agentlightning_torch._model import load_tiny, save_tiny
from agentlightning_torch._ppo import make_optimizer, ppo_update, prepare_policy
from agentlightning_torch._server import BackendServer
from agentlightning_torch._trainer_config import TorchTrainerConfig

__all__ = ["IterationReport", "TorchTrainer"]

logger = logging.getLogger(__name__)


@dataclass
class IterationReport:
    """What one iteration (or evaluation) produced; also one line of ``metrics.jsonl``."""

    iteration: int
    model_version: int
    rollouts: int
    finished: int
    reward_mean: float
    calls_per_rollout: float
    multi_call_rate: float
    seconds: float
    metrics: dict[str, float] = field(default_factory=dict)


class TorchTrainer(Algorithm):
    """PPO/GRPO on one machine (CPU or one CUDA GPU), serving the policy through the LLM proxy.

    Args:
        config: Validated settings.
        on_iteration: Called after every iteration with its report (progress bars, early stopping).
    """

    def __init__(
        self, config: TorchTrainerConfig, on_iteration: Callable[[IterationReport], None] | None = None
    ) -> None:
        self.config = config
        self.on_iteration = on_iteration
        torch.set_num_threads(config.num_threads)
        model, tokenizer = load_tiny(config.model_dir, device=config.device)
        self.tokenizer = tokenizer
        self.policy = prepare_policy(model, config.ppo)
        self.optimizer = make_optimizer(self.policy, config.ppo)
        self.iteration = 0
        self.model_version = 0
        self.history: list[IterationReport] = []
        self._rng = random.Random(config.seed)
        self._backend: LocalBackend | None = None
        self._server: BackendServer | None = None
        self._proxy: LLMProxy | None = None
        self._resources: dict[str, Resources] = {}
        if config.resume:
            self._load_checkpoint()

    # ----- serving -------------------------------------------------------------------------------------------

    @property
    def proxy(self) -> LLMProxy:
        """The running LLM proxy (after `start`)."""
        if self._proxy is None:
            raise RuntimeError("the trainer is not serving; call `await trainer.start(store)` first")
        return self._proxy

    async def start(self, store: LightningStore) -> None:
        """Start the local backend and the LLM proxy in front of it, and publish the current model version."""
        if self._proxy is not None:
            return
        backend = LocalBackend(
            self.policy,  # pyright: ignore[reportArgumentType]  # a PreTrainedModel, or a PEFT model wrapping one
            self.tokenizer,
            device=self.config.device,
            max_batch_size=self.config.max_batch_size,
            batch_wait_ms=self.config.batch_wait_ms,
            max_batch_wait_ms=self.config.max_batch_wait_ms,
            model_name=self.config.model_name,
            num_threads=self.config.num_threads,
            seed=self.config.seed,
        )
        backend.model_version = self.model_version
        self._backend = backend
        self._server = BackendServer(backend).start()
        # Background recording: LLM-call records are written in batches (fewer SQLite transactions competing
        # with the runners'); the trainer owns the proxy, so it flushes them before it builds a batch.
        self._proxy = LLMProxy(store, [self._server.url], model_version=self.model_version, record="background")
        await self._proxy.start()
        await self._publish(store)

    async def stop(self) -> None:
        """Stop the proxy and the backend."""
        if self._proxy is not None:
            await self._proxy.stop()
            self._proxy = None
        if self._server is not None:
            self._server.stop()
            self._server = None

    async def _publish(self, store: LightningStore) -> None:
        """Publish sampling and greedy resources for the current model version."""
        assert self._proxy is not None
        for mode, params in (
            ("sample", {"temperature": self.config.temperature, "max_tokens": self.config.max_tokens}),
            ("greedy", {"temperature": 0.0, "max_tokens": self.config.max_tokens}),
        ):
            resources = Resources(
                resources_id=f"policy-v{self.model_version}-{mode}-{time.time_ns()}",
                items={
                    "llm": LLMResource(
                        endpoint=self._proxy.url, model=self.config.model_name, sampling_parameters=params
                    ),
                },
            )
            self._resources[mode] = await store.add_resources(resources)

    # ----- the loop ------------------------------------------------------------------------------------------

    async def run(
        self, store: LightningStore, train_tasks: Sequence[Any], val_tasks: Sequence[Any] | None = None
    ) -> None:
        """Train on ``train_tasks`` until ``iterations`` or ``time_budget_s`` is reached; serves while it runs."""
        if not train_tasks:
            raise ValueError("train_tasks is empty: there is nothing to train on")
        await self.start(store)
        started = time.monotonic()
        try:
            while self.iteration < self.config.iterations:
                budget = self.config.time_budget_s
                if budget is not None and time.monotonic() - started >= budget:
                    logger.info("time budget of %.0f s reached after %d iterations", budget, self.iteration)
                    break
                await self.train_iteration(store, train_tasks)
        finally:
            self._save_checkpoint()

    async def train_iteration(self, store: LightningStore, train_tasks: Sequence[Any]) -> IterationReport:
        """Run one iteration: rollouts → batch → update → serve the new weights."""
        t0 = time.monotonic()
        assert self._backend is not None
        stats = self._backend.stats
        batches_before, requests_before, busy_before = stats.batches, stats.requests, stats.busy_seconds
        tasks = [self._rng.choice(list(train_tasks)) for _ in range(self.config.tasks_per_iteration)]
        prefix = f"it{self.iteration}-{time.time_ns()}"
        rollout_ids = await self._enqueue(store, tasks, self.config.samples_per_task, "sample", "train", prefix)
        finished = await store.wait_for_rollouts(rollout_ids, timeout=self.config.rollout_timeout_s)
        t_rollouts = time.monotonic()
        done_ids = [r.rollout_id for r in finished if r.status == "succeeded"]
        for rollout in await store.query_rollouts(status=["queuing", "running"], rollout_ids=rollout_ids):
            await store.cancel_rollout(rollout.rollout_id)  # late rollouts would train on a stale policy
        batch, summary = await self._build_batch(store, done_ids)
        t_batch = time.monotonic()
        update_metrics = self.update(batch)
        t_update = time.monotonic()
        await self._swap_weights(store)
        batches = stats.batches - batches_before
        timings = {
            "backend_batches": float(batches),
            "backend_mean_batch": (stats.requests - requests_before) / max(batches, 1),
            "time_generating": stats.busy_seconds - busy_before,
            "time_rollouts": t_rollouts - t0,
            "time_batch": t_batch - t_rollouts,
            "time_update": t_update - t_batch,
            "time_swap": time.monotonic() - t_update,
        }
        self.iteration += 1
        report = self._report(
            len(rollout_ids), len(done_ids), summary, t0, {**batch.metrics, **update_metrics, **timings}
        )
        self._record(report)
        if self.config.checkpoint_every and self.iteration % self.config.checkpoint_every == 0:
            self._save_checkpoint()
        return report

    async def evaluate(self, store: LightningStore, tasks: Sequence[Any], *, greedy: bool = True) -> IterationReport:
        """Run each task once with the current policy (greedy by default) and report the mean reward."""
        await self.start(store)
        t0 = time.monotonic()
        prefix = f"eval{self.iteration}-{time.time_ns()}"
        mode = "greedy" if greedy else "sample"
        rollout_ids = await self._enqueue(store, list(tasks), 1, mode, "val", prefix)
        finished = await store.wait_for_rollouts(rollout_ids, timeout=self.config.rollout_timeout_s)
        done_ids = [r.rollout_id for r in finished if r.status == "succeeded"]
        summary = await self._summarize(store, done_ids)
        return self._report(len(rollout_ids), len(done_ids), summary, t0, {})

    def _report(
        self, rollouts: int, finished: int, summary: dict[str, float], t0: float, metrics: dict[str, float]
    ) -> IterationReport:
        if finished == 0 and rollouts:
            logger.error(
                "none of %d rollouts finished in %.0f s: are runners running?", rollouts, time.monotonic() - t0
            )
        return IterationReport(
            iteration=self.iteration,
            model_version=self.model_version,
            rollouts=rollouts,
            finished=finished,
            reward_mean=summary["reward_mean"],
            calls_per_rollout=summary["calls_per_rollout"],
            multi_call_rate=summary["multi_call_rate"],
            seconds=time.monotonic() - t0,
            metrics={**metrics, "accuracy": summary["success_rate"]},
        )

    def update(self, batch: TrainingBatch) -> dict[str, float]:
        """One PPO step on ``batch`` (the Algorithm contract)."""
        return ppo_update(self.policy, self.optimizer, batch, self.config.ppo, self.config.device)

    # ----- helpers -------------------------------------------------------------------------------------------

    async def _enqueue(
        self, store: LightningStore, tasks: Sequence[Any], n: int, resources: str, mode: str, prefix: str
    ) -> list[str]:
        resources_id = self._resources[resources].resources_id
        requests = [
            RolloutRequest(
                input=task,
                rollout_id=f"{prefix}-t{t}-s{s}",
                group_id=f"{prefix}-t{t}",
                mode="train" if mode == "train" else "val",
                resources_id=resources_id,
            )
            for t, task in enumerate(tasks)
            for s in range(n)
        ]
        return [r.rollout_id for r in await store.enqueue_rollouts(requests)]

    def _transition_config(self) -> TransitionConfig:
        return TransitionConfig(mode=self.config.transition_mode, agent_filter=self.config.agent_filter)

    async def _summarize(self, store: LightningStore, rollout_ids: Sequence[str]) -> dict[str, float]:
        await self.proxy.flush()
        results = await results_from_store(store, rollout_ids, self._transition_config())
        return _summary(results)

    async def _build_batch(
        self, store: LightningStore, rollout_ids: Sequence[str]
    ) -> tuple[TrainingBatch, dict[str, float]]:
        await self.proxy.flush()
        results = await results_from_store(store, rollout_ids, self._transition_config())
        diagnostics = TransitionDiagnostics()
        for result in results:
            diagnostics.add(result.diagnostics)
        transitions = [t for result in results for t in result.transitions]
        credit_config = CreditConfig(drop_equal_groups=self.config.drop_equal_groups)
        batch = build_training_batch(
            transitions, self.config.credit, self.config.estimator, credit_config, diagnostics=diagnostics
        )
        return batch, _summary(results)

    async def _swap_weights(self, store: LightningStore) -> None:
        assert self._backend is not None and self._proxy is not None
        await self._proxy.pause()
        try:
            self.model_version += 1
            self._backend.update_weights(self.policy, version=self.model_version)
        finally:
            self._proxy.resume(model_version=self.model_version)
        await self._publish(store)

    def _record(self, report: IterationReport) -> None:
        self.history.append(report)
        self.config.output_dir.mkdir(parents=True, exist_ok=True)
        with (self.config.output_dir / "metrics.jsonl").open("a", encoding="utf-8") as out:
            out.write(json.dumps(report.__dict__) + "\n")
        if self.on_iteration is not None:
            self.on_iteration(report)

    # ----- checkpoints ---------------------------------------------------------------------------------------

    @property
    def checkpoint_dir(self) -> Path:
        """Where the latest checkpoint lives."""
        return self.config.output_dir / "checkpoint"

    def _save_checkpoint(self) -> None:
        directory = self.checkpoint_dir
        directory.mkdir(parents=True, exist_ok=True)
        from agentlightning_torch._backend import merged_state_dict

        model, _ = load_tiny(self.config.model_dir, device="cpu")
        model.load_state_dict(merged_state_dict(self.policy))
        save_tiny(model, self.tokenizer, directory)
        state = {
            "iteration": self.iteration,
            "model_version": self.model_version,
            "optimizer": self.optimizer.state_dict(),
        }
        torch.save(state, directory / "trainer_state.pt")
        logger.info("checkpoint saved to %s (iteration %d)", directory, self.iteration)

    def _load_checkpoint(self) -> None:
        directory = self.checkpoint_dir
        state_file = directory / "trainer_state.pt"
        if not state_file.exists():
            logger.info("no checkpoint in %s; starting from %s", directory, self.config.model_dir)
            return
        model, _ = load_tiny(directory, device=self.config.device)
        target = self.policy.get_base_model() if hasattr(self.policy, "get_base_model") else self.policy  # type: ignore[operator]
        target.load_state_dict(model.state_dict(), strict=False)  # type: ignore[union-attr]
        state = torch.load(state_file, map_location=self.config.device, weights_only=False)
        self.optimizer.load_state_dict(state["optimizer"])
        self.iteration = int(state["iteration"])
        self.model_version = int(state["model_version"])
        logger.info("resumed from %s at iteration %d", directory, self.iteration)


def _summary(results: Sequence[Any]) -> dict[str, float]:
    rewards = [r.final_reward if r.final_reward is not None else 0.0 for r in results]
    calls = [len(r.transitions) for r in results]
    n = max(len(results), 1)
    return {
        "reward_mean": sum(rewards) / n,
        "calls_per_rollout": sum(calls) / n,
        "multi_call_rate": sum(1 for c in calls if c > 1) / n,
        "success_rate": sum(1 for r in rewards if r >= 1.0) / n,
    }
