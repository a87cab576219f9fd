"""Quickstart: teach a LangGraph calculator agent to use its tool, with RL, on a laptop CPU.

    python examples/calc/train.py                 # ~5 minutes of RL, then a summary, a plot and a JSON line
    python examples/calc/train.py --minutes 1     # shorter
    python examples/calc/train.py --help

    # runners on other machines (see the README): serve the store and the proxy on this machine's address
    python examples/calc/train.py --serve-store 0.0.0.0:4747 --proxy-host 0.0.0.0 --proxy-port 4748 \
        --advertise-url http://trainer:4748 --runners 0      # tokens: $AGL_STORE_TOKEN and $AGL_PROXY_TOKEN

What runs: this process serves the tiny model (local batched backend) behind the LLM proxy and trains it;
runner processes (``run_agents.py``, i.e. ``agl runner``; ``--runners``) run the LangGraph agent on rollouts taken
from the SQLite store, and runners on other machines can join through the served store. Every LLM call goes agent →
proxy (records token ids) → backend; spans go to the store; each iteration turns spans + token records into
transitions, LightningRL credit (GRPO), a PPO step, and a new model version served back.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DEFAULTS = {
    "model_dir": HERE / "checkpoint",
    "train_tasks": HERE / "data" / "train.jsonl",
    "val_tasks": HERE / "data" / "val.jsonl",
    "output": Path("runs") / "calc",
}
# --agent: what the runner processes run (``agl runner --agent ... --instrument ...``)
AGENTS = {
    "langgraph": ["--agent", "calc_agent:calc_agent", "--instrument", "langchain"],
    "openai": ["--agent", "calc_openai_agent:calc_openai_agent", "--instrument", "openai"],
}
_QUESTION = re.compile(r"^Q:[0-9+\-*]{3,40}=$")


class UsageError(Exception):
    """Bad input from the command line or a task file; printed as one clear line, exit code 2."""


def load_tasks(path: Path) -> list[dict[str, Any]]:
    """Tasks from a JSONL file of ``{"question": "Q:37*48+12=", "answer": 1788}`` lines."""
    if not path.is_file():
        raise UsageError(f"task file {str(path)!r} does not exist")
    tasks: list[dict[str, Any]] = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            task = json.loads(line)
        except json.JSONDecodeError as error:
            raise UsageError(f"{path}:{number}: not valid JSON ({error.msg} at column {error.colno})") from None
        if not isinstance(task, dict):
            raise UsageError(f"{path}:{number}: expected a JSON object with 'question' and 'answer'")
        question, answer = task.get("question"), task.get("answer")
        if not isinstance(question, str) or not _QUESTION.match(question):
            raise UsageError(f"{path}:{number}: 'question' must look like \"Q:37*48+12=\", got {question!r}")
        if not isinstance(answer, int) or isinstance(answer, bool):
            raise UsageError(f"{path}:{number}: 'answer' must be an integer, got {answer!r}")
        tasks.append({"question": question, "answer": answer})
    if not tasks:
        raise UsageError(f"task file {str(path)!r} holds no tasks")
    return tasks


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", type=Path, default=DEFAULTS["model_dir"], help="warm-started model folder")
    parser.add_argument("--train-tasks", type=Path, default=DEFAULTS["train_tasks"], help="JSONL training tasks")
    parser.add_argument("--val-tasks", type=Path, default=DEFAULTS["val_tasks"], help="JSONL held-out tasks")
    parser.add_argument("--output", type=Path, default=DEFAULTS["output"], help="run folder (store, metrics, plot)")
    parser.add_argument("--minutes", type=float, default=5.0, help="RL time budget in minutes")
    parser.add_argument("--iterations", type=int, default=1000, help="most RL iterations")
    parser.add_argument("--tasks-per-iteration", type=int, default=16)
    parser.add_argument("--samples-per-task", type=int, default=8)
    parser.add_argument("--lr", type=float, default=3e-4, help="policy learning rate")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (few is faster on small machines)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--workers", type=int, default=128, help="concurrent rollouts, over all local runner processes")
    from agentlightning.cli import add_network_arguments

    net = add_network_arguments(parser)  # --serve-store/--store-url/--store-token, --proxy-*, --advertise-url, ...
    net.add_argument("--runners", type=int, default=2, help="local runner processes (0: wait for remote runners)")
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
        help="what the runners run: the LangGraph graph (calc_agent.py) or plain OpenAI calls (calc_openai_agent.py)",
    )
    parser.add_argument(
        "--max-staleness",
        type=int,
        choices=(0, 1),
        default=0,
        help="0: synchronous; 1: the next iteration's rollouts run during the update (one version off-policy)",
    )
    parser.add_argument(
        "--backend",
        choices=("local", "vllm"),
        default="local",
        help="serve the policy with the embedded backend, or with a real vLLM server (its weights synced and verified "
        "each iteration; vLLM from $AGL_VLLM_VENV or .venv-vllm: `python3 scripts/dev.py vllm`)",
    )
    parser.add_argument("--vllm-url", default=None, help="--backend vllm: use this running vLLM server (see README)")
    parser.add_argument("--eval-size", type=int, default=64, help="held-out tasks for greedy accuracy")
    parser.add_argument(
        "--rollout-timeout", type=float, default=120.0, help="seconds an iteration waits for its rollouts"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--no-dashboard", action="store_true", help="do not serve the browser dashboard")
    return parser.parse_args(argv)


def build_config(args: argparse.Namespace) -> Any:
    from pydantic import ValidationError

    import agentlightning as agl
    from agentlightning_torch import PPOConfig, TorchTrainerConfig, VLLMSettings

    if args.minutes <= 0:
        raise UsageError(f"--minutes must be positive, got {args.minutes}")
    if args.workers < 1 or args.eval_size < 1:
        raise UsageError("--workers and --eval-size must be at least 1")
    if args.runners < 0:
        raise UsageError(f"--runners must be 0 or more, got {args.runners}")
    try:
        proxy = agl.ProxySettings(
            host=args.proxy_host, port=args.proxy_port, advertised_url=args.advertise_url, token=args.proxy_token
        )
        proxy.check_exposure()
        return TorchTrainerConfig(
            model_dir=args.model_dir,
            tool_parser="calc",  # CALC(<expr>) -> an OpenAI tool call; any HF model folder goes the same path
            output_dir=args.output,
            device=args.device,
            num_threads=args.threads,
            iterations=args.iterations,
            time_budget_s=args.minutes * 60,
            tasks_per_iteration=args.tasks_per_iteration,
            samples_per_task=args.samples_per_task,
            ppo=PPOConfig(lr=args.lr, num_threads=args.threads),
            seed=args.seed,
            checkpoint_every=0,
            batch_wait_ms=args.batch_wait_ms,
            max_batch_wait_ms=args.max_batch_wait_ms,
            transition_mode=args.transition_mode,
            rollout_timeout_s=args.rollout_timeout,
            max_staleness=args.max_staleness,
            proxy=proxy,
            backend=args.backend,
            # vLLM parses CALC(...) with the plugin shipped here, as the embedded backend's "calc" parser does
            vllm=VLLMSettings(url=args.vllm_url, tool_parser_plugin=HERE / "vllm_calc_parser.py"),
        )
    except ValidationError as error:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'config'}: {e['msg']}" for e in error.errors())
        raise UsageError(f"invalid setting: {problems}") from None
    except ValueError as error:
        raise UsageError(str(error)) from None


def store_serving(args: argparse.Namespace) -> Any:
    """Where this run's store lives and who can reach it (`agl.StoreServing`), from the command line."""
    from pydantic import ValidationError

    import agentlightning as agl

    try:
        return agl.StoreServing(
            serve=args.serve_store,
            url=args.store_url,
            token=args.store_token,
            heartbeat_timeout_s=args.heartbeat_timeout,
            access_log=args.access_log,
        )
    except ValidationError as error:
        raise UsageError("; ".join(str(e["msg"]).removeprefix("Value error, ") for e in error.errors())) from None


