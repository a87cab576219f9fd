"""``agl train``: train an existing ``@agl.rollout`` agent on a Hugging Face model without writing a trainer.

    agl train --agent my_pkg.my_module:my_rollout --model Qwen/Qwen2.5-0.5B-Instruct --tasks train.jsonl \\
        [--val-tasks val.jsonl] [--minutes 30] [--device cuda] [--runners 2] [--lora-rank 16]

`TorchEnginePlugin` is the engine ``torch`` of ``agl train`` (``agl train --engine torch --help``): its `TorchSpec` adds
the options only this engine has (``--device``, ``--threads``, ``--lora-rank``, ``--backend``, ``--vllm-url``...) to the
ones the core's ``agl train`` defines for every engine. The trainer process loads the model, serves it (local backend
behind the LLM proxy) and trains it with `TorchTrainer`; ``--runners`` runner processes run the agent on the rollouts
(each JSONL line is one task dict, passed to the function as it is). The run folder gets the SQLite store,
``metrics.jsonl``, ``reward_curve.png`` and ``checkpoint/`` (a plain ``save_pretrained`` folder). The store is served
for the dashboard while it runs. Bad input (an agent that cannot be imported, a missing model folder, a task file that
does not parse, an output folder it cannot write, a rollout that never calls the LLM) is reported in one line with exit
code 2, and a run folder it created is removed. Ctrl-C or SIGTERM stops the runners (they release their rollouts) and
says one line; the runners and the dashboard's server end with ``agl train`` even when it is killed outright (``kill
-9``).
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentlightning import IterationReport
from agentlightning.cli import RunnerDied, RunSpec, stop_children
from agentlightning_torch.runkit import (
    TORCH_CAPABILITIES,
    AgentRunners,
    RunSettings,
    TorchSpec,
    TrainingRun,
    UsageError,
    load_jsonl_tasks,
    plot_run,
    proxy_settings,
    ray_settings,
    serving_death,
    start_dashboard,
    store_serving,
    total_workers,
    trainer_config,
)

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "TorchEnginePlugin",
    "UsageError",
    "load_tasks",
    "resolve_agent",
    "start_dashboard",
    "stop_children",
    "token_budget",
    "train",
]

logger = logging.getLogger(__name__)


def resolve_agent(spec: str, app_dir: str | Path = ".") -> Any:
    """The agent function named by ``module:function`` (``app_dir`` first on ``sys.path``).

    Raises:
        UsageError: With a one-line reason when the spec is malformed or names nothing callable.
    """
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise UsageError(f"--agent must look like module:function (e.g. my_pkg.agent:solve), got {spec!r}")
    path = str(Path(app_dir).resolve())
    if path in sys.path:  # first, even when it is already further down: the app's own module wins
        sys.path.remove(path)
    sys.path.insert(0, path)
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise UsageError(f"cannot import module {module_name!r} for --agent (from {path}): {error}") from None
    target: Any = module
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise UsageError(f"module {module_name!r} has no function {attribute!r} (--agent {spec})")
        target = getattr(target, part)
    if not callable(target):
        raise UsageError(f"--agent {spec} is not a function")
    return target


def load_tasks(path: Path, flag: str) -> list[dict[str, Any]]:
    """Tasks from a JSONL file, one JSON object per line (`agentlightning_torch.runkit.load_jsonl_tasks`).

    Raises:
        UsageError: If the file is missing, a line is not a JSON object, or there is no task.
    """
    return load_jsonl_tasks(path, flag)


def _check_model(model: str) -> None:
    path = Path(model)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise UsageError(f"model folder {model!r} has no config.json: not a Hugging Face model folder")
        return
    looks_local = model.startswith((".", "/", "~")) or os.sep in model.strip("/").replace("/", "", 1)
    if path.exists() or looks_local or model.count("/") != 1:
        raise UsageError(f"model folder {model!r} does not exist (give a Hugging Face model folder or hub id)")


DEFAULT_MAX_TOKENS = 256
"""``--max-tokens`` when not given, for a model whose context holds four times as much (else a quarter of it)."""


def _model_context(model: str) -> int | None:
    """The context length of a model folder (``max_position_embeddings`` in its config.json); ``None``: unknown."""
    config = Path(model) / "config.json"
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # a hub id, or a config the trainer's own load will name
    if not isinstance(data, dict):
        return None
    text: Any = data.get("text_config") if "max_position_embeddings" not in data else data
    value = text.get("max_position_embeddings") if isinstance(text, dict) else None
    return value if isinstance(value, int) and value > 1 else None


def token_budget(requested: int | None, context: int | None) -> int:
    """Most tokens per LLM call: ``--max-tokens`` as given, or a default that fits the model's ``context``.

    The backend refuses a call whose prompt plus ``max_tokens`` exceeds the context (400, as vLLM does), so the
    default is `DEFAULT_MAX_TOKENS`, or a quarter of the context when that is less (said once in the log): the rest
    is left for the prompts, which grow with an agent's turns.

    Raises:
        UsageError: ``requested`` is below 1, or leaves no room for any prompt in ``context``.
    """
    if requested is not None:
        if requested < 1:
            raise UsageError(f"--max-tokens must be at least 1, got {requested}")
        if context is not None and requested >= context:
            raise UsageError(
                f"--max-tokens {requested} leaves no room for a prompt in the model's context of {context} tokens: "
                f"give less (a quarter of it, {max(1, context // 4)}, leaves the rest for the prompts)"
            )
        return requested
    if context is None or context >= 4 * DEFAULT_MAX_TOKENS:
        return DEFAULT_MAX_TOKENS
    budget = max(1, context // 4)
    logger.warning(
        "--max-tokens not given: %d tokens per LLM call, a quarter of the model's context of %d tokens (the "
        "default %d leaves too little room for the prompts)",
        budget,
        context,
        DEFAULT_MAX_TOKENS,
    )
    return budget


@dataclass
class _Plan:
    spec: TorchSpec
    train_tasks: list[dict[str, Any]]
    val_tasks: list[dict[str, Any]]
    output: Path
    policies: Any = None
    max_tokens: int = DEFAULT_MAX_TOKENS


def _validate(args: TorchSpec) -> _Plan:
    if args.minutes <= 0:
        raise UsageError(f"--minutes must be positive, got {args.minutes}")
    if args.runners < 0:
        raise UsageError(f"--runners must be 0 or more, got {args.runners}")
    for flag, value in (("--workers", args.workers), ("--iterations", args.iterations)):
        if value < 1:
            raise UsageError(f"{flag} must be at least 1, got {value}")
    if args.lora_rank is not None and args.lora_rank < 1:
        raise UsageError(f"--lora-rank must be at least 1, got {args.lora_rank}")
    if args.device != "cpu" and not args.device.startswith("cuda"):
        raise UsageError(f"--device must be cpu, cuda or cuda:N, got {args.device!r}")
    _check_model(args.model)
    max_tokens = token_budget(args.max_tokens, _model_context(args.model))
    if args.vllm_url is not None and args.backend != "vllm":
        raise UsageError("--vllm-url needs --backend vllm (the embedded backend would serve, the URL unused)")
    if args.backend == "vllm" and args.vllm_url is None:
        from agentlightning_torch.vllm._server import VLLMNotInstalledError, find_vllm_python

        try:
            find_vllm_python()
        except VLLMNotInstalledError as error:
            raise UsageError(f"--backend vllm: {error}") from None
    train_tasks = load_tasks(Path(args.tasks), "--tasks")
    val_tasks = load_tasks(Path(args.val_tasks), "--val-tasks") if args.val_tasks else []
    _check_agent(args)
    output = Path(args.output)
    if output.exists() and not output.is_dir():
        raise UsageError(f"--output {str(output)!r} exists and is not a folder")
    _check_writable(output)
    return _Plan(args, train_tasks, val_tasks, output, _policies(args), max_tokens)


def _check_agent(args: TorchSpec) -> None:
    """Refuse an ``--agent`` that cannot be imported or called, or an ``--agent-command`` that cannot run."""
    if args.agent_command is not None:
        from agentlightning.runner import CommandAgent

        try:
            CommandAgent(args.agent_command, cwd=args.app_dir, timeout=args.agent_timeout)
        except ValueError as error:
            raise UsageError(f"--agent-command: {error}") from None
        return
    agent = resolve_agent(args.agent or "", args.app_dir)
    from agentlightning.runner import as_agent

    try:
        as_agent(agent)
    except TypeError as error:
        raise UsageError(f"--agent {args.agent}: {error}") from None


def _policies(args: TorchSpec) -> Any:
    """The `agentlightning.PolicyMap` of ``--policy`` entries or a ``--policies`` file (``None``: one policy)."""
    from pydantic import ValidationError

    from agentlightning import PolicyMap

    entries, path = list(args.policy), args.policies
    if path is not None and entries:
        raise UsageError("give the policy map once: --policy entries or a --policies file, not both")
    try:
        if path is not None:
            try:
                text = Path(path).read_text(encoding="utf-8")
            except OSError as error:
                raise UsageError(f"--policies {path!r}: {error.strerror or error}") from None
            return PolicyMap.model_validate_json(text)
        if entries:
            return PolicyMap.parse(entries, args.default_policy)
    except (ValueError, ValidationError) as error:
        flag = "--policies" if path is not None else "--policy"
        raise UsageError(f"{flag}: {' '.join(str(error).split())}") from None
    if args.default_policy:
        raise UsageError("--default-policy needs --policy entries")
    return None


def _policy_status(metrics: dict[str, float], name: str) -> str:
    reward = metrics.get(f"policy/{name}/reward_mean")
    return f"  {name} {reward:+.3f}" if reward is not None else f"  {name} -"


def _check_writable(output: Path) -> None:
    """Refuse an ``--output`` this process cannot write, before the model is loaded (creates the folder)."""
    try:
        output.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=output):
            pass
    except OSError as error:
        raise UsageError(f"cannot write to --output {str(output)!r}: {error.strerror or error}") from None


def _keep_evidence(output: Path, existed: bool, console: Any) -> None:
    """After a failed run: keep its store (what its rollouts did) and say where; a folder holding nothing of the
    run's is removed when this run made it (a refusal before anything started)."""
    store = output / "store.db"
    if store.exists():
        console.print(
            f"the run's store is kept: {store} (look at its rollouts and their errors: agl store serve --db {store}, "
            "then open the /ui address it prints)"
        )
    elif not existed:
        shutil.rmtree(output, ignore_errors=True)  # nothing half-written


