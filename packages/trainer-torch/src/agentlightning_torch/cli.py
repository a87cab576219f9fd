"""``agl train``: train an existing ``@agl.rollout`` agent on a Hugging Face model without writing a trainer.

    agl train --agent my_pkg.my_module:my_rollout --model Qwen/Qwen2.5-0.5B-Instruct --tasks train.jsonl \\
        [--val-tasks val.jsonl] [--minutes 30] [--device cuda] [--runners 2] [--lora-rank 16]

The trainer process loads the model, serves it (local backend behind the LLM proxy) and trains it with
`TorchTrainer`; ``--runners`` runner processes run the agent on the rollouts (each JSONL line is one task dict,
passed to the function as it is). The run folder gets the SQLite store, ``metrics.jsonl``, ``reward_curve.png``
and ``checkpoint/`` (a plain ``save_pretrained`` folder). The store is served for the dashboard while it runs.
Bad input (an agent that cannot be imported, a missing model folder, a task file that does not parse, an output
folder it cannot write, a rollout that never calls the LLM) is reported in one line with exit code 2, and a run
folder it created is removed. Ctrl-C or SIGTERM stops the runners (they release their rollouts) and says one line;
the runners and the dashboard's server end with ``agl train`` even when it is killed outright (``kill -9``).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentlightning_torch._train_children import RunnerDied, guarded, start_dashboard, start_runners, stop_children

__all__ = ["UsageError", "load_tasks", "resolve_agent", "train"]

logger = logging.getLogger(__name__)


class UsageError(Exception):
    """Bad input: printed as one line, exit code 2."""


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
    """Tasks from a JSONL file, one JSON object per line (blank lines skipped).

    Raises:
        UsageError: If the file is missing, a line is not a JSON object, or there is no task.
    """
    if not path.is_file():
        raise UsageError(f"{flag} file {str(path)!r} does not exist")
    tasks: list[dict[str, Any]] = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            task = json.loads(line)
        except json.JSONDecodeError as error:
            raise UsageError(f"{path}:{number}: not valid JSON ({error.msg} at column {error.colno})") from None
        if not isinstance(task, dict):
            raise UsageError(f"{path}:{number}: each line must be a JSON object (one task), got {type(task).__name__}")
        tasks.append(task)  # pyright: ignore[reportUnknownArgumentType]
    if not tasks:
        raise UsageError(f"{flag} file {str(path)!r} holds no tasks")
    return tasks


def _check_model(model: str) -> None:
    path = Path(model)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise UsageError(f"model folder {model!r} has no config.json: not a Hugging Face model folder")
        return
    looks_local = model.startswith((".", "/", "~")) or os.sep in model.strip("/").replace("/", "", 1)
    if path.exists() or looks_local or model.count("/") != 1:
        raise UsageError(f"model folder {model!r} does not exist (give a Hugging Face model folder or hub id)")


@dataclass
class _Plan:
    args: argparse.Namespace
    train_tasks: list[dict[str, Any]]
    val_tasks: list[dict[str, Any]]
    output: Path
    policies: Any = None


def _validate(args: argparse.Namespace) -> _Plan:
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
    if args.backend == "vllm" and args.vllm_url is None:
        from agentlightning_torch._vllm_server import VLLMNotInstalledError, find_vllm_python

        try:
            find_vllm_python()
        except VLLMNotInstalledError as error:
            raise UsageError(f"--backend vllm: {error}") from None
    train_tasks = load_tasks(Path(args.tasks), "--tasks")
    val_tasks = load_tasks(Path(args.val_tasks), "--val-tasks") if args.val_tasks else []
    agent = resolve_agent(args.agent, args.app_dir)
    from agentlightning.runner import as_agent

    try:
        as_agent(agent)
    except TypeError as error:
        raise UsageError(f"--agent {args.agent}: {error}") from None
    output = Path(args.output)
    if output.exists() and not output.is_dir():
        raise UsageError(f"--output {str(output)!r} exists and is not a folder")
    _check_writable(output)
    return _Plan(args, train_tasks, val_tasks, output, _policies(args))


def _policies(args: argparse.Namespace) -> Any:
    """The `agentlightning.PolicyMap` of ``--policy`` entries or a ``--policies`` file (``None``: one policy)."""
    from pydantic import ValidationError

    from agentlightning import PolicyMap

    entries: list[str] = list(getattr(args, "policy", None) or [])
    path: str | None = getattr(args, "policies", None)
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
            return PolicyMap.parse(entries, getattr(args, "default_policy", None))
    except (ValueError, ValidationError) as error:
        flag = "--policies" if path is not None else "--policy"
        raise UsageError(f"{flag}: {' '.join(str(error).split())}") from None
    if getattr(args, "default_policy", None):
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


def _free_port(preferred: int) -> int:
    for port in (preferred, 0):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return int(sock.getsockname()[1])
    raise UsageError("no free port for the dashboard")


def _store_serving(args: argparse.Namespace) -> Any:
    """Where this run's store lives and who can reach it (`agl.StoreServing`), from the command line."""
    from pydantic import ValidationError

    import agentlightning as agl

    try:
        return agl.StoreServing(
            serve=args.serve_store,
            url=args.store_url,
            token=args.store_token,
            heartbeat_timeout_s=args.heartbeat_timeout,
        )
    except ValidationError as error:
        raise UsageError("; ".join(str(e["msg"]).removeprefix("Value error, ") for e in error.errors())) from None


