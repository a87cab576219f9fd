"""CPU of the runner processes alone, per rollout: the quickstart's ``agl runner`` with the plain OpenAI agent.

`e2e_overhead.py --agent openai` charges the runner processes ~7 ms of CPU per rollout, but its figure moves with the
trainer sharing the machine. This runs the same runner command the quickstart starts (``agl runner --processes 2
--workers 128 --agent calc_openai_agent:calc_openai_agent --instrument openai --db FILE``: forked runners, one SQLite
file, the runner slots' proxy URLs) against an LLM proxy and a scripted OpenAI-compatible model in this process
(the calculator tool on the first call, the answer on the second: two LLM calls per rollout), and feeds it
``--waves`` waves of 128 rollouts, each queued once the last one has ended, as a training iteration does. Only the
runner processes' CPU is counted (they are the measuring process's children); its proxy, model and polling are not.
Each run is a process of its own on its checkout's sources (``--against``: another checkout, alternately).

Prints the runners' CPU seconds in all, the supervisor's share (its imports before the fork), the forked runners'
first wave (their clients and first calls), their CPU per rollout after the first wave, and their stop; each from
/proc while they run, the total from ``getrusage`` once they have exited. Also this process's CPU per rollout after
the first wave (the LLM proxy serving the agents' calls and the runners' slot requests, as a trainer does, plus the
scripted model and the polling): what the runners' requests cost the other side. Ends with one JSON line.

    .venv/bin/python benchmarks/runner_cpu_bench.py [--waves 6] [--repeats 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import agentlightning as agl
from agentlightning.store import SqliteStore

ROOT = Path(__file__).resolve().parent.parent
WAVE = 128
TICK = os.sysconf("SC_CLK_TCK")


@agl.rollout
async def noop_agent(task: dict[str, Any], resources: agl.Resources) -> float:
    """``--agent noop``: no LLM call, a reward at once (what the framework costs per rollout without the agent)."""
    return 1.0


def _reply(body: dict[str, Any]) -> Any:
    """First call: the calculator tool; second call (a tool result is in the messages): the answer."""
    from agentlightning.testing import ScriptedReply

    messages = body["messages"]
    if messages[-1]["role"] == "tool":
        return ScriptedReply(content=f"A:{messages[-1]['content']}")
    expression = str(messages[-1]["content"]).removeprefix("Q:").removesuffix("=")
    return ScriptedReply(tool_calls=[{"name": "calculator", "arguments": {"expression": expression}}])


def _cpu_of(pid: int) -> float:
    """CPU seconds (user + system) a live process has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def _children_of(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with open(task / "children") as f:
            found += [int(p) for p in f.read().split()]
    return found


def _rusage_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


async def _wait_done(store: SqliteStore, expected: int) -> None:
    while True:
        counts = (await store.stats()).rollouts
        if counts.get("succeeded", 0) + counts.get("failed", 0) >= expected:
            if counts.get("failed", 0):
                raise RuntimeError(f"{counts['failed']} rollouts failed: see the runner's log")
            return
        await asyncio.sleep(0.05)


AGENTS = {  # agent, its folder in a checkout, --instrument, LLM calls per rollout
    "openai": ("calc_openai_agent:calc_openai_agent", "examples/calc", "openai", 2),
    "noop": ("runner_cpu_bench:noop_agent", "benchmarks", "openai", 0),
}


def _sources(checkout: Path) -> str:
    """The PYTHONPATH that runs ``checkout``'s packages (its ``packages/*/src``)."""
    return os.pathsep.join(str(src) for src in sorted(checkout.glob("packages/*/src")))


async def _one_run(agent: str, checkout: Path, waves: int, model_url: str, workdir: Path) -> dict[str, float]:
    from agentlightning.proxy import LLMProxy
    from agentlightning_torch.runkit import AgentRunners

    ref, folder, instrument, calls = AGENTS[agent]
    app_dir = (checkout if agent != "noop" else ROOT) / folder
    env = {"PYTHONPATH": _sources(checkout)}
    db = workdir / f"runs-{time.time_ns()}.sqlite"
    store = SqliteStore(db)
    proxy = LLMProxy(store, [model_url], token="bench-token-0123456789")
    await proxy.start()
    runner: subprocess.Popen[bytes] | None = None
    try:
        llm = proxy.llm_resource("toy", sampling_parameters={"temperature": 1.0})
        resources = await store.add_resources(agl.Resources(resources_id="policy", items={"llm": llm}))
        runners = AgentRunners(ref, app_dir=app_dir, instrument=instrument, worker_mode="async", env=env)
        before = _rusage_children()
        runner = runners.start(["--db", str(db)], WAVE, 2)[0]
        marks: list[float] = []
        serving: list[float] = []  # this process's CPU (the LLM proxy, the scripted model, the polling) at each mark
        supervisor = 0.0
        for wave in range(waves):
            for i in range(WAVE):
                n = wave * WAVE + i
                await store.enqueue_rollout(
                    {"question": f"Q:{n % 97}*{n % 13 + 2}+{n % 7}=", "answer": (n % 97) * (n % 13 + 2) + n % 7},
                    resources_id=resources.resources_id,
                )
            await _wait_done(store, (wave + 1) * WAVE)
            supervisor = _cpu_of(runner.pid)
            marks.append(sum(_cpu_of(pid) for pid in _children_of(runner.pid)))
            serving.append(time.process_time())
        runner.send_signal(signal.SIGTERM)
        runner.wait(60)
        total = _rusage_children() - before
        stats = await store.stats()
        llm_calls, spans = stats.llm_calls, stats.spans
    finally:
        if runner is not None and runner.poll() is None:
            runner.kill()
        await proxy.stop()
        await store.close()
    rollouts = waves * WAVE
    if llm_calls != calls * rollouts:
        raise RuntimeError(f"expected {calls * rollouts} recorded LLM calls, got {llm_calls}")
    return {
        "cpu_s": round(total, 3),
        "supervisor_cpu_s": round(supervisor, 3),
        "first_wave_cpu_s": round(marks[0], 3),
        "per_rollout_ms_after_first": round(1000 * (marks[-1] - marks[0]) / max(rollouts - WAVE, 1), 3),
        "stop_cpu_s": round(total - supervisor - marks[-1], 3),
        "serving_ms_per_rollout_after_first": round(1000 * (serving[-1] - serving[0]) / max(rollouts - WAVE, 1), 3),
        "ms_per_rollout": round(1000 * total / rollouts, 3),
        "spans_per_rollout": round(spans / rollouts, 2),
    }


async def _measure(agent: str, checkout: Path, waves: int) -> dict[str, float]:
    """One run, in this process: its proxy, model and store are this process's sources (``--checkout``'s)."""
    from agentlightning.testing import ScriptedModelServer

    with ScriptedModelServer(_reply) as model, tempfile.TemporaryDirectory() as tmp:
        return await _one_run(agent, checkout, waves, model.url, Path(tmp))


def _run(agent: str, checkouts: list[Path], waves: int, repeats: int) -> dict[str, list[dict[str, float]]]:
    """Each run in a process of its own on that checkout's sources (its store file's schema is its own)."""
    runs: dict[str, list[dict[str, float]]] = {str(c): [] for c in checkouts}
    for _ in range(repeats):  # alternated: a shared machine's speed drifts
        for checkout in checkouts:
            cmd = [sys.executable, __file__, "--agent", agent, "--waves", str(waves), "--checkout", str(checkout)]
            env = {**os.environ, "PYTHONPATH": _sources(checkout)}
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise RuntimeError(f"the run on {checkout} failed:\n{done.stderr[-3000:]}")
            run = json.loads(done.stdout.strip().splitlines()[-1])
            print(checkout, "  ".join(f"{k} {v}" for k, v in run.items()), file=sys.stderr, flush=True)
            runs[str(checkout)].append(run)
    return runs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--waves", type=int, default=6, help="waves of 128 rollouts (at least 2)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument(
        "--agent", choices=tuple(AGENTS), default="openai", help="the calculator's plain OpenAI agent, or no agent"
    )
    parser.add_argument(
        "--against",
        type=Path,
        default=None,
        help="another checkout (e.g. the main branch's) whose runners run alternately with this one's, same waves",
    )
    parser.add_argument("--checkout", type=Path, default=None, help=argparse.SUPPRESS)  # one run, on these sources
    args = parser.parse_args()
    if args.waves < 2:
        parser.error("--waves must be at least 2")
    logging.basicConfig(level=logging.WARNING)
    if args.checkout is not None:
        print(json.dumps(asyncio.run(_measure(args.agent, args.checkout, args.waves))))
        return 0
    checkouts = [ROOT] if args.against is None else [args.against.resolve(), ROOT]
    load = os.getloadavg()[0]
    runs = _run(args.agent, checkouts, args.waves, args.repeats)
    medians = {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in runs.items()}
    print(f"{'':44}{'CPU s':>8}{'supervisor':>12}{'1st wave':>10}{'ms/rollout after':>18}", file=sys.stderr)
    for name, m in medians.items():
        print(
            f"{name[-44:]:44}{m['cpu_s']:>8.2f}{m['supervisor_cpu_s']:>12.2f}{m['first_wave_cpu_s']:>10.2f}"
            f"{m['per_rollout_ms_after_first']:>18.3f}",
            file=sys.stderr,
        )
    load_after = os.getloadavg()[0]
    summary = {"agent": args.agent, "waves": args.waves, "load": [round(load, 2), round(load_after, 2)]}
    print(json.dumps({**summary, "medians": medians, "runs": runs}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
