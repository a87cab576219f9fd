"""Quickstart: teach a LangGraph calculator agent to use its tool, with RL, on a laptop CPU.

    python examples/calc/train.py                 # ~5 minutes of RL, then a summary, a plot and a JSON line
    python examples/calc/train.py --minutes 1     # shorter
    python examples/calc/train.py --iterations 40 --eval-every 10   # a fixed budget; held-out points, checkpoint/best
    python examples/calc/train.py --help
    python examples/calc/train.py --model smollm2  # a real pretrained model: `python3 scripts/dev.py smollm2` first

    # runners on other machines (see docs/several-machines.md): serve the store and the proxy on this machine's address
    python examples/calc/train.py --serve-store 0.0.0.0:4747 --proxy-host 0.0.0.0 --proxy-port 4748 \\
        --advertise-url http://trainer:4748 --runners 0      # tokens: $AGL_STORE_TOKEN and $AGL_PROXY_TOKEN

What runs: this process serves the tiny model (local batched backend) behind the LLM proxy and trains it;
runner processes (``agl runner --app-dir examples/calc --agent calc_agent:calc_agent``; ``--runners``) run the
LangGraph agent on rollouts taken from the SQLite store, and runners on other machines can join through the served
store. Every LLM call goes agent → proxy (records token ids) → backend; spans go to the store; each iteration turns
spans + token records into transitions, LightningRL credit (GRPO), a PPO step, and a new model version served back.
The run's scaffolding (store, runners, dashboard, evaluations, plot, table) is `agentlightning_torch.runkit`.
"""

from __future__ import annotations

import argparse
import copy
import logging
import re
import resource
from pathlib import Path
from typing import Any

from agentlightning_torch.runkit import SMOLLM2_RL

HERE = Path(__file__).resolve().parent
# --model: the models this example trains, each with the settings its README measured (the options still override)
TOY: dict[str, Any] = {"minutes": 5.0, "tasks_per_iteration": 16}
SMOLLM2: dict[str, Any] = {**SMOLLM2_RL, "iterations": 6}
"""A real pretrained model: the iterations budget makes the figure reproduce (held-out greedy accuracy rose
0.30 -> 0.84 in the first 2 iterations: examples/calc/README.md)."""
MODELS: dict[str, dict[str, Any]] = {"toy": TOY, "smollm2": SMOLLM2}
SMOLLM2_FOLDER = "smollm2-135m-instruct"
SMOLLM2_PROMPT = HERE / "prompts" / "smollm2.json"  # its system prompt and worked example (see the README)
# --agent: what the runner processes run (``agl runner --agent ... --instrument ...``)
AGENTS = {
    "langgraph": ("calc_agent:calc_agent", "langchain"),
    "langgraph-two": ("calc_agent:calc_two_agents", "langchain"),  # caller + answerer (README: a policy per agent)
    "openai": ("calc_openai_agent:calc_openai_agent", "openai"),
}
_QUESTION = re.compile(r"^Q:[0-9+\-*]{3,40}=$")


def check_task(task: dict[str, Any]) -> str | None:
    """What is wrong with a ``{"question": "Q:37*48+12=", "answer": 1788}`` task, if anything."""
    question, answer = task.get("question"), task.get("answer")
    if not isinstance(question, str) or not _QUESTION.match(question):
        return f"'question' must look like \"Q:37*48+12=\", got {question!r}"
    if not isinstance(answer, int) or isinstance(answer, bool):
        return f"'answer' must be an integer, got {answer!r}"
    return None


