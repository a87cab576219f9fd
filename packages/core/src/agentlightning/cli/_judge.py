"""The judge's options of ``agl train`` (``--judge URL --judge-model M --rubric FILE``...) and ``agl judge calibrate``.

``agl judge calibrate --tasks FILE --agent module:function --llm-url URL --judge URL --judge-model M --rubric FILE``
runs the agent on the tasks (``--samples`` rollouts each, one group per task, against the model at ``--llm-url``),
judges every group and compares each score with the checker's reward (the reward the agent reports): accuracy for
pass/fail, Spearman for graded rewards, printed and stored in ``--output``/``calibration.json`` (the rollouts and
the judge's verdicts in ``--output``/``store.db``).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentlightning.cli._spec import RunSpec

__all__ = ["add_judge_arguments", "judge_config", "register"]


def add_judge_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of a reward from an LLM judge (``agl train``'s, ``agl judge calibrate``'s), as `RunSpec` has them."""
    from agentlightning.cli._spec import JUDGE_FIELDS, add_spec_arguments

    add_spec_arguments(parser, names=JUDGE_FIELDS)


def judge_config(args: argparse.Namespace | RunSpec) -> Any:
    """The `JudgeConfig` the options name, or ``None`` without ``--judge``.

    Raises:
        ValueError: One line: ``--judge`` without ``--judge-model`` or ``--rubric``, an unreadable rubric, a bad
            setting.
    """
    from pydantic import ValidationError

    from agentlightning.judge import JudgeConfig

    if args.judge is None:
        if args.judge_model is not None or args.rubric is not None:
            raise ValueError("--judge-model and --rubric need --judge URL (the judge server)")
        return None
    if args.judge_model is None or args.rubric is None:
        raise ValueError("--judge needs --judge-model (the judge's model name) and --rubric FILE")
    settings: dict[str, Any] = {
        "mode": args.judge_mode,
        "weight": args.judge_weight,
        "timeout_s": args.judge_timeout,
        "max_tokens": args.judge_answer_tokens,
        "max_attempts": args.judge_attempts,
        "max_calls_per_iteration": args.judge_max_calls,
        "max_tokens_per_iteration": args.judge_max_tokens,
        "api_key": args.judge_api_key,
    }
    try:
        return JudgeConfig.from_files(args.judge, args.judge_model, Path(args.rubric), **settings)
    except ValidationError as error:
        first = error.errors()[0]
        raise ValueError(f"invalid judge setting {'.'.join(map(str, first['loc']))}: {first['msg']}") from None


def register(subparsers: Any) -> None:
    """Add ``agl judge calibrate``."""
    judge = subparsers.add_parser("judge", help="LLM judges: check one against a checker before training with it")
    commands = judge.add_subparsers(dest="judge_command", required=True)
    calibrate = commands.add_parser(
        "calibrate", help="the judge's agreement with the checker on tasks that have one (accuracy, Spearman)"
    )
    calibrate.add_argument("--tasks", required=True, help="JSONL tasks, one task dict per line")
    calibrate.add_argument("--agent", required=True, help="the @agl.rollout function as module:function")
    calibrate.add_argument("--app-dir", default=".", help="folder put first on sys.path to import --agent")
    calibrate.add_argument("--llm-url", required=True, help="the agent's model: an OpenAI-compatible server (.../v1)")
    calibrate.add_argument("--llm-model", default="policy", help="the model name the agent sends (default: policy)")
    calibrate.add_argument("--samples", type=int, default=4, help="rollouts per task, judged as a group (default: 4)")
    calibrate.add_argument("--temperature", type=float, default=1.0, help="the agent's sampling temperature")
    calibrate.add_argument("--workers", type=int, default=8, help="concurrent rollouts (default: 8)")
    calibrate.add_argument("--output", default="runs/judge-calibrate", help="folder of the report and the store")
    add_judge_arguments(calibrate)
    calibrate.set_defaults(func=_calibrate)


def _calibrate(args: argparse.Namespace) -> int:
    from agentlightning import run_async
    from agentlightning.cli._tasks import TaskFileError, read_task_file

    try:
        config = judge_config(args)
        if config is None:
            raise ValueError("agl judge calibrate needs --judge URL, --judge-model and --rubric FILE")
        if args.samples < 1 or args.workers < 1:
            raise ValueError("--samples and --workers must be at least 1")
        tasks = read_task_file(Path(args.tasks))
        report = run_async(_run_calibration(args, config, tasks))
    except (ValueError, TaskFileError) as error:
        print(f"error: {str(error).splitlines()[0]}", file=sys.stderr)
        return 2
    path = report.write(Path(args.output) / "calibration.json")
    print(report.summary())
    for reason in report.reasons[:5]:
        print(f"  not judged: {reason}")
    print(f"report: {path}")
    return 0


async def _run_calibration(args: argparse.Namespace, config: Any, tasks: list[dict[str, Any]]) -> Any:
    """Run the agent on the tasks (its calls through an LLM proxy, so the traces hold them) into a SQLite store, then
    judge and compare (`agentlightning.judge.calibrate`)."""
    import agentlightning as agl
    from agentlightning._netauth import new_token
    from agentlightning.judge import calibrate
    from agentlightning.proxy import LLMProxy
    from agentlightning.runner import load_agent

    agent = load_agent(args.agent, args.app_dir)
    output = Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    store = agl.SqliteStore(output / "store.db")
    backend = str(args.llm_url).rstrip("/").removesuffix("/v1")
    proxy = LLMProxy(store, [backend], token=new_token(), model_version=0)
    await proxy.start()
    try:
        llm = proxy.llm_resource(args.llm_model, {"temperature": args.temperature})
        prefix = f"calibrate-{os.getpid()}"
        resources = await store.add_resources(agl.Resources(resources_id=prefix, items={"llm": llm}))
        requests = [
            agl.RolloutRequest(
                input=task,
                rollout_id=f"{prefix}-t{t}-s{s}",
                group_id=f"{prefix}-t{t}",
                mode="val",
                resources_id=resources.resources_id,
            )
            for t, task in enumerate(tasks)
            for s in range(args.samples)
        ]
        rollouts = await store.enqueue_rollouts(requests)
        await agl.Runner(agent, store, n_workers=args.workers, stop_when_idle=True).arun()
        await proxy.flush()
        finished = await store.query_rollouts(rollout_ids=[r.rollout_id for r in rollouts])
        done = [r.rollout_id for r in finished if r.status == "succeeded"]
        if not done:
            raise ValueError(f"none of the {len(rollouts)} rollouts succeeded: the runner's log says why")
        return await calibrate(store, done, config)
    finally:
        await proxy.stop()
        await store.close()