def _check_llm_used(report: Any, failure: str | None) -> None:
    """Refuse a run whose first iteration (or evaluation) shows an agent that cannot train: ``failure`` is why one of
    its rollouts failed (`agentlightning.RLLoop.last_failure`)."""
    if report.finished == 0:
        why = f"one failed with {failure}" if failure else "the runners did not start in time? raise --rollout-timeout"
        raise UsageError(f"none of the {report.rollouts} rollouts succeeded ({why}); the runners' log above has more")
    if report.calls_per_rollout == 0:
        raise UsageError(
            "the agent's rollouts finished without calling the LLM: point its client at agl.llm_base_url() and use "
            "the model name in resources.llm.model"
        )


def _trainer_config(plan: _Plan) -> Any:
    from agentlightning_torch.models._lora import LoRASettings
    from agentlightning_torch.vllm._serving import VLLMSettings

    args = plan.spec
    lora = LoRASettings(r=args.lora_rank, alpha=2 * args.lora_rank) if args.lora_rank else None
    return trainer_config(
        args,
        model_dir=args.model,
        model_name=args.model_name,
        tool_parser=args.tool_parser,
        max_tokens=plan.max_tokens,
        max_staleness=args.max_staleness,
        checkpoint_every=25,
        ppo_settings={"lora": lora},
        proxy=proxy_settings(args),
        backend=args.backend,
        vllm=VLLMSettings(url=args.vllm_url, tool_parser_plugin=args.tool_parser_plugin),
        policies=plan.policies,
    )


