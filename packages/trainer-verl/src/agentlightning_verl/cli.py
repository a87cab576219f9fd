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

import asyncio
import importlib.util
import json
import logging
import os
import sys
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, ValidationError

from agentlightning.cli import (
    Cli,
    EngineCapabilities,
    EngineRefusal,
    RunSpec,
    judge_config,
    read_task_file,
    refuse_unhonoured,
)
from agentlightning_verl._config import AlgorithmName, VerlTrainerConfig

__all__ = ["VERL_CAPABILITIES", "VerlEnginePlugin", "VerlSpec", "runner_commands", "verl_config"]

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


class VerlSpec(RunSpec):
    """`agentlightning.cli.RunSpec` and verl's own options: the cluster's size, the algorithm, vLLM's share of the
    GPU, verl's batch sizes, and any verl setting through ``--verl-override``."""

    algorithm: AlgorithmName = Field("grpo", description="the advantage estimator (ppo: GAE with a critic)")
    nnodes: int = Field(1, description="machines in the Ray cluster")
    n_gpus_per_node: int = Field(1, description="GPUs per machine")
    lora_rank: int = Field(0, description="LoRA rank; 0 trains every weight")
    rollout_tp: int = Field(1, description="vLLM tensor parallel size")
    gpu_memory_utilization: float = Field(0.5, description="vLLM's share of a GPU")
    max_prompt_length: int = Field(2048, description="longest prompt in tokens")
    ppo_mini_batch_size: int | None = Field(None, description="tasks per optimizer step (default: all of them)")
    micro_batch_size_per_gpu: int = Field(4, description="samples per forward")
    verl_override: Annotated[list[str], Cli(metavar="DOTTED.KEY=VALUE")] = Field(
        default_factory=list,
        description="any other verl setting (repeatable; a JSON value, else a string), e.g. "
        "actor_rollout_ref.actor.clip_ratio=0.3",
    )


_POLICIES = "verl's engine trains one model: several policies (--policy, --policies) need --engine torch"
_HELD_OUT = "verl's engine has no held-out evaluation yet: drop --val-tasks/--eval-every"
_RAY = "verl's engine starts its runners here (--runners N) or elsewhere (--runners 0), not with ray"
_SERVED = "verl's engine trains on the served store at --store-url (start it with `agl store serve`)"

_REFUSALS: dict[str, str] = {
    "val_tasks": _HELD_OUT,
    "eval_every": _HELD_OUT,
    **dict.fromkeys(("runners_ray", "ray_address", "runner_processes", "runner_cpus", "ray_placement"), _RAY),
    "max_staleness": "verl's engine trains synchronously: verl's rollout servers sleep during the update",
    **dict.fromkeys(("policy", "default_policy", "policies", "policy_settings"), _POLICIES),
    "serve_store": f"{_SERVED}, not one it serves itself",
    "store": f"{_SERVED}, not a database of its own (serve the database with `agl store serve`)",
    "store_servers": f"{_SERVED}: the store servers are the ones you start",
    "heartbeat_timeout": f"{_SERVED}: set it there (agl store serve --heartbeat-timeout)",
    "dashboard_port": f"{_SERVED}: its dashboard is that server's /ui",
    "quiet": "verl's engine shows no progress bar (quiet verl's own logging with --log-level)",
}
"""Why verl's engine refuses each shared option it cannot honour."""

_HONOURS = (
    "agent", "agent_command", "agent_timeout", "app_dir", "model", "tasks", "minutes", "iterations", "runners",
    "workers", "output", "tasks_per_iteration", "samples_per_task", "max_tokens", "rollout_timeout", "lr", "kl_coef",
    "entropy_coef", "ppo_epochs", "seed", "store_url", "store_token", "proxy_host", "proxy_port", "advertise_url",
    "proxy_token", "judge", "judge_model", "rubric", "judge_mode", "judge_weight", "judge_max_calls",
    "judge_max_tokens", "judge_timeout", "judge_api_key", "log_level",
)  # fmt: skip
"""The shared options verl's engine reads and acts on (a shared option added later is refused until it is here)."""

