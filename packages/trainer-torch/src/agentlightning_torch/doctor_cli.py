"""``agl doctor`` on the torch engine: ``agl train``'s run (store, runner processes, served model, LLM proxy) for a
few groups of rollouts, nothing trained, then `agentlightning.doctor.diagnose` of what the store got.

``--model toy`` is the quickstart's shipped tiny tool-calling model (``examples/calc/checkpoint``, its ``calc``
tool-call parser), found through ``$AGL_TOY_MODEL`` or the project's ``examples`` folder, so the check runs
without any weights of the user's.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from agentlightning.cli import DoctorRound
from agentlightning_torch.runkit import AgentRunners, RunSettings, TorchSpec, TrainingRun, UsageError
from agentlightning_torch.runkit._run import RunResult

__all__ = ["TOY_MODEL_ENV", "doctor", "doctor_model", "toy_model"]

logger = logging.getLogger(__name__)

TOY_MODEL_ENV = "AGL_TOY_MODEL"
"""Environment variable naming the folder of ``--model toy`` (default: the project's ``examples/calc/checkpoint``)."""


def toy_model() -> Path:
    """The folder of ``--model toy``: ``$AGL_TOY_MODEL``, else ``examples/calc/checkpoint`` above this package or
    the working directory.

    Raises:
        UsageError: None of them holds the model.
    """
    named = os.environ.get(TOY_MODEL_ENV)
    if named:
        if not (Path(named) / "config.json").is_file():
            raise UsageError(f"${TOY_MODEL_ENV}={named!r} is not a model folder (no config.json)")
        return Path(named)
    for start in (Path(__file__).resolve(), Path.cwd().resolve()):
        for folder in (start, *start.parents):
            candidate = folder / "examples" / "calc" / "checkpoint"
            if (candidate / "config.json").is_file():
                return candidate
    raise UsageError(
        f"--model toy: the toy model (examples/calc/checkpoint of the agent-lightning repository) was not found; "
        f"set ${TOY_MODEL_ENV} to its folder, or give --model a Hugging Face model folder"
    )


def doctor_model(model: str) -> tuple[Any, int | None]:
    """The model's own chat template (`agentlightning.doctor.ChatRenderer`) and context length, for ``--store``."""
    from transformers import AutoTokenizer

    from agentlightning_torch.cli import _model_context  # pyright: ignore[reportPrivateUsage]
    from agentlightning_torch.models import HFChatTemplate

    folder = str(toy_model()) if model == "toy" else model
    tokenizer: Any = AutoTokenizer.from_pretrained(folder)  # pyright: ignore[reportUnknownMemberType]
    return HFChatTemplate(tokenizer), _model_context(folder)


def _pick(tasks: list[Any], n: int) -> list[Any]:
    """The first ``n`` tasks (the file's tasks again from the start when it has fewer)."""
    return [tasks[i % len(tasks)] for i in range(n)]


class _DoctorRun(TrainingRun):
    """`TrainingRun` whose training is one round of groups of sampled rollouts, then the doctor's checks."""

    report: Any = None
    renderer: Any = None
    context: int | None = None
    agent_filter: list[str] | None = None
    samples: int = 4
    timeout: float = 600.0

    async def _train(self) -> RunResult:
        import agentlightning as agl
        from agentlightning.doctor import diagnose

        trainer, store = self.trainer, self.store
        await trainer.start(store)
        resources_id = trainer.resources("sample").resources_id
        prefix = f"doctor-{time.time_ns()}"
        requests = [
            agl.RolloutRequest(
                input=task,
                rollout_id=f"{prefix}-t{t}-s{s}",
                group_id=f"{prefix}-t{t}",
                mode="train",
                resources_id=resources_id,
            )
            for t, task in enumerate(self.settings.train_tasks)
            for s in range(self.samples)
        ]
        ids = [r.rollout_id for r in await store.enqueue_rollouts(requests)]
        self.console.print(f"[bold]agl doctor[/]: {len(ids)} rollouts ({len(requests) // self.samples} tasks x "
                           f"{self.samples}) through agl train's runner, proxy and store")  # fmt: skip
        await self.guard(store.wait_for_rollouts(ids, timeout=self.timeout))
        await trainer.proxy.flush()
        self.report = await diagnose(
            store, ids, renderer=self.renderer, context=self.context, agent_filter=self.agent_filter
        )
        return RunResult([], [], None, None, None, 0.0, trainer.checkpoint_dir, None, store=self.store_location)


def _prepare(spec: TorchSpec, args: DoctorRound, output: Path) -> Any:
    """``agl train``'s validation of the options, set for a doctor's round (the toy model, budgets, no output)."""
    from agentlightning_torch.cli import _validate  # pyright: ignore[reportPrivateUsage]

    round_: dict[str, Any] = {"tasks_per_iteration": args.doctor_tasks, "samples_per_task": args.samples}
    round_.update(iterations=1, output=output, quiet=True)
    if spec.model == "toy":
        round_["model"] = str(toy_model())
        if spec.tool_parser is None:
            round_["tool_parser"] = "calc"  # the toy model writes CALC(<expr>)
    return _validate(spec.model_copy(update=round_))


async def _diagnose(plan: Any, args: DoctorRound, console: Any) -> Any:
    from agentlightning_torch.cli import _model_context, _trainer_config  # pyright: ignore[reportPrivateUsage]
    from agentlightning_torch.runkit import store_serving
    from agentlightning_torch.training._trainer import TorchTrainer

    spec: TorchSpec = plan.spec
    renderer, context = doctor_model(spec.model)
    config = _trainer_config(plan)
    try:
        trainer = TorchTrainer(config)
    except (OSError, ValueError) as error:
        raise UsageError(f"cannot load model {spec.model!r}: {error}".splitlines()[0]) from None
    rollouts = args.doctor_tasks * args.samples
    settings = RunSettings(
        output=plan.output,
        train_tasks=_pick(plan.train_tasks, args.doctor_tasks),
        runners=AgentRunners(
            spec.agent or "",
            app_dir=Path(spec.app_dir),
            agent_command=spec.agent_command,
            agent_timeout=spec.agent_timeout,
        ),
        processes=max(spec.runners, 1),
        workers=min(spec.workers, rollouts),
        serving=store_serving(spec),
        quiet=True,
    )
    run = _DoctorRun(trainer, settings, console)
    run.renderer, run.context = renderer, context or _model_context(spec.model)
    run.agent_filter, run.samples, run.timeout = args.agent_filter, args.samples, spec.rollout_timeout
    await run.execute()
    return run.report


def doctor(spec: TorchSpec, args: DoctorRound) -> int:
    """Run ``agl doctor`` on the torch engine: ``agl train``'s options (``spec``) and the doctor's round (``args``),
    as the core CLI parsed them; returns the exit code."""
    from rich.console import Console

    from agentlightning import run_async
    from agentlightning.cli import RunnerDied
    from agentlightning.doctor import show_report

    logging.basicConfig(level=spec.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    console = Console(stderr=True, soft_wrap=True)
    output = Path(tempfile.mkdtemp(prefix="agl-doctor-"))
    started = time.monotonic()
    try:
        plan = _prepare(spec, args, output)
        report = run_async(_diagnose(plan, args, console))
    except (UsageError, RunnerDied) as error:
        console.print(f"[red]agl doctor: could not run:[/red] {error}")
        shutil.rmtree(output, ignore_errors=True)
        return 2
    except (KeyboardInterrupt, asyncio.CancelledError):
        console.print("interrupted")
        shutil.rmtree(output, ignore_errors=True)
        return 130
    code = show_report(report, args.as_json)
    console.print(f"agl doctor: {time.monotonic() - started:.1f} s")
    if code:
        console.print(f"the rollouts' store is kept: {output / 'store.db'} (agl doctor --store it, or agl store serve)")
    else:
        shutil.rmtree(output, ignore_errors=True)
    return code
