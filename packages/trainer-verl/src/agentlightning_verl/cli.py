"""``agl train --engine verl``: train an ``@agl.rollout`` agent with verl (Ray, FSDP, vLLM rollout servers).

    agl store serve --db runs/verl/store.db --port 4747        # the store runners on any machine reach
    agl train --engine verl --store-url http://127.0.0.1:4747 --agent my_pkg.agent:solve \\
        --model Qwen/Qwen2.5-1.5B --tasks train.jsonl --n-gpus-per-node 8 [--algorithm ppo] \\
        [--verl-override actor_rollout_ref.actor.clip_ratio=0.3]

`VerlEnginePlugin` adds the options only verl has (the cluster's size, the algorithm, vLLM's share of the GPU, verl
batch sizes, any verl setting through ``--verl-override``) to the ones ``agl train`` defines for every engine; it
maps the shared ones onto a `VerlTrainerConfig` (``--tasks-per-iteration`` → ``tasks_per_step``,
``--samples-per-task`` → ``n_rollouts_per_task``, ``--iterations`` → ``total_steps``, ``--max-tokens`` →
``max_response_length``...) and runs `VerlTrainer` on the served store at ``--store-url``, with ``--runners``
``agl runner`` processes on this machine (``--runners 0``: runners started elsewhere). Its options are listed
without verl (``agl train --engine verl --help``); a run needs verl and vLLM (``pip install
'agentlightning-verl[gpu]'``) and says so in one line when they are missing. What verl's engine does not do yet
(several policies, held-out evaluation, Ray-placed runners, one-step-stale rollouts) is refused in one line.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from agentlightning.cli import judge_config, read_task_file
from agentlightning_verl._config import ADV_ESTIMATORS, VerlTrainerConfig

__all__ = ["VerlEnginePlugin", "verl_config"]

logger = logging.getLogger(__name__)

_INSTALL = "pip install 'agentlightning-verl[gpu]'"


class _Refused(Exception):
    """A bad option or a missing install: one line, exit code 2."""


def _overrides(entries: list[str]) -> dict[str, Any]:
    """``--verl-override KEY=VALUE`` entries as `VerlTrainerConfig.overrides` (a value is JSON, else a string)."""
    overrides: dict[str, Any] = {}
    for entry in entries:
        key, sep, text = entry.partition("=")
        if not sep or not key.strip():
            raise _Refused(f"--verl-override takes dotted.key=value, got {entry!r}")
        try:
            overrides[key.strip()] = json.loads(text)
        except ValueError:
            overrides[key.strip()] = text  # a bare word: a string setting (e.g. a path or a name)
    return overrides


def _refuse_unsupported(args: argparse.Namespace) -> None:
    """Shared ``agl train`` options verl's engine cannot honour yet: refused, never silently ignored."""
    if args.policy or args.policies or args.policy_settings or args.default_policy:
        raise _Refused("--engine verl trains one model: several policies (--policy, --policies) need --engine torch")
    if args.val_tasks or args.eval_every:
        raise _Refused("--engine verl has no held-out evaluation yet: drop --val-tasks/--eval-every")
    if args.runners_ray:
        raise _Refused("--engine verl starts its runners here (--runners N) or elsewhere (--runners 0), not with ray")
    if args.max_staleness:
        raise _Refused("--engine verl trains synchronously: verl's rollout servers sleep during the update")
    if args.serve_store or not args.store_url:
        raise _Refused(
            "--engine verl trains on a served store: start `agl store serve --db FILE --port 4747` and give "
            "--store-url http://127.0.0.1:4747 (runners on other machines use the same URL)"
        )
    if getattr(args, "judge", None) is not None and args.judge_mode != "group":
        raise _Refused(
            "--engine verl takes the judge's group scores only (--judge-mode group): step scores need "
            "the per_step credit strategy, which --engine verl does not set yet"
        )
    if args.runners < 0 or args.workers < 1 or args.minutes <= 0:
        raise _Refused("--runners must be 0 or more, --workers at least 1 and --minutes positive")


def verl_config(args: argparse.Namespace) -> VerlTrainerConfig:
    """The `VerlTrainerConfig` of ``agl train --engine verl``'s options (nothing of verl is imported).

    Raises:
        ValueError: An option verl's engine does not support, or settings `VerlTrainerConfig` refuses (one line
            naming the option).
    """
    try:
        _refuse_unsupported(args)
        if hasattr(args, "judge"):
            judge_config(args)  # an unreadable rubric or a bad judge setting: one line now, not after the start
        overrides = _overrides(list(args.verl_override))
    except _Refused as error:
        raise ValueError(str(error)) from None
    try:
        return VerlTrainerConfig(
            model_path=args.model,
            algorithm=args.algorithm,
            n_rollouts_per_task=args.samples_per_task,
            tasks_per_step=args.tasks_per_iteration,
            total_steps=args.iterations,
            lr=args.lr,
            ppo_epochs=args.ppo_epochs,
            entropy_coeff=args.entropy_coef,
            kl_loss_coef=args.kl_coef,
            ppo_mini_batch_size=args.ppo_mini_batch_size or args.tasks_per_iteration,
            micro_batch_size_per_gpu=args.micro_batch_size_per_gpu,
            max_prompt_length=args.max_prompt_length,
            max_response_length=args.max_tokens or 256,
            lora_rank=args.lora_rank,
            rollout_tensor_parallel_size=args.rollout_tp,
            gpu_memory_utilization=args.gpu_memory_utilization,
            nnodes=args.nnodes,
            n_gpus_per_node=args.n_gpus_per_node,
            rollout_timeout_s=args.rollout_timeout,
            overrides=overrides,
        )
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "settings"
        raise ValueError(f"--engine verl: {where}: {first['msg']}") from None