class _AglTrainRun(TrainingRun):
    """`TrainingRun` that refuses, in one line, an agent whose rollouts fail or never call the LLM."""

    checked = False
    policies: Any = None  # the run's PolicyMap: the progress line shows each trained policy's reward

    def status(self, report: IterationReport) -> str:
        line = super().status(report)
        if self.policies is not None:  # one reward per policy: what each adapter trained on this iteration
            line += "".join(_policy_status(report.metrics, name) for name in self.policies.trained)
        return line

    def on_iteration(self, report: IterationReport) -> None:
        if not self.checked:  # the first iteration (a resumed run's first too)
            self.checked = True
            _check_llm_used(report, self.trainer.last_failure)
        super().on_iteration(report)

    async def evaluated(self, report: IterationReport, when: str) -> None:
        if when == "before":
            _check_llm_used(report, self.trainer.last_failure)


async def _train(plan: _Plan, console: Any) -> dict[str, Any]:
    from agentlightning_torch.training._trainer import TorchTrainer

    args = plan.spec
    config = _trainer_config(plan)
    serving = store_serving(args)  # refused here, before anything is written
    if args.quiet:  # no progress bar means none of transformers' either (loading and saving weights)
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()
    try:
        trainer = TorchTrainer(config)
    except (OSError, ValueError) as error:  # a folder without weights or chat template, an unreachable hub id
        raise UsageError(f"cannot load model {args.model!r}: {error}".splitlines()[0]) from None
    runners = AgentRunners(
        args.agent or "", app_dir=Path(args.app_dir), agent_command=args.agent_command, agent_timeout=args.agent_timeout
    )
    settings = RunSettings(
        output=plan.output,
        train_tasks=plan.train_tasks,
        val_tasks=plan.val_tasks,
        runners=runners,
        processes=args.runners,
        # --workers is per runner process (a Ray actor too)
        workers=total_workers(args),
        serving=serving,
        dashboard=True,
        dashboard_port=args.dashboard_port,
        quiet=args.quiet,
        ray=ray_settings(args),
    )
    run = _AglTrainRun(trainer, settings, console)
    run.policies = plan.policies
    result = await run.execute()
    plot = plan.output / "reward_curve.png"
    history = result.history
    tail = history[-5:]
    return {
        **result.summary(),
        "reward_first": round(history[0].reward_mean, 4),
        "reward_last5": round(sum(r.reward_mean for r in tail) / len(tail), 4),
        "val_before": result.summary()["held_out_before"],
        "val_after": result.summary()["held_out_last"],
        "rl_seconds": round(result.rl_seconds, 1),
        "model_version": trainer.model_version,
        "metrics": str(plan.output / "metrics.jsonl"),
        "plot": str(plot) if plot_run(result, plot, title=f"agl train: {args.agent or args.agent_command}") else None,
    }


