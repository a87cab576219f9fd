"""Two LoRA adapters (writer, rewriter; checker frozen) against one shared policy, trained from the same checkpoint.

    python examples/sql/compare_policies.py --iterations 30 --minutes 15     # both modes, one after the other
    python examples/sql/compare_policies.py --modes adapters --iterations 2   # one mode only

One run of this script trains the text-to-SQL graph of ``train.py`` twice, with the same options, budgets and seed:

- ``adapters``: one policy per agent (`agentlightning.PolicyMap`): the writer's calls are served by, and train, LoRA
  adapter ``writer``; the rewriter's, adapter ``rewriter``; the checker's go to the frozen base model (it never
  changes). The agents' code is the same: the proxy routes each call by the agent that made it.
- ``shared``: today's recipe (``train.py``): writer and rewriter train one set of weights, which the checker also
  runs on (untrained, but it sees the shared updates).
- ``one-adapter`` (only with ``--modes``): a control, writer and rewriter train one LoRA adapter together, the checker
  on the frozen base: it separates "one adapter per agent" from "LoRA instead of all weights".
- ``full`` (only with ``--modes``): one policy per agent with full weights of its own: writer and rewriter each train
  a copy of all the model's weights (``PolicySettings(weights="full")``, at ``--lr``), the checker the frozen base.
  ``--policy-settings`` apply to every mode with policies (a full policy takes no LoRA keys).

Each mode gets its own run folder (``--output``/``adapters``, ``--output``/``shared``: store, metrics, checkpoints,
and ``summary.json``, that mode's figures, written as soon as it ends).
Reported: held-out greedy execution accuracy before / best / after RL of each mode, and per-agent reward curves (per
iteration, the mean final reward of the training rollouts in which the agent made a call, read back from the run's
store), as a table, a plot (``--output``/``compare.png``) and one JSON line with every figure.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import logging
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
# train.py under its own name: "train" may already be another example's module in this process
_spec = importlib.util.spec_from_file_location("sql_example_train", HERE / "train.py")
assert _spec is not None and _spec.loader is not None
sql_train = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sql_train)

MODES = ("adapters", "shared")
"""The two recipes compared by default, in the order they run."""
EXTRA_MODES = ("one-adapter", "full")
"""On request (``--modes``): ``one-adapter`` (writer and rewriter share one LoRA adapter, the checker frozen) and
``full`` (writer and rewriter each full weights of their own, the checker frozen)."""
FULL_POLICIES = ("writer", "rewriter")
"""The policies that train full weights of their own in mode ``full``."""
CURVE_AGENTS = ("writer", "rewriter", "checker")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """``train.py``'s options (output default ``runs/sql_compare``) plus ``--modes``."""
    args_list = list(argv if argv is not None else sys.argv[1:])
    modes = parse_modes(args_list)
    if "--output" not in args_list:
        args_list += ["--output", str(Path("runs") / "sql_compare")]
    args = sql_train.parse_args(args_list)
    args.modes = modes
    return args


def parse_modes(argv: list[str]) -> tuple[str, ...]:
    """Take ``--modes a,b`` out of ``argv`` (default: both); an unknown mode is a `UsageError`."""
    from agentlightning_torch.runkit import UsageError

    if "--modes" not in argv:
        return MODES
    at = argv.index("--modes")
    if at + 1 >= len(argv):
        raise UsageError("--modes needs a value, e.g. --modes adapters,shared")
    modes = tuple(m.strip() for m in argv[at + 1].split(",") if m.strip())
    del argv[at : at + 2]
    unknown = sorted(set(modes) - set(MODES + EXTRA_MODES))
    if unknown or not modes:
        names = ", ".join(MODES + EXTRA_MODES)
        raise UsageError(f"--modes takes {names} (comma-separated), got {unknown or 'nothing'}")
    return modes


def policy_map(mode: str) -> Any:
    """The `PolicyMap` of a mode (``None``: one shared policy)."""
    from agentlightning import FROZEN, PolicyMap

    if mode == "shared":
        return None
    if mode == "one-adapter":
        return PolicyMap(agents={"writer": "both", "rewriter": "both", "checker": FROZEN})
    return PolicyMap(agents={"writer": "writer", "rewriter": "rewriter", "checker": FROZEN})


async def agent_curves(db: Path) -> dict[str, list[list[float]]]:
    """Per agent: ``[iteration, mean final reward, rollouts]`` of the training rollouts in which it made a call."""
    import agentlightning as agl
    from agentlightning.transitions import TransitionConfig, results_from_store

    store = agl.SqliteStore(db)
    try:
        rollouts = [r for r in await store.query_rollouts(status=["succeeded"]) if r.mode == "train"]
        ids = [r.rollout_id for r in rollouts]
        sums: dict[tuple[str, int], list[float]] = {}
        for result in await results_from_store(store, ids, TransitionConfig(on_missing="skip")):
            iteration = int(str(result.rollout_id).split("-", 1)[0].removeprefix("it")) + 1
            for agent in {t.agent_name or "" for t in result.transitions}:
                entry = sums.setdefault((agent, iteration), [0.0, 0.0])
                entry[0] += result.final_reward or 0.0
                entry[1] += 1
        return {
            agent: [[i, round(s / n, 4), int(n)] for (a, i), (s, n) in sorted(sums.items()) if a == agent]
            for agent in CURVE_AGENTS
        }
    finally:
        await store.close()