def _proxy_settings(args: argparse.Namespace) -> Any:
    """Where the LLM proxy listens and how runners reach it (`agl.ProxySettings`), checked before anything starts."""
    from pydantic import ValidationError

    import agentlightning as agl

    try:
        proxy = agl.ProxySettings(
            host=args.proxy_host, port=args.proxy_port, advertised_url=args.advertise_url, token=args.proxy_token
        )
        proxy.check_exposure()
    except ValidationError as error:
        raise UsageError("; ".join(str(e["msg"]).removeprefix("Value error, ") for e in error.errors())) from None
    except ValueError as error:
        raise UsageError(str(error).splitlines()[0]) from None
    return proxy


def _check_llm_used(report: Any) -> None:
    if report.finished == 0:
        raise UsageError(
            f"none of the {report.rollouts} rollouts succeeded: see the agent's errors above (or the runners did not "
            "start in time: raise --rollout-timeout)"
        )
    if report.calls_per_rollout == 0:
        raise UsageError(
            "the agent's rollouts finished without calling the LLM: point its client at agl.llm_base_url() and use "
            "the model name in resources.llm.model"
        )


def _plot(history: list[Any], path: Path) -> bool:
    try:
        import matplotlib
    except ImportError:
        logger.warning("no reward plot: pip install 'agentlightning-torch[plot]' (matplotlib)")
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    elapsed: list[float] = []
    total = 0.0
    for report in history:
        total += report.seconds
        elapsed.append(total / 60)
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(elapsed, [r.reward_mean for r in history], label="mean sampled reward")
    ax.set_xlabel("RL time (minutes)")
    ax.set_ylabel("reward")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _trainer_config(plan: _Plan) -> Any:
    from pydantic import ValidationError

    from agentlightning_torch._ppo import LoraSettings, PPOConfig
    from agentlightning_torch._trainer_config import TorchTrainerConfig
    from agentlightning_torch._vllm_serving import VLLMSettings

    args = plan.args
    try:
        lora = LoraSettings(r=args.lora_rank, alpha=2 * args.lora_rank) if args.lora_rank else None
        return TorchTrainerConfig(
            model_dir=args.model,
            output_dir=plan.output,
            model_name=args.model_name,
            tool_parser=args.tool_parser,
            device=args.device,
            num_threads=args.threads,
            iterations=args.iterations,
            time_budget_s=args.minutes * 60,
            tasks_per_iteration=args.tasks_per_iteration,
            samples_per_task=args.samples_per_task,
            max_tokens=args.max_tokens,
            rollout_timeout_s=args.rollout_timeout,
            max_staleness=args.max_staleness,
            ppo=PPOConfig(lr=args.lr, lora=lora, num_threads=args.threads),
            seed=args.seed,
            proxy=_proxy_settings(args),
            backend=args.backend,
            vllm=VLLMSettings(url=args.vllm_url, tool_parser_plugin=args.tool_parser_plugin),
            policies=plan.policies,
        )
    except ValidationError as error:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'config'}: {e['msg']}" for e in error.errors())
        raise UsageError(f"invalid setting: {problems}") from None


