"""A training script's inputs: one-line errors, JSONL task files, the common options and the trainer's config."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentlightning.cli import RUNNER_FIELDS, TaskFileError, add_spec_arguments, read_task_file
from agentlightning_torch.runkit._spec import TorchSpec

__all__ = [
    "RUN_OPTIONS",
    "SCRIPT_DEFAULTS",
    "UsageError",
    "add_model_arguments",
    "add_run_arguments",
    "load_jsonl_tasks",
    "proxy_settings",
    "ray_settings",
    "store_serving",
    "total_workers",
    "trainer_config",
    "typed_spec",
]


class UsageError(ValueError):
    """Bad input (an option, a task file, a model folder): printed as one line, exit code 2 (`run_main`)."""


def load_jsonl_tasks(
    path: Path, flag: str = "--tasks", check: Callable[[dict[str, Any]], str | None] | None = None
) -> list[dict[str, Any]]:
    """`agentlightning.cli.read_task_file` (same arguments), its `TaskFileError` raised as a `UsageError`."""
    try:
        return read_task_file(path, flag, check)
    except TaskFileError as error:
        raise UsageError(str(error)) from None


STABLE_RL: dict[str, Any] = {
    "minutes": 60.0,  # a safety cap only: a script's iterations budget ends its run first
    "eval_every": 10,
    "lr": 3e-4,
    "kl_coef": 0.05,  # k3 KL to the starting model: keeps the policy near what the warm start can do
    "entropy_coef": 0.01,  # against the entropy collapse that ended long runs at a worse held-out figure
    "ppo_epochs": 2,  # a second pass over each batch, so the PPO clip acts (clip_fraction > 0)
}
"""The stable RL settings the sql, rag and math examples' READMEs measured (3 seeds, and runs 3x as long): a script
passes them with its own iterations budget, ``add_run_arguments(parser, ..., **STABLE_RL, iterations=30)``."""

SMOLLM2_RL: dict[str, Any] = {
    "minutes": 60.0,  # a safety cap only: a script's iterations budget ends its run first
    "eval_every": 2,
    "tasks_per_iteration": 8,
    "samples_per_task": 8,
    "temperature": 0.7,  # a 135M model's samples at 1.0 are often noise
    "lr": 5e-4,
    "kl_coef": 0.05,
    "entropy_coef": 0.0,
    "ppo_epochs": 1,
    "rollout_timeout": 1800.0,  # a safety net: on a busy 2-core machine an iteration's rollouts take minutes
}
"""The RL settings for a small pretrained chat model (SmolLM2-135M-Instruct) that the calc and sql examples measured:
LoRA (r 16 on q/k/v/o) with KL 0.05 to the starting model, groups of 8 at temperature 0.7, one PPO epoch, short
answers. A script adds its own iterations budget: ``{**SMOLLM2_RL, "iterations": 6}``."""


RUN_OPTIONS = (
    "output",
    "minutes",
    "iterations",
    "eval_every",
    "tasks_per_iteration",
    "samples_per_task",
    "lr",
    "kl_coef",
    "entropy_coef",
    "ppo_epochs",
    "threads",
    "device",
    "workers",
    *RUNNER_FIELDS,
    "rollout_timeout",
    "seed",
    "quiet",
    "policy_settings",
)
"""The `TorchSpec` options every training script has (`add_run_arguments`), in the order ``--help`` lists them."""

SCRIPT_DEFAULTS: dict[str, Any] = {
    "iterations": 1000,
    "tasks_per_iteration": 8,
    "lr": 3e-4,
    "workers": 32,
    "runners": 2,
    "rollout_timeout": 180.0,
}
"""The defaults the examples' training scripts share where they differ from ``agl train``'s, on purpose: a small
model trained from a warm start takes a larger learning rate (3e-4 against 1e-5), and toy sizes suit shorter
budgets, smaller batches and two runner processes. A script passes them (and `STABLE_RL`, its own) explicitly to
`add_run_arguments`: overrides of `TorchSpec`'s defaults, never a second definition of an option."""