def resolve_model(args: argparse.Namespace) -> Path:
    """The model folder: ``--model-dir`` when given, else the folder of ``--model`` (bad or missing: `UsageError`)."""
    from agentlightning_torch.models import models_dir
    from agentlightning_torch.runkit import UsageError

    if args.model_dir is not None:
        return args.model_dir
    if args.model == "toy":
        return HERE / "checkpoint"
    folder = models_dir() / SMOLLM2_FOLDER
    if not (folder / "config.json").is_file():
        raise UsageError(f"SmolLM2 is not fetched ({folder} is missing): run `python3 scripts/dev.py smollm2` first")
    return folder


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from agentlightning.cli import add_judge_arguments, add_network_arguments, add_spec_arguments
    from agentlightning_torch.runkit import SCRIPT_DEFAULTS, TorchSpec, add_model_arguments, add_run_arguments

    # --model picks the defaults of the other options, so it is read first
    first = argparse.ArgumentParser(add_help=False)
    first.add_argument("--model", choices=tuple(MODELS), default="toy")
    model = first.parse_known_args(argv)[0].model
    preset = MODELS[model]
    real = model != "toy"
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(
        parser,
        tuple(MODELS),
        real=real,
        smollm2_prompt=SMOLLM2_PROMPT,
        model_help="toy: the shipped ~1M-parameter warm start (examples/calc/checkpoint); smollm2: "
        "SmolLM2-135M-Instruct, fetched by `python3 scripts/dev.py smollm2` (its own chat template, a system prompt "
        "and a worked example)",
        prompt_help="JSON list of chat messages that open every conversation (default: none for toy, "
        "prompts/smollm2.json for smollm2)",
    )
    parser.add_argument(
        "--temperature",
        type=float,
        default=preset.get("temperature", 1.0),
        help="sampling temperature of training rollouts (toy 1.0, smollm2 0.7)",
    )
    parser.add_argument(
        "--max-tokens", type=int, default=16 if real else 24, help="most tokens per LLM call (toy 24, smollm2 16)"
    )
    parser.add_argument("--train-tasks", type=Path, default=HERE / "data" / "train.jsonl", help="JSONL training tasks")
    parser.add_argument("--val-tasks", type=Path, default=HERE / "data" / "val.jsonl", help="JSONL held-out tasks")
    parser.add_argument("--eval-size", type=int, default=64, help="held-out tasks for greedy accuracy")
    defaults: dict[str, Any] = {**SCRIPT_DEFAULTS, "workers": 64, "rollout_timeout": 120.0, **preset}
    defaults.pop("temperature", None)  # an option of this script (above), not of the run's
    add_run_arguments(parser, output=Path("runs") / "calc", **defaults)
    net = add_network_arguments(parser)  # --serve-store/--store-url/--store-token, --proxy-*, --advertise-url, ...
    net.add_argument("--access-log", action="store_true", help="served store: log each request's client address")
    parser.add_argument("--batch-wait-ms", type=float, default=5.0, help="backend: start a batch after this quiet gap")
    parser.add_argument("--max-batch-wait-ms", type=float, default=50.0, help="backend: longest wait to fill a batch")
    parser.add_argument(
        "--transition-mode",
        choices=("per_call", "trajectory"),
        default="per_call",
        help="one training sample per LLM call, or one per episode (its calls merged, as the bare loop trains)",
    )
    parser.add_argument(
        "--agent",
        choices=tuple(AGENTS),
        default="langgraph",
        help="what the runners run: the LangGraph graph (calc_agent.py), the same graph split between two agents, "
        "caller and answerer (langgraph-two), or plain OpenAI calls (calc_openai_agent.py)",
    )
    parser.add_argument(
        "--policy-per-agent",
        action="store_true",
        help="--agent langgraph-two: the caller and the answerer each train a policy of their own (a LoRA adapter "
        "each, with --lr and --lora-rank; --policy-settings for more) instead of sharing one",
    )
    add_spec_arguments(parser, names=["max_staleness"])  # --max-staleness K: RunSpec defines it
    add_spec_arguments(parser, TorchSpec, ["backend", "vllm_url"])  # --backend vllm: real vLLM serves the policy
    parser.add_argument("--no-dashboard", action="store_true", help="do not serve the browser dashboard")
    add_judge_arguments(parser)  # --judge URL --judge-model M --rubric FILE: rewards from an LLM judge (judge_run.py)
    return parser.parse_args(argv)


