"""Rollouts per second with runners in one vs two network namespaces (same total workers), as a ratio.

Run as root (it builds network namespaces): ``.venv/bin/python benchmarks/netns_bench.py [--quick]``.

A "trainer" namespace serves a SQLite store (``agl store serve``, token) and the LLM proxy (``agl proxy serve``,
token) in front of a scripted OpenAI-compatible model; runner namespaces reach it only through veth links. Each
rollout is one agent that makes one chat call through the proxy (recorded with token ids) and returns a reward,
so the figure is the framework's own cost across a real network stack, not a model's. Two layouts with the same
total workers: both runner processes in one namespace, or one runner in each of two namespaces (each with its own
link). Prints a table, then one JSON line; ``ratio_two_over_one`` near 1.0 means the layout does not matter.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import agentlightning as agl

STORE_TOKEN = "bench-store-token-0123456789"
PROXY_TOKEN = "bench-proxy-token-0123456789"
RUNNER_TOKEN = "bench-runner-token-0123456789"
STORE_PORT, PROXY_PORT = 4747, 4748
HERE = Path(__file__).resolve().parent

MODEL = """
import threading
from agentlightning.testing import ScriptedModelServer
server = ScriptedModelServer().start()
print(server.url, flush=True)
threading.Event().wait()
"""


@agl.rollout
async def bench_agent(task: Any, resources: agl.Resources) -> float:
    """One chat call through the proxy (its per-rollout URL and token), reward 1."""
    import openai

    llm = resources.llm
    assert llm is not None
    client = openai.AsyncOpenAI(base_url=agl.llm_base_url(), api_key=llm.api_key or "none", max_retries=2)
    try:
        await client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": str(task)}])
    finally:
        await client.close()
    return 1.0


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


class Topology:
    """A trainer namespace linked by its own veth pair to each of ``n`` runner namespaces."""

    def __init__(self, n: int) -> None:
        tag = f"{os.getpid() % 100000}"
        self.trainer = f"aglb{tag}t"
        self.runners = [f"aglb{tag}r{i}" for i in range(n)]
        self.trainer_ip = "10.213.200.1"
        self.procs: list[subprocess.Popen[Any]] = []
        self._made: list[str] = []
        try:
            for ns in (self.trainer, *self.runners):
                _ip("netns", "add", ns)
                self._made.append(ns)
                _ip("-n", ns, "link", "set", "lo", "up")
            for i, ns in enumerate(self.runners):
                subnet = f"10.213.{200 + i}"
                near, far = f"vb{tag}t{i}", f"vb{tag}r{i}"
                _ip("link", "add", near, "netns", self.trainer, "type", "veth", "peer", "name", far, "netns", ns)
                _ip("-n", self.trainer, "addr", "add", f"{subnet}.1/24", "dev", near)
                _ip("-n", ns, "addr", "add", f"{subnet}.2/24", "dev", far)
                _ip("-n", self.trainer, "link", "set", near, "up")
                _ip("-n", ns, "link", "set", far, "up")
                if i > 0:  # every runner namespace reaches the trainer at the same address, through its own link
                    _ip("-n", ns, "route", "add", "10.213.200.0/24", "via", f"{subnet}.1")
        except BaseException:
            self.close()
            raise

    def popen(self, ns: str, cmd: list[str], env: dict[str, str], **kwargs: Any) -> subprocess.Popen[Any]:
        proc = subprocess.Popen(["ip", "netns", "exec", ns, *cmd], env={**os.environ, **env}, **kwargs)
        self.procs.append(proc)
        return proc

    def stop(self, procs: list[subprocess.Popen[Any]]) -> None:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def close(self) -> None:
        self.stop(self.procs)
        for ns in self._made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def _serve(topo: Topology, db: Path, log: Path) -> None:
    agl_cmd = [sys.executable, "-m", "agentlightning.cli"]
    env = {"AGL_STORE_TOKEN": STORE_TOKEN, "AGL_PROXY_TOKEN": PROXY_TOKEN, "AGL_PROXY_RUNNER_TOKEN": RUNNER_TOKEN}
    model = topo.popen(topo.trainer, [sys.executable, "-c", MODEL], env, stdout=subprocess.PIPE, text=True)
    assert model.stdout is not None
    model_url = model.stdout.readline().strip()
    assert model_url.startswith("http://"), model_url
    out = log.open("a")
    store = [*agl_cmd, "store", "serve", "--db", str(db), "--host", topo.trainer_ip, "--port", str(STORE_PORT)]
    topo.popen(topo.trainer, store, env, stdout=out, stderr=out)
    proxy = [*agl_cmd, "proxy", "serve", "--store-url", f"http://{topo.trainer_ip}:{STORE_PORT}", "--record", "sync"]
    proxy += ["--backend", model_url, "--host", topo.trainer_ip, "--port", str(PROXY_PORT)]
    topo.popen(topo.trainer, proxy, {**env, "AGL_STORE_TOKEN": STORE_TOKEN}, stdout=out, stderr=out)


async def _publish(store: agl.LightningStore, topo: Topology) -> None:
    endpoint = f"http://{topo.trainer_ip}:{PROXY_PORT}"
    llm = agl.LLMResource(endpoint=endpoint, model="toy", api_key=PROXY_TOKEN, runner_token=RUNNER_TOKEN)
    await store.add_resources(agl.Resources(resources_id=f"bench-{time.time_ns()}", items={"llm": llm}))


async def _measure(store: agl.LightningStore, n: int, label: str) -> float:
    ids = [r.rollout_id for r in await store.enqueue_rollouts([agl.RolloutRequest(input=i) for i in range(n)])]
    start = time.perf_counter()
    finished = await store.wait_for_rollouts(ids, timeout=600)
    elapsed = time.perf_counter() - start
    ok = sum(r.status == "succeeded" for r in finished)
    if ok != n:
        raise RuntimeError(f"{label}: only {ok} of {n} rollouts succeeded")
    return n / elapsed


def _runners(topo: Topology, namespaces: list[str], workers: int, log: Path) -> list[subprocess.Popen[Any]]:
    cmd = [
        sys.executable,
        "-m",
        "agentlightning.cli",
        "runner",
        "--store-url",
        f"http://{topo.trainer_ip}:{STORE_PORT}",
    ]
    cmd += ["--app-dir", str(HERE), "--agent", "netns_bench:bench_agent", "--workers", str(workers)]
    cmd += ["--no-instrument", "--poll-interval", "0.02"]
    out = log.open("a")
    return [
        topo.popen(ns, cmd, {"AGL_STORE_TOKEN": STORE_TOKEN, "OMP_NUM_THREADS": "1"}, stdout=out, stderr=out)
        for ns in namespaces
    ]


async def _wait_ready(store: agl.LightningStore) -> None:
    """One rollout through the whole path, so every process is up before timing."""
    await _measure(store, 1, "warm-up")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer rollouts and one round")
    parser.add_argument("--workers", type=int, default=16, help="workers per runner process (2 runners)")
    args = parser.parse_args()
    if os.geteuid() != 0 or shutil.which("ip") is None:
        print("netns_bench needs root and iproute2 (`ip netns`)", file=sys.stderr)
        return 2
    rollouts, rounds = (100, 1) if args.quick else (400, 3)
    tmp = Path(tempfile.mkdtemp(prefix="netns_bench_"))
    db, log = tmp / "store.db", tmp / "bench.log"
    agl.SqliteStore(db)  # create the file before the server and this process share it
    topo = Topology(2)
    rates: dict[str, list[float]] = {"one": [], "two": []}
    try:
        _serve(topo, db, log)
        store = agl.SqliteStore(db)
        asyncio.run(_publish(store, topo))
        layouts = {"one": [topo.runners[0], topo.runners[0]], "two": [topo.runners[0], topo.runners[1]]}
        for _ in range(rounds):
            for name, namespaces in layouts.items():
                procs = _runners(topo, namespaces, args.workers, log)
                asyncio.run(_wait_ready(store))
                rates[name].append(asyncio.run(_measure(store, rollouts, name)))
                topo.stop(procs)
        asyncio.run(store.close())
    finally:
        topo.close()
    best = {name: max(values) for name, values in rates.items()}
    total = 2 * args.workers
    print(f"{'layout':<44} {'rollouts/s (best)':>18} {'all rounds':>24}")
    print(f"{f'2 runners x {args.workers} workers, 1 namespace':<44} {best['one']:>18.1f} {rates['one']!s:>24}")
    print(f"{f'1 runner x {args.workers} workers in each of 2':<44} {best['two']:>18.1f} {rates['two']!s:>24}")
    ratio = best["two"] / best["one"]
    print(f"ratio two namespaces / one namespace: {ratio:.3f} ({total} workers in all, {rollouts} rollouts/round)")
    print(
        json.dumps(
            {
                "rollouts_per_s_one_namespace": round(best["one"], 2),
                "rollouts_per_s_two_namespaces": round(best["two"], 2),
                "ratio_two_over_one": round(ratio, 3),
                "workers_total": total,
                "rollouts_per_round": rollouts,
                "rounds": rounds,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