def add_run_arguments(parser: argparse.ArgumentParser, *, output: Path, **defaults: Any) -> None:
    """The options every training script shares (`RUN_OPTIONS`), as `TorchSpec` defines them, with the script's
    defaults.

    ``--output``, the budgets (``--minutes``, ``--iterations``: whichever ends first), ``--eval-every``, the batch
    shape, the policy's ``--lr`` and stability knobs (``--kl-coef``, ``--entropy-coef``, ``--ppo-epochs``: the
    script's defaults are the settings its README measured), ``--threads``, ``--device``,
    the runners (``--workers`` concurrent rollouts per runner process, over ``--runners`` local processes or
    ``--runner-processes`` Ray actors with ``--runners ray[=ADDRESS]``, ``--runner-cpus`` and ``--ray-placement``:
    `ray_settings`), ``--rollout-timeout``, ``--seed``, ``--quiet`` and ``--policy-settings``.

    Args:
        parser: The script's parser.
        output: The script's run folder.
        **defaults: The script's defaults of these options (``**SCRIPT_DEFAULTS``, ``lr=3e-4``, ``runners=1``...);
            the others keep `TorchSpec`'s.

    Raises:
        KeyError: A default for an option that is not one of `RUN_OPTIONS`.
    """
    unknown = sorted(set(defaults) - set(RUN_OPTIONS))
    if unknown:
        raise KeyError(f"add_run_arguments has no option {', '.join(unknown)}")
    add_spec_arguments(parser, TorchSpec, RUN_OPTIONS, defaults={**defaults, "output": output})


def add_model_arguments(
    parser: argparse.ArgumentParser,
    models: tuple[str, ...],
    *,
    real: bool,
    smollm2_prompt: Path,
    model_help: str,
    prompt_help: str,
) -> None:
    """The options of a script that trains the shipped toy warm start or a real model (SmolLM2): ``--model`` (one of
    ``models``, default ``toy``), ``--model-dir``, ``--prompt-file`` (``smollm2_prompt`` by default for a real model),
    ``--full-weights`` and ``--lora-rank`` (a real model trains LoRA adapters by default).

    Args:
        parser: The script's parser.
        models: The ``--model`` choices.
        real: Whether the ``--model`` given (read first: it picks the other options' defaults) is a real model.
        smollm2_prompt: The script's SmolLM2 prompt file.
        model_help: What ``--model`` means for this script.
        prompt_help: What the prompt file holds for this script.
    """
    parser.add_argument("--model", choices=models, default="toy", help=model_help)
    parser.add_argument("--model-dir", type=Path, default=None, help="a model folder instead of --model's")
    parser.add_argument("--prompt-file", type=Path, default=smollm2_prompt if real else None, help=prompt_help)
    parser.add_argument(
        "--full-weights", action="store_true", help="train every weight (default for smollm2: LoRA adapters)"
    )
    parser.add_argument("--lora-rank", type=int, default=16, help="LoRA rank (smollm2; q/k/v/o projections)")


def total_workers(args: argparse.Namespace | TorchSpec) -> int:
    """Concurrent rollouts over all runner processes: ``--workers`` per runner process (a Ray actor too)."""
    spec = typed_spec(args)
    return spec.workers * (spec.runner_processes if spec.runners_ray else max(spec.runners, 1))


def typed_spec(args: argparse.Namespace | TorchSpec) -> TorchSpec:
    """``args`` as a `TorchSpec`: a training script's parsed options (parsed by `add_run_arguments` and
    `agentlightning.cli.add_network_arguments`, so already of their fields' types), the options it does not have at
    their defaults; a `TorchSpec` as it is."""
    if isinstance(args, TorchSpec):
        return args
    given = vars(args)
    return TorchSpec.model_construct(**{name: given[name] for name in TorchSpec.model_fields if name in given})


def ray_settings(args: argparse.Namespace | TorchSpec) -> Any:
    """`RunSettings.ray` from the `add_run_arguments` options: the Ray runner actors' settings (``None`` without
    ``--runners ray``). Ray itself is imported here only to refuse, in one line, a run it cannot start.

    Raises:
        UsageError: Ray is not installed, or ``--runner-processes`` / ``--runner-cpus`` are not positive.
    """
    spec = typed_spec(args)
    if not spec.runners_ray:
        return None
    from agentlightning_torch.runkit._ray_runners import RayNotInstalledError, RayRunnerSettings, import_ray

    try:
        import_ray()  # refused here, before a model loads
    except RayNotInstalledError as error:
        raise UsageError(str(error)) from None
    if spec.runner_processes < 1 or spec.runner_cpus <= 0:
        raise UsageError("--runner-processes must be at least 1 and --runner-cpus positive")
    return RayRunnerSettings(
        address=spec.ray_address, processes=spec.runner_processes, cpus=spec.runner_cpus, placement=spec.ray_placement
    )


