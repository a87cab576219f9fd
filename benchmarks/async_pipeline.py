"""The staleness bound's pipeline, measured without this CPU's noise: iteration wall time at k = 0, 1, 2.

`RLLoop` runs for real (the real proxy, a real in-process runner with N async workers, an in-memory store), with
two simulated parts whose cost is fixed: a backend that answers every LLM call after ``--latency`` seconds (the
scripted model server, calls overlapping freely: generation of one wave of N rollouts costs ~``latency``) and an
engine whose update costs ``--update`` seconds (a sleep in the update thread). Each iteration runs N rollouts of one
LLM call each on N workers, so generation is one wave.

Synchronously (k = 0) an iteration costs generation + update; with a staleness bound k >= 1 the next iterations'
rollouts are generated while the update runs, so a steady-state iteration costs max(generation, update) (plus the
loop's own overhead). The figure is the ratio of the k = 0 iteration wall to the k >= 1 one, for 1..64 runners.

    .venv/bin/python benchmarks/async_pipeline.py --latency 0.4 --update 0.4 --iterations 6

Prints a table, then one JSON line with every figure and the ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import logging
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import agentlightning as agl
from agentlightning.loop import LoopConfig, RLLoop
from agentlightning.testing import ScriptedModelServer, ScriptedServerEngine, chat_through_proxy


@agl.rollout
async def one_call(task: dict[str, Any], resources: agl.Resources) -> float:
    """One LLM call through the loop's proxy; the reward alternates so every batch has an advantage signal."""
    llm = resources.llm
    assert llm is not None and llm.api_key
    request = {"model": llm.model, "messages": [{"role": "user", "content": "2+2="}], **llm.sampling_parameters}
    await chat_through_proxy(llm.api_key, request)
    return float(task["i"] % 2)


class FixedCostEngine(ScriptedServerEngine):
    """An engine whose update costs ``update_s`` seconds and whose server answers after ``latency_s`` seconds."""

    serves_during_update = True

    def __init__(self, latency_s: float, update_s: float) -> None:
        super().__init__(ScriptedModelServer(latency=latency_s))
        self.update_s = update_s

    def update(self, batch: agl.TrainingBatch) -> dict[str, float]:
        time.sleep(self.update_s)  # the simulated update: a fixed cost in the worker thread
        return {}

    async def sync_weights(self, version: int) -> None:
        self.server.model_version = version


async def iteration_wall(runners: int, k: int, args: argparse.Namespace) -> tuple[float, float]:
    """Median steady-state iteration wall time (between consecutive iteration ends, the first one left out as
    warm-up) and the largest staleness trained, for ``runners`` workers and bound ``k``."""
    ends: list[float] = []
    stale: list[float] = []

    def on_iteration(report: Any) -> None:
        ends.append(time.monotonic())
        stale.append(report.metrics.get("staleness_max", 0.0))

    with tempfile.TemporaryDirectory() as out:
        config = LoopConfig(
            output_dir=Path(out),
            model_name="sim",
            iterations=args.iterations,
            tasks_per_iteration=runners,
            samples_per_task=1,
            estimator="reinforce_pp",
            task_order="cycle",
            max_tokens=8,
            checkpoint_every=0,
            rollout_timeout_s=600,
            max_staleness=k,
        )
        store = agl.MemoryStore()
        engine = FixedCostEngine(args.latency, args.update)
        loop = RLLoop(config, engine, on_iteration=on_iteration)
        runner = agl.Runner(one_call, store=store, n_workers=runners, worker_mode="async", poll_interval=0.005)
        running = asyncio.create_task(runner.arun())
        try:
            await loop.run(store, [{"i": i} for i in range(runners)])
        finally:
            runner.stop()
            await running
            await loop.stop()
    gaps = [b - a for a, b in itertools.pairwise(ends[1:])]
    return statistics.median(gaps), max(stale)


async def main(args: argparse.Namespace) -> None:
    rows: list[dict[str, Any]] = []
    print(f"per-call latency {args.latency:.2f} s, update {args.update:.2f} s, {args.iterations} iterations per run")
    header = "| runners | k=0 s/it | " + " | ".join(f"k={k} s/it" for k in args.ks) + " | sum | max | k=0 / k=1 |"
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    for runners in args.runners:
        walls: dict[int, float] = {}
        staleness: dict[int, float] = {}
        for k in (0, *args.ks):
            walls[k], staleness[k] = await iteration_wall(runners, k, args)
        row = {
            "runners": runners,
            "wall_s": {str(k): round(v, 3) for k, v in walls.items()},
            "staleness_max": {str(k): v for k, v in staleness.items()},
            "ratio_k0_over": {str(k): round(walls[0] / walls[k], 3) for k in args.ks},
        }
        rows.append(row)
        cells = " | ".join(f"{walls[k]:.3f}" for k in args.ks)
        ratio = walls[0] / walls[args.ks[0]]
        print(
            f"| {runners} | {walls[0]:.3f} | {cells} | {args.latency + args.update:.2f} | "
            f"{max(args.latency, args.update):.2f} | {ratio:.2f}x |"
        )
    ideal = (args.latency + args.update) / max(args.latency, args.update)
    first = str(args.ks[0])
    summary = {
        "benchmark": "async_pipeline",
        "latency_s": args.latency,
        "update_s": args.update,
        "iterations": args.iterations,
        "ideal_ratio": round(ideal, 3),
        "rows": rows,
        f"ratio_k0_over_k{first}_min": min(r["ratio_k0_over"][first] for r in rows),
        f"ratio_k0_over_k{first}_max": max(r["ratio_k0_over"][first] for r in rows),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--latency", type=float, default=0.4, help="seconds per simulated LLM call (default: 0.4)")
    parser.add_argument("--update", type=float, default=0.4, help="seconds per simulated update (default: 0.4)")
    parser.add_argument("--iterations", type=int, default=6, help="iterations per run, the first a warm-up")
    parser.add_argument("--runners", type=int, nargs="+", default=[1, 4, 16, 64], help="runner workers to try")
    parser.add_argument("--ks", type=int, nargs="+", default=[1, 2], help="staleness bounds compared with k=0")
    parsed = parser.parse_args()
    if parsed.iterations < 3:
        parser.error("--iterations must be 3 or more (the first is a warm-up, a gap needs two ends)")
    logging.basicConfig(level=logging.ERROR)
    asyncio.run(main(parsed))