def _require_verl() -> None:
    """verl and vLLM importable here (a run needs both: verl's rollout servers are vLLM), else one line."""
    for module in ("verl", "vllm"):
        if importlib.util.find_spec(module) is None:
            raise _Refused(f"--engine verl needs {module}, which is not installed here: {_INSTALL}")


def _runner_commands(args: argparse.Namespace) -> list[list[str]]:
    """``agl runner`` on this machine, ``--runners`` processes against the served store (its token in the env)."""
    app_dir = str(Path(args.app_dir).resolve())
    command: str | None = getattr(args, "agent_command", None)
    which = ["--agent", args.agent] if command is None else ["--agent-command", command]
    cmd = [sys.executable, "-m", "agentlightning.cli", "runner", "--app-dir", app_dir, *which]
    cmd += ["--store-url", args.store_url, "--workers", str(args.workers)]
    return [cmd for _ in range(args.runners)]


async def _run(args: argparse.Namespace, config: VerlTrainerConfig, tasks: list[dict[str, Any]]) -> dict[str, Any]:
    """`VerlTrainer` on the served store, with the runners this command starts (stopped on every way out)."""
    from agentlightning import ProxySettings
    from agentlightning.cli import guarded, start_runners, stop_children
    from agentlightning.store import StoreClient
    from agentlightning_verl._engine import VerlTrainer

    proxy = ProxySettings(
        host=args.proxy_host, port=args.proxy_port, advertised_url=args.advertise_url, token=args.proxy_token
    )
    time_budget = args.minutes * 60
    judge = judge_config(args) if hasattr(args, "judge") else None  # checked in verl_config
    loop = config.loop_config(
        output_dir=Path(args.output), proxy=proxy, seed=args.seed, time_budget_s=time_budget, judge=judge
    )
    store: Any = StoreClient(args.store_url, token=args.store_token)
    env = {**os.environ, **({"AGL_STORE_TOKEN": args.store_token} if args.store_token else {})}
    runners = start_runners(_runner_commands(args), env=env)
    trainer = VerlTrainer(config, loop=loop)
    try:
        await guarded(runners, trainer.run(store, tasks))
    finally:
        await trainer.stop()
        await asyncio.to_thread(stop_children, runners)  # waits for them to end: off the event loop
    history = trainer.history
    return {"engine": "verl", "iterations": len(history), "model_version": trainer.model_version}


class VerlEnginePlugin:
    """``agl train --engine verl``: an `agentlightning.cli.EnginePlugin` training with `VerlTrainer`."""

    summary = "verl on GPUs: Ray, FSDP actor (and critic for ppo), vLLM rollout servers; needs a served store"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Add verl's own options to ``agl train``'s parser."""
        group = parser.add_argument_group("--engine verl", self.summary)
        group.add_argument("--algorithm", choices=sorted(ADV_ESTIMATORS), default="grpo", help="(default: grpo)")
        group.add_argument("--nnodes", type=int, default=1, help="machines in the Ray cluster (default: 1)")
        group.add_argument("--n-gpus-per-node", type=int, default=1, help="GPUs per machine (default: 1)")
        group.add_argument("--lora-rank", type=int, default=0, help="LoRA rank; 0 trains every weight (default)")
        group.add_argument("--rollout-tp", type=int, default=1, help="vLLM tensor parallel size (default: 1)")
        group.add_argument(
            "--gpu-memory-utilization", type=float, default=0.5, help="vLLM's share of a GPU (default: 0.5)"
        )
        group.add_argument("--max-prompt-length", type=int, default=2048, help="longest prompt in tokens (2048)")
        group.add_argument(
            "--ppo-mini-batch-size", type=int, default=None, help="tasks per optimizer step (default: all of them)"
        )
        group.add_argument("--micro-batch-size-per-gpu", type=int, default=4, help="samples per forward (4)")
        group.add_argument(
            "--verl-override",
            action="append",
            default=[],
            metavar="DOTTED.KEY=VALUE",
            help="any other verl setting (repeatable; a JSON value, else a string), e.g. "
            "actor_rollout_ref.actor.clip_ratio=0.3",
        )

    def train(self, args: argparse.Namespace) -> int:
        """Run ``agl train`` with verl; returns the exit code (2 with one line for bad options or no verl/vLLM)."""
        from agentlightning import run_async

        logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
        try:
            config = verl_config(args)
            tasks = read_task_file(Path(args.tasks), "--tasks")
            _require_verl()
        except (ValueError, _Refused) as error:  # TaskFileError too
            print(f"error: {error}", file=sys.stderr)
            return 2
        from agentlightning.cli import RunnerDied

        try:
            summary = run_async(_run(args, config, tasks))
        except RunnerDied as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            return 130
        sys.stdout.write(json.dumps(summary) + "\n")
        return 0
