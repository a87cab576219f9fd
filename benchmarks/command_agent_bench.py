"""What a command agent costs per rollout against the same agent in the runner's process.

The same agent logic (read the question, one chat completion through the LLM proxy with the official OpenAI SDK,
score the answer) runs four ways on the same scripted model behind a real `LLMProxy`, over a SQLite store:

* ``in-process``: an async ``@agl.rollout`` function with one ``AsyncOpenAI`` client (the baseline);
* ``python -I agent.py``: a `CommandAgent` per rollout, a fresh interpreter that imports ``openai``;
* ``python -I -S (urllib)``: the same call with the standard library only (what the interpreter alone costs);
* ``node agent.mjs``: a `CommandAgent` running Node.js with the ``openai`` npm package (needs ``npm ci`` in
  ``examples/node``: its ``node_modules`` is reused).

For each: wall seconds per rollout with one worker (latency) and with ``--workers`` (throughput), and CPU seconds
per rollout of this process and its children together. Prints a table, then one JSON line with the ratios to the
in-process agent.

    python benchmarks/command_agent_bench.py [--rollouts 40] [--workers 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shlex
import shutil
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import agentlightning as agl
from agentlightning.proxy import LLMProxy
from agentlightning.testing import ScriptedModelServer

ROOT = Path(__file__).resolve().parent.parent

PY_OPENAI = """
import json, os, sys
from openai import OpenAI
task = json.load(sys.stdin)
messages = [{"role": "user", "content": task["q"]}]
reply = OpenAI().chat.completions.create(model=os.environ["OPENAI_MODEL"], messages=messages)
print(json.dumps({"reward": 1.0 if "4" in reply.choices[0].message.content else 0.0}))
"""

PY_URLLIB = """
import json, os, sys, urllib.request
task = json.load(sys.stdin)
body = json.dumps({"model": os.environ["OPENAI_MODEL"], "messages": [{"role": "user", "content": task["q"]}]})
request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=body.encode(),
    headers={"Content-Type": "application/json", "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
reply = json.load(urllib.request.urlopen(request))
print(json.dumps({"reward": 1.0 if "4" in reply["choices"][0]["message"]["content"] else 0.0}))
"""

NODE_OPENAI = """
import OpenAI from "openai";
const chunks = [];
for await (const chunk of process.stdin) chunks.push(chunk);
const task = JSON.parse(Buffer.concat(chunks).toString());
const messages = [{role: "user", content: task.q}];
const reply = await new OpenAI().chat.completions.create({model: process.env.OPENAI_MODEL, messages});
console.log(JSON.stringify({reward: reply.choices[0].message.content.includes("4") ? 1.0 : 0.0}));
"""


@agl.rollout
async def in_process(task: dict[str, Any], resources: agl.Resources) -> float:
    """The baseline: the same logic in the runner's process (one client per base URL, as a long-lived app keeps)."""
    from openai import AsyncOpenAI

    assert resources.llm is not None
    key = (agl.llm_base_url(), resources.llm.api_key or "x")
    client = _CLIENTS.get(key) or _CLIENTS.setdefault(key, AsyncOpenAI(base_url=key[0], api_key=key[1]))
    reply = await client.chat.completions.create(
        model=resources.llm.model, messages=[{"role": "user", "content": task["q"]}]
    )
    return 1.0 if "4" in (reply.choices[0].message.content or "") else 0.0


_CLIENTS: dict[tuple[str, str], Any] = {}


def _cpu() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


async def _measure(agent: Any, rollouts: int, workers: int, folder: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds) per rollout of ``rollouts`` run by ``workers`` workers."""
    store = agl.SqliteStore(folder / f"bench-{time.monotonic_ns()}.db")
    with ScriptedModelServer(lambda request: "2 + 2 = 4") as model:
        async with LLMProxy(store, [model.base_url]) as proxy:
            await store.add_resources(agl.Resources(resources_id="v1", items={"llm": proxy.llm_resource("toy")}))
            for i in range(rollouts):
                await store.enqueue_rollout({"q": f"What is 2 + 2? ({i})"})
            cpu, start = _cpu(), time.perf_counter()
            await agl.Runner(agent, store=store, n_workers=workers, stop_when_idle=True, poll_interval=0.01).arun()
            wall, cpu = time.perf_counter() - start, _cpu() - cpu
            done = await store.query_rollouts(status=["succeeded"])
    await store.close()
    if len(done) != rollouts:
        raise RuntimeError(f"{rollouts - len(done)} rollout(s) of {agent} did not succeed")
    return wall / rollouts, cpu / rollouts


def _agents(folder: Path) -> dict[str, Any]:
    (folder / "agent.py").write_text(textwrap.dedent(PY_OPENAI))
    (folder / "agent_urllib.py").write_text(textwrap.dedent(PY_URLLIB))
    python = shlex.quote(sys.executable)
    agents: dict[str, Any] = {
        "in-process": in_process,
        "python -I agent.py (openai)": agl.CommandAgent(f"{python} -I agent.py", cwd=folder),
        "python -I -S (urllib)": agl.CommandAgent(f"{python} -I -S agent_urllib.py", cwd=folder),
    }
    node_modules = ROOT / "examples" / "node" / "node_modules"
    if shutil.which("node") and (node_modules / "openai").is_dir():
        (folder / "node_modules").symlink_to(node_modules)
        (folder / "agent.mjs").write_text(textwrap.dedent(NODE_OPENAI))
        agents["node agent.mjs (openai)"] = agl.CommandAgent("node agent.mjs", cwd=folder)
    else:
        print("node or examples/node/node_modules missing (cd examples/node && npm ci): Node.js not measured")
    return agents


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="agl-cmd-bench-") as tmp:
        folder = Path(tmp)
        results: dict[str, dict[str, float]] = {}
        for name, agent in _agents(folder).items():
            await _measure(agent, 2, 1, folder)  # warm: imports, the first client, the page cache
            latency, cpu_one = await _measure(agent, args.rollouts, 1, folder)
            throughput, cpu_many = await _measure(agent, args.rollouts, args.workers, folder)
            results[name] = {"ms_one": latency * 1e3, "ms_many": throughput * 1e3, "cpu_ms": cpu_one * 1e3}
            results[name]["cpu_ms_many"] = cpu_many * 1e3
    base = results["in-process"]
    print(
        f"{args.rollouts} rollouts, one LLM call each; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    )
    print(
        f"{'agent':32} {'ms/rollout, 1 worker':>21} {f'ms/rollout, {args.workers} workers':>22} {'CPU ms/rollout':>15}"
    )
    for name, r in results.items():
        print(f"{name:32} {r['ms_one']:21.1f} {r['ms_many']:22.1f} {r['cpu_ms']:15.1f}")
    ratios = {name: round(r["ms_one"] / base["ms_one"], 2) for name, r in results.items()}
    cpu_ratios = {name: round(r["cpu_ms"] / base["cpu_ms"], 2) for name, r in results.items()}
    summary = {
        "rollouts": args.rollouts,
        "workers": args.workers,
        "ms_per_rollout_one_worker": {name: round(r["ms_one"], 1) for name, r in results.items()},
        "ms_per_rollout_workers": {name: round(r["ms_many"], 1) for name, r in results.items()},
        "cpu_ms_per_rollout": {name: round(r["cpu_ms"], 1) for name, r in results.items()},
        "latency_ratio_to_in_process": ratios,
        "cpu_ratio_to_in_process": cpu_ratios,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="What a command agent costs per rollout against an in-process one.")
    parser.add_argument("--rollouts", type=int, default=40)
    parser.add_argument("--workers", type=int, default=4)
    asyncio.run(main(parser.parse_args()))
