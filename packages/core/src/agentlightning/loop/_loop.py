"""`RLLoop`: the one RL step of Agent Lightning, driving any `Engine` (trainer-torch, trainer-verl).

One iteration:

1. enqueue ``tasks_per_iteration`` groups of ``samples_per_task`` rollouts, pinned to the resources version that
   publishes the current model version;
2. wait for the runners (at most ``rollout_timeout_s``), then cancel the rollouts still queued or running (they
   would train on a stale policy) and have the proxy abort their calls in flight, so the backend stops generating
   them before the weights change;
3. pause the LLM proxy (refuse new calls, drain those in flight), wait until the engine's servers generate nothing
   (`Engine.wait_servers_idle`), and flush the proxy's records;
4. spans + the proxy's token records → transitions → LightningRL credit → advantages (`build_batch_from_results`,
   with staleness metrics against the current model version);
5. ``engine.update(batch)`` in a worker thread;
6. ``engine.wait_servers_idle`` again, then ``engine.sync_weights(version + 1)``: the inference servers now serve the
   new weights as the new version;
7. publish the new resources (sampling and greedy), resume the proxy with the new version recorded for backends
   that do not report one;
8. report: one `IterationReport` appended to ``metrics.jsonl``, passed to ``on_iteration``; checkpoint every
   ``checkpoint_every`` iterations (the loop's iteration and model version plus the engine's state).

Every ``eval_every`` iterations `run` evaluates the held-out tasks greedily (a ``kind="eval"`` line of
``metrics.jsonl``); an evaluation that beats all earlier ones (by ``best_metric``) saves ``checkpoint/best``, kept
next to the last checkpoint (``checkpoint/``), as training libraries do.

The proxy is paused from step 3 to 7 rather than only around the weight sync: nothing served in between could be
trained on (the late rollouts are cancelled), and a colocated inference engine (verl with vLLM) sleeps while the
trainer uses the accelerator.

Off-policy with a staleness bound of k versions (``LoopConfig.max_staleness=k`` > 0, for an engine whose
`Engine.serves_during_update`): right after step 2, the rollouts of the next k iterations are enqueued (those not
enqueued yet, each batch pinned to the current version's resources), except for iterations the loop will not run
(``iterations``; ``time_budget_s`` already spent). That is the admission control: a batch enqueued at version v is
trained k iterations later at the latest, so by a model of version v + k at most, and no rollout is started whose
samples would be older than k when trained. The proxy is not paused in step 3 (the flush writes the records of the
finished rollouts while it keeps serving) and the runners work on the next iterations while the batch is built and
the engine updates; the proxy is paused (drained) only around step 6, so each call is recorded with the version
that served it. The next `train_iteration` waits for the oldest enqueued batch instead of enqueuing. At training
time every sample is checked (`admit_samples`): one older than k, of unknown version or without behaviour
log-probs is dropped and counted (``samples_dropped_stale``...), never trained; the metrics get the version-lag
histogram (``version_lag_<n>``) and the engine corrects for the lag with the recorded log-probs (trainer-torch:
truncated importance sampling). When `run` ends (iterations, time budget, an error) or the loop stops, rollouts
enqueued for iterations that will not run are cancelled like late ones. `evaluate` waits only for its own
rollouts: prefetched ones neither count in it nor block it.
"""

from __future__ import annotations

import logging
import random
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from agentlightning._gc import frozen_gc
from agentlightning._models import LLMResource, Resources
from agentlightning._netauth import new_token
from agentlightning.credit import build_batch_from_results
from agentlightning.judge import LLMJudge
from agentlightning.loop._checkpoints import BEST_CHECKPOINT, read_loop_state, write_loop_state
from agentlightning.loop._config import LoopConfig
from agentlightning.loop._engine import Engine
from agentlightning.loop._report import IterationReport, append_metrics, held_out_score, make_report
from agentlightning.loop._rollouts import cancel_unfinished, failure_reasons, first_failure, group_requests
from agentlightning.loop._staleness import admit_samples
from agentlightning.loop._update import update_in_thread
from agentlightning.store import LightningStore
from agentlightning.transitions import TransitionConfig, TransitionResult, results_from_store

if TYPE_CHECKING:
    from agentlightning.proxy import LLMProxy

__all__ = ["EngineT", "RLLoop"]

logger = logging.getLogger(__name__)

EngineT = TypeVar("EngineT", bound=Engine)
"""The type of a loop's engine: ``RLLoop[TorchEngine].engine`` is a ``TorchEngine`` to a type checker."""


