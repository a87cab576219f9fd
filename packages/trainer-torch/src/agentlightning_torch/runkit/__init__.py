"""The scaffolding of a training script, so that a script shows only what is specific to its agent.

A training script (the examples' ``train.py``, ``agl train``) parses its options (`add_run_arguments` for the common
ones, as `TorchSpec` defines them), loads its tasks (`load_jsonl_tasks`), builds a `TorchTrainer` (`trainer_config`),
and hands both to a `TrainingRun` (a subclass adds the script's own figures), which runs the store, the runner processes
(`AgentRunners`: ``agl runner`` with the script's agent), the dashboard, the held-out evaluations (before, every
``--eval-every`` iterations keeping ``checkpoint/best``, after) and the cleanup. `plot_run`, `print_table` and
`run_main` show the result: the curve, the before / best / last table, one JSON line, and bad input as one line with
exit code 2.

Example::

    from agentlightning_torch import TorchTrainer
    from agentlightning_torch.runkit import AgentRunners, RunSettings, TrainingRun, ray_settings, run_main
    from agentlightning_torch.runkit import trainer_config

    async def train(args):
        trainer = TorchTrainer(trainer_config(args, model_dir=args.model_dir, tool_parser="hermes"))
        runners = AgentRunners("my_agent:solve", app_dir=HERE, instrument="langchain")
        settings = RunSettings(args.output, train_tasks, runners, val_tasks=val_tasks, processes=args.runners,
                               ray=ray_settings(args))  # --runners ray: runner actors placed by Ray
        result = await TrainingRun(trainer, settings).execute()
        return result.summary()

    sys.exit(run_main(lambda: train(args)))
"""

from agentlightning_torch.runkit._output import Curve, exit_process, plot_run, print_table, run_main, serving_death
from agentlightning_torch.runkit._ray_runners import RayRunnerSettings, shipped_settings
from agentlightning_torch.runkit._run import RunResult, RunSettings, TrainingRun
from agentlightning_torch.runkit._runners import AgentRunners, OnDemandDashboard, free_port, start_dashboard
from agentlightning_torch.runkit._setup import (
    RUN_OPTIONS,
    SCRIPT_DEFAULTS,
    SMOLLM2_RL,
    STABLE_RL,
    UsageError,
    add_model_arguments,
    add_run_arguments,
    load_jsonl_tasks,
    proxy_settings,
    ray_settings,
    store_serving,
    total_workers,
    trainer_config,
    typed_spec,
)
from agentlightning_torch.runkit._spec import TORCH_CAPABILITIES, TorchSpec

__all__ = [
    "RUN_OPTIONS",
    "SCRIPT_DEFAULTS",
    "SMOLLM2_RL",
    "STABLE_RL",
    "TORCH_CAPABILITIES",
    "AgentRunners",
    "Curve",
    "OnDemandDashboard",
    "RayRunnerSettings",
    "RunResult",
    "RunSettings",
    "TorchSpec",
    "TrainingRun",
    "UsageError",
    "add_model_arguments",
    "add_run_arguments",
    "exit_process",
    "free_port",
    "load_jsonl_tasks",
    "plot_run",
    "print_table",
    "proxy_settings",
    "ray_settings",
    "run_main",
    "serving_death",
    "shipped_settings",
    "start_dashboard",
    "store_serving",
    "total_workers",
    "trainer_config",
    "typed_spec",
]