def start_runners(
    where: list[str], workers: int, runners: int, token: str | None, agent: str = "langgraph"
) -> list[subprocess.Popen[bytes]]:
    """``runners`` local runner processes (``run_agents.py``, i.e. ``agl runner``) sharing ``workers`` rollouts.

    Tied to this process (`agentlightning.cli.start_runners`): even a ``kill -9`` of the trainer ends them.
    """
    from agentlightning.cli import start_runners as start_runner_processes

    env = {**os.environ, "OMP_NUM_THREADS": "1", "AGL_STORE_TOKEN": token or ""}
    commands = []
    for index in range(runners):
        share = workers // runners + (1 if index < workers % runners else 0)
        cmd = [sys.executable, str(HERE / "run_agents.py"), *where, *AGENTS[agent], "--workers", str(max(share, 1))]
        commands.append(cmd)
    return start_runner_processes(commands, env)


def plot(history: list[Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    elapsed, total = [], 0.0
    for report in history:
        total += report.seconds
        elapsed.append(total / 60)
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(elapsed, [r.reward_mean for r in history], label="mean sampled reward")
    ax.plot(elapsed, [r.multi_call_rate for r in history], label="tool-call rate", linestyle="--")
    ax.set_xlabel("RL time (minutes)")
    ax.set_ylim(-0.15, 1.05)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    ax.set_title("Calculator agent (LangGraph) trained with Agent Lightning on CPU")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


async def train(args: argparse.Namespace, config: Any) -> dict[str, Any]:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from agentlightning.cli import cancel_on_sigterm, guarded, stop_children
    from agentlightning_torch import TorchTrainer

    cancel_on_sigterm()  # a `kill` ends the run like Ctrl-C: through the cleanup below, then one line
    console = Console(stderr=True)
    train_tasks, val_tasks = load_tasks(args.train_tasks), load_tasks(args.val_tasks)[: args.eval_size]
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / "metrics.jsonl").unlink(missing_ok=True)
    db = args.output / "store.db"
    serving = store_serving(args)
    opened = await serving.open(db, fresh=True)
    store = opened.store
    if serving.serve is not None:
        console.print(f"serving the store at {serving.serve} for runners on other machines")
    dashboard = None
    if not args.no_dashboard and serving.url is None:
        from agentlightning.ui import DashboardServer

        dashboard = DashboardServer(db).start()
        console.print(f"[bold]dashboard[/]: {dashboard.url} (live while training; later: agl store serve --db {db})")
    runners = start_runners(opened.runner_args, args.workers, args.runners, opened.token, args.agent)
    progress = Progress(
        TextColumn("[bold]RL"),
        BarColumn(),
        TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(),
        console=console,
        disable=args.quiet,
    )
    bar = progress.add_task("rl", total=config.time_budget_s, status="starting")
    started = time.monotonic()

    def on_iteration(report: Any) -> None:
        status = (
            f"it {report.iteration:3d}  reward {report.reward_mean:+.2f}  tool rate {report.multi_call_rate:.2f}"
            f"  {report.seconds:.1f}s/it"
        )
        if report.metrics.get("rollouts_failed"):  # agents that raised: the runner's log has the exception
            status += f"  [red]{report.metrics['rollouts_failed']:.0f} failed[/]"
        progress.update(bar, completed=min(time.monotonic() - started, config.time_budget_s), status=status)

    trainer = TorchTrainer(config, on_iteration=on_iteration)
    try:
        await trainer.start(store)
        console.print(f"LLM proxy for the agents: {trainer.proxy.url}")
        if not runners:
            console.print("no local runner (--runners 0): waiting for runners on other machines")
        console.print(f"[bold]evaluating[/] the warm-started policy greedily on {len(val_tasks)} held-out tasks")
        before = await guarded(runners, trainer.evaluate(store, val_tasks))
        console.print(f"greedy accuracy before RL: {before.reward_mean:.2f}")
        started = time.monotonic()
        with progress:
            await guarded(runners, trainer.run(store, train_tasks))
        rl_seconds = time.monotonic() - started
        after = await guarded(runners, trainer.evaluate(store, val_tasks))
    finally:
        # The runners first, while the proxy still answers them (they hand their rollouts back as they drain), and
        # from a thread: the proxy runs on this loop.
        await asyncio.to_thread(stop_children, runners)
        await trainer.stop()
        await opened.close()
        if dashboard is not None:
            dashboard.stop()
    history = trainer.history
    if not history:
        raise UsageError("no RL iteration finished within the time budget; raise --minutes")
    tail = history[-5:]
    plot(history, args.output / "reward_curve.png")
    return {
        "reward_before": round(history[0].reward_mean, 4),
        "reward_after": round(sum(r.reward_mean for r in tail) / len(tail), 4),
        "greedy_before": round(_accuracy(before), 4),
        "greedy_after": round(_accuracy(after), 4),
        "tool_rate_before": round(history[0].multi_call_rate, 4),
        "tool_rate_after": round(sum(r.multi_call_rate for r in tail) / len(tail), 4),
        "rl_seconds": round(rl_seconds, 1),
        "iterations": len(history),
        "seconds_per_iteration": round(sum(r.seconds for r in history) / len(history), 3),
        "max_staleness": args.max_staleness,
        "backend": args.backend,
        "plot": str(args.output / "reward_curve.png"),
        # CPU seconds of the whole run (setup and evaluations included): this process, and the runner processes
        "trainer_cpu_seconds": round(_cpu(resource.RUSAGE_SELF), 1),
        "runner_cpu_seconds": round(_cpu(resource.RUSAGE_CHILDREN), 1),
    }


def _cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def _accuracy(report: Any) -> float:
    # With rewards 1 (right), 0 (wrong), -0.1 (malformed), the mean is not the accuracy; the store knows better
    return float(report.metrics.get("accuracy", max(report.reward_mean, 0.0)))


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    from agentlightning.cli import RunnerDied

    try:
        config = build_config(args)
        store_serving(args)
        load_tasks(args.train_tasks)
        load_tasks(args.val_tasks)
        from agentlightning import run_async  # uvloop when installed

        summary = run_async(train(args, config))
    except (UsageError, RunnerDied) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except asyncio.CancelledError:  # SIGTERM (cancel_on_sigterm)
        print("terminated", file=sys.stderr)
        return 143
    from rich.console import Console
    from rich.table import Table

    table = Table(title="Calculator agent: before and after RL")
    table.add_column("measure")
    table.add_column("before", justify="right")
    table.add_column("after", justify="right")
    table.add_row("mean sampled reward", f"{summary['reward_before']:.2f}", f"{summary['reward_after']:.2f}")
    table.add_row("held-out greedy accuracy", f"{summary['greedy_before']:.2f}", f"{summary['greedy_after']:.2f}")
    table.add_row("tool-call rate", f"{summary['tool_rate_before']:.2f}", f"{summary['tool_rate_after']:.2f}")
    Console(stderr=True).print(table)
    Console(stderr=True).print(
        f"{summary['iterations']} iterations in {summary['rl_seconds']:.0f} s of RL; plot: {summary['plot']}"
    )
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