async def _train(plan: _Plan, console: Any) -> dict[str, Any]:
    from agentlightning_torch._trainer import TorchTrainer

    args = plan.args
    config = _trainer_config(plan)
    serving = _store_serving(args)  # refused here, before anything is written
    plan.output.mkdir(parents=True, exist_ok=True)
    db = plan.output / "store.db"
    (plan.output / "metrics.jsonl").unlink(missing_ok=True)
    if args.quiet:  # no progress bar means none of transformers' either (loading and saving weights)
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()
    try:
        trainer = TorchTrainer(config)
    except (OSError, ValueError) as error:  # a folder without weights or chat template, an unreachable hub id
        raise UsageError(f"cannot load model {args.model!r}: {error}".splitlines()[0]) from None
    opened = await serving.open(db, fresh=True)
    children: list[subprocess.Popen[bytes]] = []
    try:
        return await _run(plan, console, trainer, opened, serving, db, children)
    finally:
        stop_children(children)
        await opened.close()


async def _run(
    plan: _Plan,
    console: Any,
    trainer: Any,
    opened: Any,
    serving: Any,
    db: Path,
    children: list[subprocess.Popen[bytes]],
) -> dict[str, Any]:
    """The run proper; every process it starts is appended to ``children`` (the caller stops them)."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    args = plan.args
    store = opened.store
    loop = asyncio.get_running_loop()
    main_task = asyncio.current_task()
    if main_task is not None:  # SIGTERM ends the run like Ctrl-C: through the cleanup below, not around it
        loop.add_signal_handler(signal.SIGTERM, main_task.cancel)
    dashboard: subprocess.Popen[bytes] | None = None
    if serving.serve is not None:
        console.print(f"store served at {serving.serve} for runners on other machines (dashboard: /ui there)")
    elif serving.url is not None:
        console.print(f"store: {serving.url} (dashboard: {serving.url}/ui)")
    else:
        dashboard, url = start_dashboard(db, _free_port(args.dashboard_port))
        children.append(dashboard)
        console.print(f"store: {db}   dashboard: [bold]{url}[/bold]")
    runners = start_runners(plan.args, opened.runner_args, opened.token)
    children += runners
    budget = args.minutes * 60
    progress = Progress(
        TextColumn("[bold]RL"),
        BarColumn(),
        TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(),
        console=console,
        disable=args.quiet,
    )
    bar = progress.add_task("rl", total=budget, status="starting")
    started = time.monotonic()
    first: list[Any] = []

    def on_iteration(report: Any) -> None:
        if not first:
            first.append(report)
            _check_llm_used(report)
        status = f"it {report.iteration:3d}  reward {report.reward_mean:+.3f}  {report.seconds:.1f}s/it"
        if plan.policies is not None:  # one reward per policy: what each adapter trained on this iteration
            status += "".join(_policy_status(report.metrics, name) for name in plan.policies.trained)
        progress.update(bar, completed=min(time.monotonic() - started, budget), status=status)

    trainer.on_iteration = on_iteration
    before = after = None
    try:
        await trainer.start(store)
        if plan.val_tasks:
            before = await guarded(runners, trainer.evaluate(store, plan.val_tasks))
            _check_llm_used(before)
            console.print(f"validation reward before RL: {before.reward_mean:.3f}")
        started = time.monotonic()
        with progress:
            await guarded(runners, trainer.run(store, plan.train_tasks))
        rl_seconds = time.monotonic() - started
        if plan.val_tasks:
            after = await guarded(runners, trainer.evaluate(store, plan.val_tasks))
    finally:
        # The runners first, while the proxy still answers them (they hand their slots back as they drain), and
        # from a thread: the proxy runs on this loop.
        await asyncio.to_thread(stop_children, children)
        await trainer.stop()
    history = trainer.history
    if not history:
        raise UsageError("no RL iteration finished within the time budget; raise --minutes")
    plot = plan.output / "reward_curve.png"
    tail = history[-5:]
    return {
        "reward_first": round(history[0].reward_mean, 4),
        "reward_last5": round(sum(r.reward_mean for r in tail) / len(tail), 4),
        "val_before": None if before is None else round(before.reward_mean, 4),
        "val_after": None if after is None else round(after.reward_mean, 4),
        "iterations": len(history),
        "rl_seconds": round(rl_seconds, 1),
        "model_version": trainer.model_version,
        "checkpoint": str(trainer.checkpoint_dir),
        "metrics": str(plan.output / "metrics.jsonl"),
        "plot": str(plot) if _plot(history, plot) else None,
    }


def train(args: argparse.Namespace) -> int:
    """Run ``agl train`` with the arguments the core CLI parsed (``agl train --help``); returns the exit code."""
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
        if not existed:
            shutil.rmtree(output, ignore_errors=True)  # nothing half-written
        console.print(f"[red]error:[/red] {error}")
        return 2
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
    sys.stdout.write(json.dumps(summary) + "\n")
    return 0