POLICY_AGENTS = ("caller", "answerer")
"""``--policy-per-agent``: the agents of ``--agent langgraph-two``, each its own policy of the same name."""


def policy_map(args: argparse.Namespace) -> Any:
    """``--policy-per-agent``: a policy per agent of the two-agent graph (`agentlightning.PolicyMap`); else ``None``."""
    from agentlightning import PolicyMap
    from agentlightning_torch.runkit import UsageError

    if not args.policy_per_agent:
        return None
    if args.agent != "langgraph-two":
        raise UsageError("--policy-per-agent needs --agent langgraph-two (the graph with two agents)")
    return PolicyMap(agents={name: name for name in POLICY_AGENTS})


def build_config(args: argparse.Namespace) -> Any:
    """The trainer's settings (bad values: `UsageError`)."""
    from agentlightning_torch import LoRASettings, VLLMSettings
    from agentlightning_torch.runkit import UsageError, proxy_settings, trainer_config

    if args.eval_size < 1:
        raise UsageError("--eval-size must be at least 1")
    if args.prompt_file is not None and not args.prompt_file.is_file():
        raise UsageError(f"--prompt-file {str(args.prompt_file)!r} does not exist")
    lora = LoRASettings(r=args.lora_rank, alpha=2 * args.lora_rank)
    if args.model == "toy" or args.full_weights:
        lora = None
    if lora is not None and args.policy_per_agent:
        # this run's --lr is a LoRA rate already: each agent's adapter takes it (not 10x, the default of a policy in a
        # full-weight run); the options' own --policy-settings come after and win
        args = copy.copy(args)
        args.policy_settings = [f"{name}:lr={args.lr}" for name in POLICY_AGENTS] + list(args.policy_settings or [])
    return trainer_config(
        args,
        model_dir=resolve_model(args),
        temperature=args.temperature,
        max_tokens=args.max_tokens,
        ppo_settings={"lora": lora},
        policies=policy_map(args),  # each policy's adapter: this run's LoRA shape and --lr (it is a LoRA rate)
        tool_parser="calc",  # CALC(<expr>) -> an OpenAI tool call; any HF model folder goes the same path
        best_metric="accuracy",  # rewards are 1 (right), 0 (wrong), -0.1 (malformed): the mean is not the accuracy
        batch_wait_ms=args.batch_wait_ms,
        max_batch_wait_ms=args.max_batch_wait_ms,
        transition_mode=args.transition_mode,
        max_staleness=args.max_staleness,
        proxy=proxy_settings(args),  # checked now, before the model loads: a proxy off loopback needs a token
        backend=args.backend,
        # vLLM parses CALC(...) with the plugin shipped here, as the embedded backend's "calc" parser does
        vllm=VLLMSettings(url=args.vllm_url, tool_parser_plugin=HERE / "vllm_calc_parser.py"),
    )