def args_of(args: argparse.Namespace, mode: str) -> argparse.Namespace:
    """The options of one mode's run: its own output folder; ``--policy-settings`` only where it has policies."""
    mode_args = copy.copy(args)
    mode_args.output = args.output / mode
    if policy_map(mode) is None:
        mode_args.policy_settings = []
    elif mode == "full":  # the options' own entries after: a policy named twice merges its entries
        given = list(getattr(args, "policy_settings", None) or [])
        mode_args.policy_settings = [f"{name}:weights=full" for name in FULL_POLICIES] + given
    return mode_args


async def run_mode(args: argparse.Namespace, mode: str) -> dict[str, Any]:
    """One mode's training run (``train.py``'s) and its per-agent curves."""
    mode_args = args_of(args, mode)
    summary = await sql_train.train(mode_args, policy_map(mode))
    summary["agent_curves"] = await agent_curves(mode_args.output / "store.db")
    # each mode's figures as soon as it ends (a long comparison stopped later keeps the modes it finished)
    (mode_args.output / "summary.json").write_text(json.dumps(summary) + "\n", encoding="utf-8")
    return summary


async def compare(args: argparse.Namespace) -> dict[str, Any]:
    """Every mode of ``args.modes`` in turn, then the plot; the figures of all."""
    for mode in args.modes:  # bad options stop the script before any run
        sql_train.build_config(args_of(args, mode), policy_map(mode))
    results: dict[str, Any] = {}
    for mode in args.modes:
        results[mode] = await run_mode(args, mode)
    plot = args.output / "compare.png"
    plot_compare(results, plot)
    return {"modes": results, "plot": str(plot), "iterations_budget": args.iterations, "minutes_budget": args.minutes}


def _tail_mean(curve: list[list[float]], n: int = 5) -> float | None:
    tail = curve[-n:]
    return round(sum(p[1] for p in tail) / len(tail), 4) if tail else None


def plot_compare(results: dict[str, Any], path: Path) -> None:
    """Held-out accuracy points and per-agent sampled reward per iteration, one colour per mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (held, agents) = plt.subplots(1, 2, figsize=(12, 4.5))
    colours = {"adapters": "tab:blue", "shared": "tab:orange", "one-adapter": "tab:green", "full": "tab:red"}
    styles = {"writer": "-", "rewriter": "--", "checker": ":"}
    for mode, summary in results.items():
        points = summary["held_out_points"]
        held.plot([p[0] for p in points], [p[1] for p in points], "o-", color=colours[mode], label=mode)
        for agent, curve in summary["agent_curves"].items():
            if curve and agent != "checker":
                xs, ys = [p[0] for p in curve], [p[1] for p in curve]
                agents.plot(xs, ys, styles[agent], color=colours[mode], label=f"{mode}: {agent}")
    held.set(title="held-out execution accuracy (greedy)", xlabel="iteration", ylim=(-0.05, 1.05))
    agents.set(title="sampled reward of rollouts each agent acted in", xlabel="iteration", ylim=(-0.05, 1.05))
    held.legend()
    agents.legend(fontsize=8)
    fig.suptitle("Text-to-SQL: one policy per agent (checker frozen) vs one shared policy")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def show(summary: dict[str, Any]) -> None:
    """One table: per mode, held-out accuracy and each agent's sampled reward (first iteration / last five)."""
    from rich.console import Console

    from agentlightning_torch.runkit import print_table

    rows: list[tuple[str, float | None, float | None, float | None]] = []
    for mode, s in summary["modes"].items():
        rows.append((f"{mode}: held-out execution accuracy", s["reward_before"], s["reward_best"], s["reward_after"]))
        for agent in ("writer", "rewriter"):
            curve = s["agent_curves"].get(agent, [])
            first = curve[0][1] if curve else None
            rows.append((f"{mode}: sampled reward, {agent} acted", first, None, _tail_mean(curve)))
    print_table("Policies per agent vs one shared policy (before / best / after; sampled: first / - / last 5)", rows)
    console = Console(stderr=True)
    for mode, s in summary["modes"].items():
        console.print(
            f"{mode}: {s['iterations']} iterations in {s['seconds']:.0f} s of RL ({s['seconds_per_iteration']:.1f} "
            f"s/it), best held-out at iteration {s['best_iteration']}, trained samples {s['trained_samples']}"
        )
    for mode, s in summary["modes"].items():
        for policy, used in s.get("settings", {}).get("policies", {}).items():
            line = f"{mode}: policy {policy}: {used['weights']} weights, lr {used['lr']:.3g}, KL {used['kl_coef']:.3g}"
            if used["weights"] == "lora":
                line += f", LoRA r {used['lora_r']} alpha {used['lora_alpha']} on {'+'.join(used['lora_targets'])}"
            console.print(line)
    console.print(f"plot: {summary['plot']}")


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from agentlightning_torch.runkit import UsageError, run_main

    try:
        args = parse_args(argv)
    except UsageError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return run_main(lambda: compare(args), show)


if __name__ == "__main__":
    sys.exit(main())