VERL_CAPABILITIES = EngineCapabilities(honours=frozenset(_HONOURS), refusals=_REFUSALS)
"""The shared options verl's engine honours, and why it refuses each other one (before Ray or verl start)."""


def _refuse_unsupported(spec: VerlSpec) -> None:
    """What verl's engine cannot do with an honoured option's value: refused, never silently ignored."""
    if not spec.store_url:
        raise _Refused(
            "--engine verl trains on a served store: start `agl store serve --db FILE --port 4747` and give "
            "--store-url http://127.0.0.1:4747 (runners on other machines use the same URL)"
        )
    if spec.judge is not None and spec.judge_mode != "group":
        raise _Refused(
            "--engine verl takes the judge's group scores only (--judge-mode group): step scores need "
            "the per_step credit strategy, which --engine verl does not set yet"
        )
    if spec.runners < 0 or spec.workers < 1 or spec.minutes <= 0:
        raise _Refused("--runners must be 0 or more, --workers at least 1 and --minutes positive")


def verl_config(args: VerlSpec) -> VerlTrainerConfig:
    """The `VerlTrainerConfig` of ``agl train --engine verl``'s options (nothing of verl is imported).

    Raises:
        ValueError: An option verl's engine does not support, or settings `VerlTrainerConfig` refuses (one line
            naming the option).
    """
    try:
        refuse_unhonoured(args, "verl", VERL_CAPABILITIES)  # agl train did; a caller of this function too
        _refuse_unsupported(args)
        judge_config(args)  # an unreadable rubric or a bad judge setting: one line now, not after the start
        overrides = _overrides(list(args.verl_override))
    except (_Refused, EngineRefusal) as error:
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


def runner_commands(args: VerlSpec) -> list[list[str]]:
    """``agl runner`` on this machine, ``--runners`` processes against the served store (its token in the env)."""
    app_dir = str(Path(args.app_dir).resolve())
    command = args.agent_command
    which = ["--agent", args.agent or ""] if command is None else ["--agent-command", command]
    if command is not None and args.agent_timeout is not None:
        which += ["--agent-timeout", str(args.agent_timeout)]
    cmd = [sys.executable, "-m", "agentlightning.cli", "runner", "--app-dir", app_dir, *which]
    cmd += ["--store-url", args.store_url or "", "--workers", str(args.workers)]
    return [cmd for _ in range(args.runners)]


async def _run(args: VerlSpec, config: VerlTrainerConfig, tasks: list[dict[str, Any]]) -> dict[str, Any]:
    """`VerlTrainer` on the served store, with the runners this command starts (stopped on every way out)."""
    from agentlightning import ProxySettings
    from agentlightning.cli import guarded, start_runners, stop_children
    from agentlightning.store import StoreClient
    from agentlightning_verl._engine import VerlTrainer

    proxy = ProxySettings(
        host=args.proxy_host, port=args.proxy_port, advertised_url=args.advertise_url, token=args.proxy_token
    )
    time_budget = args.minutes * 60
    judge = judge_config(args)  # checked in verl_config
    loop = config.loop_config(
        output_dir=Path(args.output), proxy=proxy, seed=args.seed, time_budget_s=time_budget, judge=judge
    )
    store: Any = StoreClient(args.store_url or "", token=args.store_token)
    env = {**os.environ, **({"AGL_STORE_TOKEN": args.store_token} if args.store_token else {})}
    runners = start_runners(runner_commands(args), env=env)
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

    spec = VerlSpec
    capabilities = VERL_CAPABILITIES

    def train(self, spec: RunSpec) -> int:
        """Run ``agl train`` with verl on ``spec``, a `VerlSpec`; returns the exit code (2 with one line for bad
        options or no verl/vLLM)."""
        from agentlightning import run_async

        if not isinstance(spec, VerlSpec):
            raise TypeError(f"verl's engine trains a VerlSpec, got {type(spec).__name__}")
        args = spec
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