class RLLoop(Generic[EngineT]):
    """Train the policy of an `Engine` with rollouts from any runners, serving it through the LLM proxy.

    This is the one way to train: the loop owns the step (tasks, rollouts, proxy, credit, versions, metrics,
    checkpoints), ``loop.engine`` owns the model and its servers. A trainer package's convenience class (such as a
    ``TorchTrainer``) is an `RLLoop` whose engine it builds from one config; everything model-side is on ``.engine``.

    Args:
        config: Validated settings.
        engine: The model, its optimizer and its inference servers.
        on_iteration: Called with every training iteration's report (progress bars, early stopping).
    """

    def __init__(
        self,
        config: LoopConfig,
        engine: EngineT,
        *,
        on_iteration: Callable[[IterationReport], None] | None = None,
    ) -> None:
        self.config = config
        self.engine = engine
        self.on_iteration = on_iteration
        self.iteration = 0
        self.model_version = 0
        self.policy_versions: dict[str, int] = {}
        """Per trained policy (`LoopConfig.policies`), the loop's version when it last trained (`admit_samples`)."""
        self.history: list[IterationReport] = []
        self.evaluations: list[IterationReport] = []  # every `evaluate` report, in order
        self.best: IterationReport | None = None  # the evaluation `checkpoint/best` holds (``keep_best``)
        self.rollouts_failed = 0  # of the last iteration (also metrics["rollouts_failed"])
        self.last_failure: str | None = None  # why one of them failed (`first_failure`)
        self._rng = random.Random(config.seed)
        self._next_task = 0
        self._proxy: LLMProxy | None = None
        self._resources: dict[str, Resources] = {}
        self._restored = False
        # max_staleness=k: the rollouts of up to k coming iterations, oldest first, enqueued during earlier ones
        self._prefetched: deque[list[str]] = deque()
        self._prefetch_store: LightningStore | None = None  # the store holding them
        self._deadline: float | None = None  # `run`'s time budget, as a time.monotonic() value
        self._judge: LLMJudge | None = None if config.judge is None else LLMJudge(config.judge)
        if config.max_staleness and not engine.serves_during_update:
            raise ValueError(
                f"max_staleness={config.max_staleness} needs an engine that serves while it updates; "
                f"{type(engine).__name__} does not (Engine.serves_during_update is False): use max_staleness=0"
            )
        supported = engine.max_staleness_supported
        if supported is not None and config.max_staleness > supported:
            raise ValueError(
                f"max_staleness={config.max_staleness}: {type(engine).__name__} supports at most {supported} "
                "(Engine.max_staleness_supported)"
            )
        if config.policies is not None and engine.policies_unsupported is not None:
            raise ValueError(f"{type(engine).__name__} cannot train several policies: {engine.policies_unsupported}")

    # ----- serving ---------------------------------------------------------------------------------------

    @property
    def proxy(self) -> LLMProxy:
        """The running LLM proxy (after `start`)."""
        if self._proxy is None:
            raise RuntimeError("the loop is not serving; call `await loop.start(store)` first")
        return self._proxy

    @property
    def endpoint(self) -> str:
        """The proxy URL published to agents (`ProxySettings.advertised_url` or the bound address)."""
        return self.config.proxy.advertised_url or self.proxy.url

    def resources(self, mode: str = "sample") -> Resources:
        """The resources last published for ``mode`` (``sample`` or ``greedy``)."""
        if mode not in self._resources:
            raise KeyError(f"no resources published for {mode!r} yet; call `await loop.start(store)` first")
        return self._resources[mode]

    async def start(self, store: LightningStore) -> None:
        """Restore a checkpoint (``resume``), start the engine's servers and the proxy, publish the policy.

        Raises:
            ValueError: The proxy would listen off loopback without a token.
        """
        if self._proxy is not None:
            return
        settings = self.config.proxy
        settings.check_exposure()
        if self.config.resume and not self._restored:
            self.restore()
        from agentlightning.proxy import LLMProxy  # imported on use: `import agentlightning` stays light

        backends = await self.engine.start_servers(self.model_version)
        if self.config.policies is not None:  # every policy starts (or resumes) on the weights of this version
            self.policy_versions = dict.fromkeys(self.config.policies.trained, self.model_version)
        proxy = LLMProxy(
            store,
            backends,
            model_version=self.model_version,
            record=settings.record,
            # always a token, on loopback too (a web page in a local browser reaches the port): agents get it with
            # the resources (`LLMResource.api_key`), so a made one costs them nothing
            token=settings.token or new_token(),
            admin_token=settings.admin_token,
            host=settings.host,
            port=settings.port,
            advertise_url=settings.advertised_url,
            policies=self.config.policies,
        )
        await proxy.start()
        self._proxy = proxy
        await self._publish(store)

    async def stop(self) -> None:
        """Cancel rollouts prefetched for an iteration that will not run, stop the proxy and the engine's servers."""
        await self._cancel_prefetched()
        if self._proxy is not None:
            proxy, self._proxy = self._proxy, None
            await proxy.stop()
            await self.engine.stop_servers()
        if self._judge is not None:
            await self._judge.close()

    async def _publish(self, store: LightningStore) -> None:
        """Publish sampling and greedy resources for the current model version."""
        common: dict[str, Any] = {} if self.config.max_tokens is None else {"max_tokens": self.config.max_tokens}
        for mode, temperature in (("sample", self.config.temperature), ("greedy", 0.0)):
            resources = Resources(
                resources_id=f"policy-v{self.model_version}-{mode}-{time.time_ns()}",
                items={
                    "llm": LLMResource(
                        endpoint=self.endpoint,
                        model=self.config.model_name,
                        sampling_parameters={"temperature": temperature, **common},
                        api_key=self.proxy.token,
                        runner_token=self.proxy.runner_token,  # runners register slots with it; agents never see it
                    ),
                },
            )
            self._resources[mode] = await store.add_resources(resources)

    # ----- the loop --------------------------------------------------------------------------------------

    async def run(
        self, store: LightningStore, train_tasks: Sequence[Any], val_tasks: Sequence[Any] | None = None
    ) -> None:
        """Train until ``iterations`` or ``time_budget_s``; evaluates on ``val_tasks`` every ``eval_every``.

        Raises:
            ValueError: ``train_tasks`` is empty.
            RuntimeError: No rollout finished in ``max_idle_iterations`` consecutive iterations.
        """
        if not train_tasks:
            raise ValueError("train_tasks is empty: there is nothing to train on")
        await self.start(store)
        config = self.config
        started = time.monotonic()
        self._deadline = None if config.time_budget_s is None else started + config.time_budget_s
        idle = 0
        # startup objects (model, tokenizer, servers) are left out of full garbage collections while it trains
        with frozen_gc():
            try:
                while self.iteration < config.iterations:
                    if self._deadline is not None and time.monotonic() >= self._deadline:
                        logger.info(
                            "time budget of %.0f s reached after %d iterations", config.time_budget_s, self.iteration
                        )
                        break
                    report = await self.train_iteration(store, train_tasks)
                    idle = idle + 1 if report.finished == 0 else 0
                    if idle >= config.max_idle_iterations:
                        raise RuntimeError(
                            f"no rollout finished in {idle} consecutive iterations ({config.rollout_timeout_s:.0f} s "
                            "each): are runners running and pointed at this store?"
                        )
                    if val_tasks and config.eval_every and self.iteration % config.eval_every == 0:
                        await self.evaluate(store, val_tasks, keep_best=True)
            finally:
                self._deadline = None
                await self._cancel_prefetched()
                self.save_checkpoint()

    async def train_iteration(self, store: LightningStore, train_tasks: Sequence[Any]) -> IterationReport:
        """One iteration: rollouts → batch → ``engine.update`` → ``engine.sync_weights`` → publish.

        An iteration whose rollouts give no training sample logs a warning and skips the update (the model
        version stays); its report has ``metrics["skipped_update"] == 1``. With ``max_staleness=k`` > 0 it trains on
        the oldest rollouts earlier calls enqueued (when there are any) and enqueues those of the next k iterations
        not enqueued yet from ``train_tasks`` before it updates.
        """
        await self.start(store)
        config = self.config
        t0 = time.monotonic()
        if self._prefetched:
            rollout_ids = self._prefetched.popleft()
        else:
            rollout_ids = await self._enqueue_train(store, train_tasks, self.iteration)
        done_ids = await self._wait(store, rollout_ids)
        t_rollouts = time.monotonic()
        proxy = self.proxy
        paused = False
        try:
            await self._prefetch(store, train_tasks)
            if not config.max_staleness:
                paused = True
                await self._pause()
                await self._drain("the update")
            # The finished rollouts' calls were queued for recording before they ended; with max_staleness > 0 the
            # proxy keeps serving the next iterations' meanwhile, and the flush does not wait for those.
            await proxy.flush()
            results = await results_from_store(store, done_ids, self._transition_config())
            judged: dict[str, float] = {}
            if self._judge is not None:  # rewards from the judge, read before credit assignment
                results, judged = await self._judged(store, done_ids, results)
            batch = build_batch_from_results(
                results, config.credit, config.estimator, config.credit_config, current_version=self.model_version
            )
            served = {**self.policy_versions, **self.engine.policy_versions()}
            batch = admit_samples(batch, self.model_version, config.max_staleness, served or None)
            t_batch = time.monotonic()
            metrics: dict[str, float] = {**batch.metrics, **judged}
            metrics["rollouts_failed"] = float(self.rollouts_failed)
            if batch.samples:
                metrics.update(await update_in_thread(self.engine.update, batch))
                t_update = time.monotonic()
                if not paused:  # max_staleness > 0: drain the next iterations' calls in flight, then swap
                    paused = True
                    # the agents keep working: their new calls wait for the new weights instead of a 503
                    await self._pause(hold_s=self.config.proxy.pause_timeout_s)
                version = self.model_version + 1
                await self._drain(f"the weight sync to version {version}")
                await self.engine.sync_weights(version)
                self.model_version = version
                trained = {s.policy for s in batch.samples if s.policy in self.policy_versions}
                self.policy_versions.update(dict.fromkeys(trained, version))
                await self._publish(store)
            else:
                self._warn_skipped(len(done_ids), len(rollout_ids), batch.metrics)
                metrics["skipped_update"] = 1.0
                t_update = t_batch
        finally:
            if paused:
                proxy.resume(model_version=self.model_version, policy_versions=self.engine.policy_versions() or None)
        metrics.update(
            {
                "time_rollouts": t_rollouts - t0,
                "time_batch": t_batch - t_rollouts,
                "time_update": t_update - t_batch,
                "time_sync": time.monotonic() - t_update,
            }
        )
        return self._finish_iteration(len(rollout_ids), results, t0, metrics)

    def _warn_skipped(self, done: int, enqueued: int, batch_metrics: dict[str, float]) -> None:
        logger.warning(
            "iteration %d: %d of %d rollouts finished and gave no training sample; the update is skipped "
            "(batch metrics: %s)",
            self.iteration,
            done,
            enqueued,
            {k: v for k, v in batch_metrics.items() if v},
        )

    def _finish_iteration(
        self, enqueued: int, results: Sequence[TransitionResult], t0: float, metrics: dict[str, float]
    ) -> IterationReport:
        """The iteration's report: recorded, handed to ``on_iteration``, and a checkpoint when one is due."""
        metrics.update(self.engine.iteration_metrics())
        self.iteration += 1
        report = self._report("train", enqueued, results, t0, metrics)
        self._record(report)
        if self.on_iteration is not None:
            self.on_iteration(report)
        if self.config.checkpoint_every and self.iteration % self.config.checkpoint_every == 0:
            self.save_checkpoint()
        return report

    async def evaluate(
        self, store: LightningStore, tasks: Sequence[Any], *, greedy: bool = True, keep_best: bool = False
    ) -> IterationReport:
        """Run each task once with the current policy (greedy by default) and report; nothing is trained.

        The report (``kind="eval"``) is appended to ``metrics.jsonl`` and `evaluations`, not to `history`. With
        ``keep_best``, a greedy evaluation that beats every earlier one (by ``best_metric``) saves the policy to
        ``checkpoint/best`` and becomes `best` (its metrics get ``best: 1``).
        """
        await self.start(store)
        t0 = time.monotonic()
        prefix = f"eval{self.iteration}-{time.time_ns()}"
        rollout_ids = await self._enqueue(store, list(tasks), 1, "greedy" if greedy else "sample", prefix, "val")
        done_ids = await self._wait(store, rollout_ids)
        await self.proxy.flush()
        results = await results_from_store(store, done_ids, self._transition_config())
        report = self._report("eval", len(rollout_ids), results, t0, {"greedy": float(greedy)})
        if keep_best and greedy:
            self._keep_if_best(report)
        self.evaluations.append(report)
        append_metrics(self.config.output_dir, report)
        return report

    def _keep_if_best(self, report: IterationReport) -> None:
        """Save ``checkpoint/best`` when ``report`` beats the best evaluation so far (ties keep the earlier one)."""
        metric = self.config.best_metric
        score = held_out_score(report, metric)
        if self.best is not None and score <= held_out_score(self.best, metric):
            return
        self.save_checkpoint(self.best_checkpoint_dir)
        self.best = report
        report.metrics["best"] = 1.0
        logger.info("best held-out %s so far: %.4f at iteration %d", metric, score, self.iteration)

    # ----- helpers ---------------------------------------------------------------------------------------

    async def _pause(self, hold_s: float = 0.0) -> None:
        """Pause the proxy: refuse (or hold, ``hold_s``) new calls and wait (at most ``pause_timeout_s``) for those
        in flight."""
        try:
            await self.proxy.pause(timeout=self.config.proxy.pause_timeout_s, hold_s=hold_s)
        except TimeoutError as error:  # a straggler of a cancelled rollout; new calls are refused meanwhile
            logger.warning("iteration %d: %s; training anyway", self.iteration, error)

    async def _drain(self, before: str) -> None:
        """Wait for the engine's servers to stop generating (aborted calls leaving them) before ``before``; abort what
        still generates after ``pause_timeout_s`` (a straggler the proxy gave up on)."""
        timeout_s = self.config.proxy.pause_timeout_s
        running = await self.engine.wait_servers_idle(timeout_s)
        if running:
            logger.warning(
                "iteration %d: %d request(s) still generating in the inference server before %s after %.0f s "
                "(pause_timeout_s): aborting them",
                self.iteration,
                running,
                before,
                timeout_s,
            )
            running = await self.engine.abort_servers(timeout_s)
        if running:
            logger.warning(
                "iteration %d: %d request(s) still generating in the inference server before %s after the abort",
                self.iteration,
                running,
                before,
            )

    def _iteration_runs(self, iteration: int) -> bool:
        """Whether `run` gets to start ``iteration`` (as far as can be told now)."""
        if iteration >= self.config.iterations:
            return False
        return self._deadline is None or time.monotonic() < self._deadline

    async def _prefetch(self, store: LightningStore, train_tasks: Sequence[Any]) -> None:
        """Admission control: enqueue the rollouts of the next ``max_staleness`` iterations not enqueued yet.

        Enqueued now (at the current version v, pinned to its resources), a batch is trained at most
        ``max_staleness`` iterations later, by a model of version v + ``max_staleness`` at most: none is enqueued
        further ahead, so no rollout starts whose samples would be older than the bound when trained.
        """
        self._prefetch_store = store
        while len(self._prefetched) < self.config.max_staleness:
            iteration = self.iteration + 1 + len(self._prefetched)
            if not self._iteration_runs(iteration):
                break
            self._prefetched.append(await self._enqueue_train(store, train_tasks, iteration))

    async def _enqueue_train(self, store: LightningStore, train_tasks: Sequence[Any], iteration: int) -> list[str]:
        """Enqueue iteration ``iteration``'s groups of training rollouts, pinned to the current sampling resources."""
        prefix = f"it{iteration}-{time.time_ns()}"
        return await self._enqueue(store, self._pick_tasks(train_tasks), self.config.samples_per_task, "sample", prefix)

    async def _cancel_prefetched(self) -> None:
        """Cancel the rollouts enqueued for iterations that will not run (those still queued or running)."""
        store, pending = self._prefetch_store, [rollout_id for ids in self._prefetched for rollout_id in ids]
        self._prefetched.clear()
        if store is not None and pending:
            await self._cancel_late(store, pending, "enqueued for an iteration that will not run")

    def _pick_tasks(self, tasks: Sequence[Any]) -> list[Any]:
        n = self.config.tasks_per_iteration
        if self.config.task_order == "random":
            return [self._rng.choice(tasks) for _ in range(n)]
        picked = [tasks[(self._next_task + i) % len(tasks)] for i in range(n)]
        self._next_task = (self._next_task + n) % len(tasks)
        return picked

    async def _enqueue(
        self, store: LightningStore, tasks: Sequence[Any], n: int, resources: str, prefix: str, mode: str = "train"
    ) -> list[str]:
        requests = group_requests(tasks, n, self.resources(resources).resources_id, prefix, mode)
        return [r.rollout_id for r in await store.enqueue_rollouts(requests)]

    async def _wait(self, store: LightningStore, rollout_ids: list[str]) -> list[str]:
        """Wait for the rollouts, cancel the late ones; returns the ids of those that succeeded."""
        finished = await store.wait_for_rollouts(rollout_ids, timeout=self.config.rollout_timeout_s)
        done = [r.rollout_id for r in finished if r.status == "succeeded"]
        self.rollouts_failed = sum(1 for r in finished if r.status == "failed")
        self.last_failure = await first_failure(store, finished)
        if self.rollouts_failed:
            reasons = await failure_reasons(store, finished)
            logger.warning(
                "%d of %d rollout(s) failed (%s; the runners' logs have each); e.g. %s",
                self.rollouts_failed,
                len(rollout_ids),
                ", ".join(f"{count} {reason}" for reason, count in reasons.most_common()),
                self.last_failure,
            )
        await self._cancel_late(store, rollout_ids, f"after {self.config.rollout_timeout_s:.0f} s")
        return done

    async def _cancel_late(self, store: LightningStore, rollout_ids: list[str], why: str) -> None:
        """Cancel those of ``rollout_ids`` still queued or running (they would train on a stale policy)."""
        late = await cancel_unfinished(store, rollout_ids)
        if late:
            # Their calls still generating are aborted now, not when their runners notice: the backend must stop
            # generating before the weights change (an orphaned request would span two versions, or outlive them).
            aborted = self._proxy.abort_rollouts(late) if self._proxy is not None else 0
            logger.info(
                "cancelled %d rollout(s) still queued or running %s (%d call(s) aborted)",
                len(late),
                why,
                aborted,
            )

    async def _judged(
        self, store: LightningStore, rollout_ids: list[str], results: list[TransitionResult]
    ) -> tuple[list[TransitionResult], dict[str, float]]:
        """The judge's rewards on ``results`` (`judge_results`; ``LoopConfig.judge``) and its ``judge_*`` metrics."""
        from agentlightning.judge import judge_results  # imported on use: only a run with a judge needs it

        assert self._judge is not None
        return await judge_results(self._judge, store, rollout_ids, results)

    def _transition_config(self) -> TransitionConfig:
        return TransitionConfig(mode=self.config.transition_mode, agent_filter=self.config.agent_filter)

    def _report(
        self, kind: str, rollouts: int, results: Sequence[TransitionResult], t0: float, metrics: dict[str, float]
    ) -> IterationReport:
        return make_report(
            "eval" if kind == "eval" else "train",
            self.iteration,
            self.model_version,
            rollouts,
            results,
            t0,
            metrics,
            self.config.success_reward,
        )

    def _record(self, report: IterationReport) -> None:
        self.history.append(report)
        append_metrics(self.config.output_dir, report)

    # ----- checkpoints -----------------------------------------------------------------------------------

    @property
    def checkpoint_dir(self) -> Path:
        """Where the latest checkpoint lives: ``output_dir/checkpoint``."""
        return self.config.output_dir / "checkpoint"

    @property
    def best_checkpoint_dir(self) -> Path:
        """Where the checkpoint of the best held-out evaluation lives: ``output_dir/checkpoint/best``."""
        return self.checkpoint_dir / BEST_CHECKPOINT

    def save_checkpoint(self, directory: Path | None = None) -> Path:
        """Save the engine's state, then the loop's iteration and model version, into ``directory`` (default:
        `checkpoint_dir`); returns the folder."""
        directory = self.checkpoint_dir if directory is None else directory
        directory.mkdir(parents=True, exist_ok=True)
        self.engine.save_state(directory)
        write_loop_state(directory, self.iteration, self.model_version)  # last: the checkpoint's commit mark
        logger.info(
            "checkpoint saved to %s (iteration %d, model version %d)", directory, self.iteration, self.model_version
        )
        return directory

    def restore(self) -> bool:
        """Load the checkpoint in ``output_dir`` if there is one (before `start`); returns whether one was loaded.

        Raises:
            ValueError: The checkpoint's loop state is unreadable.
            RuntimeError: The loop is already serving.
        """
        if self._proxy is not None:
            raise RuntimeError("restore a checkpoint before the loop starts serving")
        self._restored = True
        state = read_loop_state(self.checkpoint_dir)
        if state is None:
            logger.info("no checkpoint in %s; starting from the engine's initial weights", self.checkpoint_dir)
            return False
        iteration, version = state
        self.engine.load_state(self.checkpoint_dir)
        self.iteration, self.model_version = iteration, version
        logger.info("resumed from %s at iteration %d, model version %d", self.checkpoint_dir, iteration, version)
        return True