def train(args: TorchSpec) -> int:
    """Run ``agl train`` with the spec the core CLI parsed (``agl train --help``); returns the exit code."""
    from rich.console import Console

    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    console = Console(stderr=True, soft_wrap=True)
    output = Path(args.output)
    existed = output.exists()
    try:
        plan = _validate(args)
        from agentlightning import run_async  # uvloop when installed

        summary = run_async(_train(plan, console))
    except (UsageError, RunnerDied) as error:
        console.print(f"[red]error:[/red] {serving_death() or error}")
        _keep_evidence(output, existed, console)
        return 2
    except Exception:
        death = serving_death()
        if death is None:
            raise
        console.print(f"[red]error:[/red] {death}")  # the cause; the connection errors that followed are noise
        return 1
    except KeyboardInterrupt:
        console.print("interrupted")
        return 130
    except asyncio.CancelledError:  # SIGTERM
        console.print("terminated")
        return 143
    console.print(
        f"{summary['iterations']} iterations in {summary['rl_seconds']:.0f} s; reward {summary['reward_first']:+.3f}"
        f" -> {summary['reward_last5']:+.3f}; checkpoint: {summary['checkpoint']}"
    )
    if summary["best_checkpoint"] is not None:
        console.print(
            f"held-out {summary['held_out_metric']}: before {summary['held_out_before']:.3f}, best "
            f"{summary['held_out_best']:.3f} (iteration {summary['best_iteration']}, {summary['best_checkpoint']}), "
            f"last {summary['held_out_last']:.3f}"
        )
    sys.stdout.write(json.dumps(summary) + "\n")
    return 0


class TorchEnginePlugin:
    """``agl train --engine torch`` (the default): an `agentlightning.cli.EnginePlugin` training with `TorchTrainer`.

    Registered in the ``agentlightning.engines`` entry points; its spec is `TorchSpec`: ``agl train``'s shared
    options, all honoured (`TORCH_CAPABILITIES`), and the torch engine's own (device, threads, LoRA, the serving
    backend and its tool-call parser).
    """

    summary = "one machine, CPU or one GPU: a plain PyTorch PPO/GRPO step, the embedded backend or vLLM, LoRA"

    spec = TorchSpec
    capabilities = TORCH_CAPABILITIES

    def train(self, spec: RunSpec) -> int:
        """Run ``agl train`` with the torch engine (`train`) on ``spec``, a `TorchSpec`; returns the exit code."""
        if not isinstance(spec, TorchSpec):
            raise TypeError(f"the torch engine trains a TorchSpec, got {type(spec).__name__}")
        return train(spec)

    def doctor(self, spec: RunSpec, round: Any) -> int:
        """Run ``agl doctor``: a few groups of rollouts (``round``, a `agentlightning.cli.DoctorRound`) through this
        engine's ``agl train`` path for ``spec``, a `TorchSpec`, checked."""
        from agentlightning_torch.doctor_cli import doctor

        if not isinstance(spec, TorchSpec):
            raise TypeError(f"the torch engine's doctor takes a TorchSpec, got {type(spec).__name__}")
        return doctor(spec, round)

    def doctor_model(self, model: str) -> tuple[Any, int | None]:
        """``agl doctor --store --model``: the model's own chat template and its context length."""
        from agentlightning_torch.doctor_cli import doctor_model

        return doctor_model(model)
