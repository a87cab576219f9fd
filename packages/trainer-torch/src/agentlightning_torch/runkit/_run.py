"""`TrainingRun`: a whole training run around a trainer — store, runners, dashboard, evaluations, budgets, cleanup."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentlightning import IterationReport
from agentlightning.cli import cancel_on_sigterm, guarded, stop_children
from agentlightning.loop import held_out_score
from agentlightning_torch.runkit._runner_report import RunnerReport
from agentlightning_torch.runkit._runners import AgentRunners, OnDemandDashboard, free_port
from agentlightning_torch.runkit._setup import UsageError

if TYPE_CHECKING:
    from agentlightning_torch.runkit._ray_runners import RunnerPlace

__all__ = ["RunResult", "RunSettings", "TrainingRun", "breakdown"]


def breakdown(report: IterationReport) -> str:
    """Where an iteration's seconds went (the ``time_*`` figures of ``metrics.jsonl``) and the generation speed:
    ``gen 30.1 s, transitions 0.4 s, update 41.0 s, sync 0.6 s, 95 tok/s``."""
    metrics = report.metrics
    phases = (("gen", "time_rollouts"), ("transitions", "time_batch"), ("update", "time_update"), ("sync", "time_sync"))
    parts = [f"{label} {metrics[key]:.1f} s" for label, key in phases if key in metrics]
    if "tokens_per_s" in metrics:
        parts.append(f"{metrics['tokens_per_s']:.0f} tok/s")
    return ", ".join(parts)


@dataclass(frozen=True)
class RunSettings:
    """What a `TrainingRun` runs besides its trainer (whose config holds the budgets and ``eval_every``).

    Attributes:
        output: The run folder: ``store.db``, ``metrics.jsonl``, ``checkpoint/`` (and ``checkpoint/best``).
        train_tasks: Task inputs to train on.
        val_tasks: Held-out task inputs, evaluated greedily before and after RL and every ``eval_every``
            iterations (empty: no evaluation).
        runners: The runner processes' command.
        processes: Local runner processes (0: runners on other machines, against a served store).
        workers: Concurrent rollouts over all local runner processes (and, as many again, over the Ray runner
            actors: each runs its share).
        serving: Where the store lives (`agentlightning.StoreServing`; ``None``: a SQLite file in ``output``).
        dashboard: Serve the dashboard (``agl store serve`` of the run's file) on ``dashboard_port`` or a free one;
            a store in PostgreSQL shows it on its first store server's ``/ui``.
        dashboard_port: Preferred port of the dashboard.
        quiet: No progress bar.
        ray: `agentlightning.RayRunnerSettings`: runner actors placed by Ray (besides ``processes`` local ones).
    """

    output: Path
    train_tasks: Sequence[Any]
    runners: AgentRunners
    val_tasks: Sequence[Any] = ()
    processes: int = 1
    workers: int = 32
    serving: Any = None
    dashboard: bool = False
    dashboard_port: int = 4747
    quiet: bool = False
    ray: Any = None


@dataclass
class RunResult:
    """What a `TrainingRun` did: the training reports, every held-out evaluation, the best one and the time spent.

    Attributes:
        history: The training iterations' reports.
        evaluations: Every evaluation's report in order (before RL, every ``eval_every``, after RL).
        before: The evaluation before RL (``None`` without held-out tasks).
        after: The evaluation after RL, of the last weights.
        best: The best evaluation (its weights are in ``checkpoint/best``).
        rl_seconds: Wall time of the RL iterations (evaluations during them included).
        checkpoint: The last checkpoint's folder.
        best_checkpoint: The best checkpoint's folder (``None`` without evaluations).
        metric: The held-out figure that ranks evaluations (`LoopConfig.best_metric`).
        extra: Figures a script adds (its own summary fields).
        store: Where the run's store is (the SQLite file, the served URL or the database without its password).
    """

    history: list[IterationReport]
    evaluations: list[IterationReport]
    before: IterationReport | None
    after: IterationReport | None
    best: IterationReport | None
    rl_seconds: float
    checkpoint: Path
    best_checkpoint: Path | None
    metric: str = "reward_mean"
    extra: dict[str, Any] = field(default_factory=dict[str, Any])
    store: str = ""

    def score(self, report: IterationReport) -> float:
        """The held-out figure of an evaluation's report (`LoopConfig.best_metric`)."""
        return held_out_score(report, self.metric)

    @property
    def held_out_points(self) -> list[tuple[int, float]]:
        """``(iteration, held-out figure)`` of every greedy evaluation, in order."""
        return [(r.iteration, self.score(r)) for r in self.evaluations if r.metrics.get("greedy")]

    def _rounded(self, report: IterationReport | None) -> float | None:
        return None if report is None else round(self.score(report), 4)

    def summary(self) -> dict[str, Any]:
        """The figures every run reports in its final JSON line (a script adds its own)."""
        history = self.history
        return {
            "iterations": len(history),
            "seconds": round(self.rl_seconds, 1),
            "seconds_per_iteration": round(sum(r.seconds for r in history) / max(len(history), 1), 3),
            "held_out_metric": self.metric,
            "held_out_before": self._rounded(self.before),
            "held_out_best": self._rounded(self.best),
            "held_out_last": self._rounded(self.after),
            "best_iteration": None if self.best is None else self.best.iteration,
            "held_out_points": [[iteration, round(score, 4)] for iteration, score in self.held_out_points],
            "checkpoint": str(self.checkpoint),
            "best_checkpoint": None if self.best_checkpoint is None else str(self.best_checkpoint),
            "store": self.store,
        }


class TrainingRun:
    """Run a trainer on a store with runner processes, evaluate held-out tasks, stop everything on every way out.

    `execute`: open the store (a fresh SQLite file, or a served one), start the runners (and the dashboard), start
    the trainer, evaluate before RL, train until a budget ends (``iterations`` or ``time_budget_s``; held-out
    evaluations every ``eval_every`` keep ``checkpoint/best``), evaluate after RL, then stop the runners (while the
    proxy still answers them), the trainer and the store. A runner process that dies stops the run
    (`agentlightning.cli.RunnerDied`); SIGTERM ends it like Ctrl-C. A script subclasses it for its own figures:
    `status` (the progress line), `evaluated` (after the evaluations before and after RL) and `finished` (the store
    still open).

    Args:
        trainer: The `agentlightning.RLLoop` to run (a `TorchTrainer`, or an ``RLLoop`` over any engine).
        settings: The run's tasks, runners and store.
        console: A ``rich`` console for the progress and messages (default: stderr).
    """

    def __init__(self, trainer: Any, settings: RunSettings, console: Any = None) -> None:
        from rich.console import Console

        self.trainer = trainer
        self.settings = settings
        self.console = console if console is not None else Console(stderr=True, soft_wrap=True)
        if settings.quiet:  # no progress bar means none of transformers' either (saving checkpoints mid-run)
            from transformers.utils import logging as transformers_logging

            transformers_logging.disable_progress_bar()
        self.store: Any = None
        self.store_location = ""
        """Where the store is (the SQLite file, the served URL or the database without its password)."""
        self.runners: list[subprocess.Popen[bytes]] = []
        self._children: list[subprocess.Popen[bytes]] = []
        self.ray_runners: Any = None
        self.runner_report: RunnerReport | None = None
        self._dashboard: OnDemandDashboard | None = None
        self._progress: Any = None
        self._bar: Any = None
        self._started = time.monotonic()

    # ----- hooks -----------------------------------------------------------------------------------------------

    def status(self, report: IterationReport) -> str:
        """The progress line after an iteration."""
        failed = report.metrics.get("rollouts_failed", 0.0)
        line = f"it {report.iteration:3d}  reward {report.reward_mean:+.3f}  {report.seconds:.1f}s/it"
        line += f" ({breakdown(report)})"
        return line + (f"  [red]{failed:.0f} failed[/]" if failed else "")

    async def evaluated(self, report: IterationReport, when: str) -> None:
        """Called after the evaluation ``before`` and ``after`` RL (the store is open: `store`)."""

    async def finished(self, result: RunResult) -> None:
        """Called once training and evaluations are done, before the store closes (add to ``result.extra``)."""

    def on_iteration(self, report: IterationReport) -> None:
        """After every training iteration: updates the progress bar with `status`."""
        config = self.trainer.config
        done = self.trainer.iteration / config.iterations
        if config.time_budget_s:
            done = max(done, (time.monotonic() - self._started) / config.time_budget_s)
        if self._progress is not None:
            self._progress.update(self._bar, completed=min(done, 1.0), status=self.status(report))
        if self.runner_report is not None:
            self.runner_report.iteration_done(report.iteration)

    async def evaluate(self, *, greedy: bool = True, when: str = "") -> IterationReport:
        """Evaluate the held-out tasks once (guarded by the runners); greedy ones compete for ``checkpoint/best``."""
        report = await self.guard(
            self.trainer.evaluate(self.store, self.settings.val_tasks, greedy=greedy, keep_best=True)
        )
        if when:
            await self.evaluated(report, when)
        return report

    async def guard(self, work: Any) -> Any:
        """Await ``work``, stopping at once with `RunnerDied` if a local runner process exits."""
        return await guarded(self.runners, work)

    # ----- the run ---------------------------------------------------------------------------------------------

    async def execute(self) -> RunResult:
        """The whole run (see the class); returns its result.

        Raises:
            UsageError: No iteration finished within the budget.
            RunnerDied: A local runner process exited.
        """
        import agentlightning as agl

        cancel_on_sigterm()  # a `kill` ends the run like Ctrl-C: through the cleanup below, then one line
        settings = self.settings
        settings.output.mkdir(parents=True, exist_ok=True)
        (settings.output / "metrics.jsonl").unlink(missing_ok=True)
        serving = settings.serving if settings.serving is not None else agl.StoreServing()
        db = settings.output / "store.db"
        try:
            opened = await serving.open(db, fresh=True)
        except (agl.StoreError, ImportError) as error:  # an unreachable or non-empty database, a missing driver
            raise UsageError(str(error).splitlines()[0]) from None
        self.store = opened.store
        self.store_location = serving.describe(db)
        try:
            self._start_children(serving, opened, db)
            watching = self._watch_runners()
            try:
                return await self._train()
            finally:
                watching.cancel()
                if self.runner_report is not None:  # the last iteration's counts, the output so far
                    await self.runner_report.catch_up(self.trainer)
                if self._dashboard is not None:  # no server starts once the children are being stopped
                    self._dashboard.close()
                # The runners first, while the proxy still answers them (they hand their rollouts back as they
                # drain), and from a thread: the proxy runs on this loop.
                await asyncio.to_thread(stop_children, self._children)
                places = await self._ray_places()  # asked while the actors answer; counted once they have stopped
                await asyncio.to_thread(self._stop_ray_runners)
                await self._log_ray_counts(places)
                await self.trainer.stop()
        finally:
            if self.runner_report is not None:
                self.runner_report.close()
            if self._dashboard is not None:
                self._dashboard.close()
            stop_children(self._children)
            await opened.close()

    def _start_children(self, serving: Any, opened: Any, db: Path) -> None:
        settings = self.settings
        if serving.database is not None:
            self._print_database(serving, opened)
        elif serving.serve is not None:
            self.console.print(f"store served at {serving.serve} for runners on other machines (dashboard: /ui there)")
        elif serving.url is not None:
            self.console.print(f"store: {serving.url} (dashboard: {serving.url}/ui)")
        elif settings.dashboard:
            # started when first visited: a run nobody looks at does not pay the server's start
            self._dashboard = OnDemandDashboard(db, free_port(settings.dashboard_port), self._children.append)
            self.console.print(f"store: {db}   dashboard: [bold]{self._dashboard.url}[/bold]")
        if settings.ray is not None:
            self._start_ray_runners(opened)
        if settings.processes:
            self.runners = self._runners().start(opened.runner_args, settings.workers, settings.processes, opened.token)
            self._children += self.runners
        elif settings.ray is None:
            self.console.print("no local runner (--runners 0): waiting for runners on other machines")

    def _runners(self) -> AgentRunners:
        """The runners' settings, their rollout timeout a tenth under the iterations' wait when not set: an agent
        that blocks its worker is then ended by the runner, with the frame it was stuck in, before the iteration
        cancels it without a reason."""
        runners = self.settings.runners
        wait = getattr(getattr(self.trainer, "config", None), "rollout_timeout_s", None)
        if runners.rollout_timeout is None and isinstance(wait, int | float):
            runners = dataclasses.replace(runners, rollout_timeout=0.9 * wait)
        return runners

    def _print_database(self, serving: Any, opened: Any) -> None:
        """Where a PostgreSQL store is, its servers, and the dashboard: the first server's ``/ui`` (it reads the
        database as every server does)."""
        urls = [server.url for server in opened.servers]
        self.console.print(f"store: {self.store_location}, served to the runners by {len(urls)} store server(s)")
        for index, server in enumerate(opened.servers):
            self.console.print(f"store server {index}: {server.url} pid {server.pid}")
        if self.settings.dashboard:
            # the token in the fragment only while the servers are on loopback, with a token made for this run
            token = f"#token={opened.token}" if serving.serve is None and serving.token is None else ""
            self.console.print(f"dashboard: [bold]{urls[0]}/ui{token}[/bold]")

    def _start_ray_runners(self, opened: Any) -> None:
        from agentlightning_torch.runkit._ray_runners import RayRunnerPool, shipped_settings

        settings = self.settings
        pool = RayRunnerPool(shipped_settings(settings.ray, settings.runners.app_dir, settings.output))
        self.ray_runners = pool
        share = max(1, -(-settings.workers // settings.ray.processes))  # settings.workers over all the actors
        cmd = self._runners().command(opened.runner_args, share, 1)
        env = {**settings.runners.env, "OMP_NUM_THREADS": "1", "AGL_STORE_TOKEN": opened.token or ""}
        for name in ("AGL_PROXY_TOKEN", "PYTHONPATH"):
            if os.environ.get(name):
                env[name] = os.environ[name]
        pool.start(cmd, env)
        for place in pool.places():
            self.console.print(
                f"ray runner {place.index}: node {place.node_id} host {place.hostname} pid {place.pid} "
                f"actor {place.actor_pid} cwd {place.cwd}"
            )

    async def _ray_places(self) -> list[RunnerPlace]:
        """Every Ray runner process of the run so far (none without Ray runners, or when the actors do not answer)."""
        pool = self.ray_runners
        if pool is None or not pool.actors:
            return []
        try:
            return await asyncio.to_thread(pool.all_places)
        except Exception as error:  # counts are a report: a failure here must not hide the run's own outcome
            self.console.print(f"ray runner counts: {error}".splitlines()[0])
            return []

    async def _log_ray_counts(self, places: list[RunnerPlace]) -> None:
        """Each Ray runner's attempts, from the store, once the runners have stopped (the in-flight ones ended)."""
        from agentlightning_torch.runkit._ray_runners import runner_counts

        if not places:
            return
        try:
            for index, count in sorted((await runner_counts(self.store, places)).items()):
                self.console.print(
                    f"ray runner {index}: claimed {count['claimed']} finished {count['finished']} "
                    f"failed {count['failed']}"
                )
        except Exception as error:  # counts are a report: a failure here must not hide the run's own outcome
            self.console.print(f"ray runner counts: {error}".splitlines()[0])

    def _watch_runners(self) -> asyncio.Task[None]:
        """The `RunnerReport` of the run's runners, relaying while the run trains (cancel the task to stop it)."""
        settings = self.settings
        remote = settings.ray is not None or not settings.processes  # runners the trainer does not start itself
        self.runner_report = RunnerReport(self.console, self.store, settings.output, self.ray_runners, counts=remote)
        if self.ray_runners is not None:
            self.console.print(f"ray runners' output: 'ray runner I | ...' and {settings.output}/runners/")
        return asyncio.create_task(self.runner_report.watch(self.trainer), name="agl-runner-report")

    def _stop_ray_runners(self) -> None:
        pool = self.ray_runners
        if pool is None:
            return
        try:
            for place in pool.places():
                self.console.print(
                    f"ray runner {place.index}: node {place.node_id} host {place.hostname} pid {place.pid} "
                    f"actor {place.actor_pid} started {place.starts}x"
                )
        except Exception as error:  # a runner that cannot answer any more: it is killed below all the same
            self.console.print(f"ray runners: {error}".splitlines()[0])
        last = pool.stop()
        if self.runner_report is not None:
            self.runner_report.write(last)

    async def _train(self) -> RunResult:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        trainer, settings = self.trainer, self.settings
        trainer.on_iteration = self.on_iteration
        await trainer.start(self.store)
        before = after = None
        metric = trainer.config.best_metric
        if settings.val_tasks:
            tasks = len(settings.val_tasks)
            self.console.print(f"[bold]evaluating[/] the starting policy greedily on {tasks} held-out tasks")
            before = await self.evaluate(when="before")
            self.console.print(f"held-out {metric} before RL: {held_out_score(before, metric):.3f}")
        self._progress = Progress(
            TextColumn("[bold]RL"), BarColumn(), TextColumn("{task.fields[status]}"), TimeElapsedColumn(),
            console=self.console, disable=settings.quiet,
        )  # fmt: skip
        self._bar = self._progress.add_task("rl", total=1.0, status="starting")
        self._started = time.monotonic()
        with self._progress:
            await self.guard(trainer.run(self.store, settings.train_tasks, settings.val_tasks))
        rl_seconds = time.monotonic() - self._started
        if not trainer.history:
            raise UsageError("no RL iteration finished within the time budget; raise --minutes")
        if settings.val_tasks:
            after = await self.evaluate(when="after")
        result = RunResult(
            history=list(trainer.history),
            evaluations=list(trainer.evaluations),
            before=before,
            after=after,
            best=trainer.best,
            rl_seconds=rl_seconds,
            checkpoint=trainer.checkpoint_dir,
            best_checkpoint=trainer.best_checkpoint_dir if trainer.best is not None else None,
            metric=metric,
            store=self.store_location,
        )
        await self.finished(result)
        return result