async def train(args: argparse.Namespace) -> dict[str, Any]:
    """Evaluate, train within the budget, evaluate again; returns the run's figures."""
    from agentlightning_torch import TorchTrainer
    from agentlightning_torch.runkit import (
        AgentRunners,
        RunSettings,
        TrainingRun,
        UsageError,
        load_jsonl_tasks,
        plot_run,
        ray_settings,
        store_serving,
        total_workers,
    )

    config = build_config(args)
    serving = store_serving(args, access_log=args.access_log)
    train_tasks = load_jsonl_tasks(args.train_tasks, "--train-tasks", check_task)
    val_tasks = load_jsonl_tasks(args.val_tasks, "--val-tasks", check_task)[: args.eval_size]
    agent, instrument = AGENTS[args.agent]

    class CalcRun(TrainingRun):
        def status(self, report: Any) -> str:
            return super().status(report) + f"  tool rate {report.multi_call_rate:.2f}"

    settings = RunSettings(
        output=args.output,
        train_tasks=train_tasks,
        val_tasks=val_tasks,
        runners=AgentRunners(agent, app_dir=HERE, instrument=instrument, worker_mode="async", env=runner_env(args)),
        processes=args.runners,
        workers=total_workers(args),  # --workers is per runner process
        ray=ray_settings(args),  # --runners ray: runner actors placed by Ray
        serving=serving,
        dashboard=not args.no_dashboard,
        quiet=args.quiet,
    )
    trainer = TorchTrainer(config)
    run = CalcRun(trainer, settings)
    result = await run.execute()
    history, tail = result.history, result.history[-5:]
    curves = [("mean sampled reward", lambda r: r.reward_mean), ("tool-call rate", lambda r: r.multi_call_rate)]
    plot = args.output / "reward_curve.png"
    plot_run(result, plot, title="Calculator agent (LangGraph) trained with Agent Lightning on CPU", curves=curves)
    if result.before is None or result.after is None:
        raise UsageError("no held-out evaluation ran")
    summary = result.summary()
    return {
        "reward_before": round(history[0].reward_mean, 4),
        "reward_after": round(sum(r.reward_mean for r in tail) / len(tail), 4),
        "greedy_before": summary["held_out_before"],
        "greedy_after": summary["held_out_last"],
        "greedy_best": summary["held_out_best"],
        "tool_rate_before": round(history[0].multi_call_rate, 4),
        "tool_rate_after": round(sum(r.multi_call_rate for r in tail) / len(tail), 4),
        "rl_seconds": summary["seconds"],
        **summary,
        "max_staleness": args.max_staleness,
        "backend": args.backend,
        "model": args.model,
        "agent": args.agent,
        "policies": None if trainer.engine.trained is None else dict(trainer.engine.trained.described),
        "plot": str(plot),
        # CPU seconds of the whole run (setup and evaluations included): this process, and the runner processes
        "trainer_cpu_seconds": round(_cpu(resource.RUSAGE_SELF), 1),
        "runner_cpu_seconds": round(_cpu(resource.RUSAGE_CHILDREN), 1),
    }


def runner_env(args: argparse.Namespace) -> dict[str, str]:
    """The runner processes' environment: the prompt file, when the model needs one (runners on other machines set
    ``CALC_PROMPT_FILE`` themselves)."""
    from calc_rules import PROMPT_ENV

    return {} if args.prompt_file is None else {PROMPT_ENV: str(args.prompt_file.resolve())}


def _cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def show(summary: dict[str, Any]) -> None:
    """The before / best / last table on stderr."""
    from rich.console import Console

    from agentlightning_torch.runkit import print_table

    print_table(
        "Calculator agent: before and after RL",
        [
            ("held-out greedy accuracy", summary["greedy_before"], summary["greedy_best"], summary["greedy_after"]),
            ("mean sampled reward", summary["reward_before"], None, summary["reward_after"]),
            ("tool-call rate", summary["tool_rate_before"], None, summary["tool_rate_after"]),
        ],
    )
    Console(stderr=True).print(
        f"{summary['iterations']} iterations in {summary['seconds']:.0f} s of RL; best held-out at iteration "
        f"{summary['best_iteration']} ({summary['best_checkpoint']}); plot: {summary['plot']}"
    )


def main(argv: list[str] | None = None) -> int:
    from agentlightning import defer_full_gc

    with defer_full_gc():  # entered before torch and transformers import: no full collections until the loop
        logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
        from agentlightning_torch.runkit import run_main

        args = parse_args(argv)
        return run_main(lambda: train(args), show)


if __name__ == "__main__":
    code = main()  # first: it imports torch under `defer_full_gc`
    from agentlightning_torch.runkit import exit_process

    exit_process(code)  # no interpreter teardown of torch's objects (~1.5 s of CPU)