def _check_budgets(args: TorchSpec) -> None:
    if args.minutes <= 0:
        raise UsageError(f"--minutes must be positive, got {args.minutes}")
    for flag, value in (("--workers", args.workers), ("--iterations", args.iterations)):
        if value < 1:
            raise UsageError(f"{flag} must be at least 1, got {value}")
    if args.runners < 0:
        raise UsageError(f"--runners must be 0 or more, got {args.runners}")
    if args.eval_every < 0:
        raise UsageError(f"--eval-every must be 0 or more, got {args.eval_every}")
    if args.vllm_url is not None and args.backend != "vllm":
        raise UsageError("--vllm-url needs --backend vllm (the embedded backend would serve, the URL unused)")


def _judge_settings(args: TorchSpec, settings: dict[str, Any]) -> dict[str, Any]:
    """``judge`` (and ``credit="per_step"`` for step scores) from ``agl train``'s ``--judge`` options, if given (a
    training script without them has them at their defaults: no judge)."""
    from agentlightning.cli import judge_config

    judge = judge_config(args)
    if judge is None:
        return {}
    out: dict[str, Any] = {"judge": judge}
    if judge.judges_steps and "credit" not in settings:
        out["credit"] = "per_step"  # step scores are intermediate rewards: the strategy that reads them
    return out


def trainer_config(args: argparse.Namespace | TorchSpec, *, model_dir: Path | str, **specific: Any) -> Any:
    """A `TorchTrainerConfig` from the `add_run_arguments` options plus the script's own settings.

    Args:
        args: The parsed options.
        model_dir: The model folder (or hub id).
        **specific: Further `TorchTrainerConfig` fields (``model_name``, ``tool_parser``, ``agent_filter``...);
            ``ppo_settings`` holds further `PPOConfig` fields.

    Raises:
        UsageError: A budget or setting is invalid (one line naming the setting).
    """
    from pydantic import ValidationError

    from agentlightning_torch.training._ppo import PPOConfig
    from agentlightning_torch.training._trainer_config import TorchTrainerConfig

    named = args  # the options as the script named them, for the error messages
    args = typed_spec(args)
    _check_budgets(args)
    ppo_settings: dict[str, Any] = {"lr": args.lr, "kl_coef": args.kl_coef, "epochs": args.ppo_epochs}
    ppo_settings["entropy_coef"] = args.entropy_coef
    ppo_settings.update(specific.pop("ppo_settings", {}))
    settings: dict[str, Any] = {
        "model_dir": model_dir,
        "output_dir": args.output,
        "device": args.device,
        "num_threads": args.threads,
        "iterations": args.iterations,
        "time_budget_s": args.minutes * 60,
        "eval_every": args.eval_every,
        "tasks_per_iteration": args.tasks_per_iteration,
        "samples_per_task": args.samples_per_task,
        "rollout_timeout_s": args.rollout_timeout,
        "seed": args.seed,
        "checkpoint_every": 0,
        **specific,
    }
    try:
        settings.update(_judge_settings(args, settings))
        settings["ppo"] = PPOConfig(num_threads=args.threads, **ppo_settings)
        settings.update(_policy_settings(args, settings))
        config = TorchTrainerConfig(**settings)
        config.loop_config()  # the loop's checks too, now: not as a model that "cannot load" once it is loaded
        return config
    except ValidationError as error:
        problems = "; ".join(_problem(named, e["loc"], str(e["msg"])) for e in error.errors())
        raise UsageError(f"invalid setting: {problems}") from None
    except ValueError as error:
        raise UsageError(str(error).splitlines()[0]) from None


def _policy_settings(args: TorchSpec, settings: dict[str, Any]) -> dict[str, Any]:
    """``policy_settings`` from ``--policy-settings`` (only for a run with policies; without, they are refused)."""
    from agentlightning_torch.training._policy_settings import parse_policy_settings

    entries: list[str] = list(args.policy_settings)
    if not entries:
        return {}
    if settings.get("policies") is None:
        raise UsageError("--policy-settings needs several policies (--policy AGENT=POLICY ...)")
    try:
        return {"policy_settings": parse_policy_settings(entries, settings["ppo"])}
    except ValueError as error:
        raise UsageError(f"--policy-settings: {error}") from None


_OPTIONS = {
    "model_dir": "--model",
    "output_dir": "--output",
    "num_threads": "--threads",
    "time_budget_s": "--minutes",
    "rollout_timeout_s": "--rollout-timeout",
    "epochs": "--ppo-epochs",
}
"""Config fields set by an option of another name (when the script has that option)."""


def _option(args: argparse.Namespace | TorchSpec, field: str) -> str | None:
    """The command-line option that sets config ``field`` (``samples_per_task``: ``--samples-per-task``), if any."""
    if hasattr(args, field):
        return "--" + field.replace("_", "-")
    named = _OPTIONS.get(field)
    return named if named is not None and hasattr(args, named[2:].replace("-", "_")) else None


def _problem(args: argparse.Namespace | TorchSpec, loc: tuple[int | str, ...], message: str) -> str:
    """One invalid setting, named by its option when it has one (a check across fields names them in its text)."""
    message = message.removeprefix("Value error, ")
    option = _option(args, str(loc[-1])) if loc else None
    if option is not None:
        return f"{option}: {message}"
    if loc:
        return f"{'.'.join(map(str, loc))}: {message}"
    for field in sorted({name for name in [*vars(args), *_OPTIONS] if "_" in name}, key=len, reverse=True):
        named = _option(args, field)
        if named is not None:
            message = re.sub(rf"\b{field}\b", named, message)
    return message


def _messages(error: Any) -> str:
    return "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in error.errors())


def store_serving(args: argparse.Namespace | TorchSpec, **settings: Any) -> Any:
    """Where the run's store lives and who can reach it (`agentlightning.StoreServing`), from the options of
    `agentlightning.cli.add_network_arguments`; ``settings``: further fields (``access_log``...).

    ``--store`` (or ``--store-url``) ``postgresql://...``: the store in that database, served to the runners by
    ``--store-servers`` servers; the driver, the DSN and the database's answer are checked here, before anything
    starts (a model loads).

    Raises:
        UsageError: The options contradict each other, the DSN is malformed, the database does not answer or the
            driver is missing (one line).
    """
    from pydantic import ValidationError

    import agentlightning as agl
    from agentlightning.store import StoreError

    spec = typed_spec(args)
    url, database = _store_location(spec)
    try:
        serving = agl.StoreServing(
            serve=spec.serve_store,
            url=url,
            database=database,
            servers=spec.store_servers,
            token=spec.store_token,
            heartbeat_timeout_s=spec.heartbeat_timeout,
            **settings,
        )
        serving.check_database()
    except ValidationError as error:
        raise UsageError(_messages(error)) from None
    except (ImportError, StoreError) as error:
        raise UsageError(f"--store: {str(error).splitlines()[0]}") from None
    return serving


def _store_location(args: TorchSpec) -> tuple[str | None, str | None]:
    """``(url, database)`` of ``--store`` / ``--store-url``: a served store's URL(s) or a PostgreSQL DSN."""
    store, url = args.store, args.store_url
    if store is not None and url is not None:
        raise UsageError("--store and --store-url both say where the store is: give one")
    given = store if store is not None else url
    servers = args.store_servers
    if servers < 1:
        raise UsageError(f"--store-servers must be at least 1, got {servers}")
    if given is not None and given.startswith(("postgresql://", "postgres://")):
        return None, given
    if store is not None and not store.startswith(("http://", "https://")):
        raise UsageError(
            f"--store takes a PostgreSQL database (postgresql://user:password@host:port/dbname) or a served store "
            f"(http://host:port), got {store!r}"
        )
    if servers != 1:
        raise UsageError("--store-servers needs the store in a PostgreSQL database (--store postgresql://...)")
    return given, None


def proxy_settings(args: argparse.Namespace | TorchSpec) -> Any:
    """Where the LLM proxy listens and how runners reach it (`agentlightning.ProxySettings`), from the options of
    `agentlightning.cli.add_network_arguments`; its exposure is checked (a proxy off loopback needs a token).

    Raises:
        UsageError: A bad or unsafe setting (one line).
    """
    from pydantic import ValidationError

    import agentlightning as agl

    spec = typed_spec(args)
    try:
        proxy = agl.ProxySettings(
            host=spec.proxy_host, port=spec.proxy_port, advertised_url=spec.advertise_url, token=spec.proxy_token
        )
        proxy.check_exposure()
    except ValidationError as error:
        raise UsageError(_messages(error)) from None
    except ValueError as error:
        raise UsageError(str(error).splitlines()[0]) from None
    return proxy
