"""LLM proxy: latency it adds per request, over real loopback HTTP.

Run: ``.venv/bin/python benchmarks/proxy_bench.py [--requests N] [--quick] [--vllm] [--baseline SRC]``

Setup: the scripted model server (``agentlightning.testing.ScriptedModelServer``) runs in its own process; each
proxy configuration runs in its own process too (so the client, the proxy and the backend do not share a GIL).
One aiohttp client in this process sends ``--requests`` sequential chat completions (a two-message prompt, a
short reply), alternating one request straight to the backend with one through the proxy, so both see the same
machine load. The backend request is the one the proxy would forward (token ids and logprobs asked for), so the
difference is only the proxy's own work: receive, parse, forward, read the ids, record the call, answer.

Configurations: ``sync`` (the default: each call written to an in-memory store before answering), ``background``
(writes batched), ``sqlite-sync`` (``agl proxy serve --db``: one SQLite commit per call before answering), and
``stream`` (the same request with ``stream: true``, timed to the last byte), ``responses`` and ``responses-stream``
(the same conversation sent by the agent as an OpenAI Responses call, ``POST .../v1/responses``: the proxy translates
it into the chat request the direct path sends, and the chat answer back), ``messages`` and ``messages-stream``
(the call as an Anthropic Messages request to ``/v1/messages``, against the chat request the proxy forwards for it).
With ``--baseline SRC`` (another
``packages/core/src``, e.g. ``git archive <commit> packages/core/src``), also ``sync-baseline``: that code's ``sync``
proxy, measured as a pair with this code's in the same loop (direct, this proxy, that proxy, rotating), and
``chat_added_ratio``, this proxy's added mean latency over the baseline's (the chat path must not get slower).
With ``--vllm``, also ``vllm`` (and
``vllm-stream``): the ``sync`` proxy in front of a real vLLM server (``$AGL_VLLM_VENV`` or ``.venv-vllm``) serving
a tiny Qwen2 built here, greedy replies of 8 tokens; vLLM's own latency is the "direct" column.

Prints a table and ends with ONE line: a JSON object of every figure (milliseconds).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import aiohttp

HERE = os.path.abspath(__file__)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# ---------------------------------------------------------------- child processes
def _serve_backend() -> None:
    from agentlightning.testing import ScriptedModelServer

    with ScriptedModelServer(lambda body: "The answer is 42.") as server:
        print(server.url, flush=True)
        sys.stdin.read()  # until the parent closes it


async def _open_attempt(store: Any) -> str:
    """Start a real rollout attempt (the proxy refuses calls for attempts the store never started): its URL prefix."""
    await store.enqueue_rollout({"bench": True})
    claim = await store.dequeue_rollout("bench-worker")
    if claim is None:
        raise RuntimeError("the store handed out no attempt for the bench rollout")
    return f"/rollout/{claim.rollout.rollout_id}/attempt/{claim.attempt.attempt_id}"


def _serve_proxy(backend: str, port: int, record: str) -> None:
    import uvicorn

    from agentlightning.proxy import LLMProxy
    from agentlightning.store import MemoryStore

    store = MemoryStore()
    print(asyncio.run(_open_attempt(store)), flush=True)  # the parent reads the attempt's URL prefix
    proxy = LLMProxy(store, [backend], record=record)  # type: ignore[arg-type]
    uvicorn.run(proxy.app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


async def _sqlite_attempt(path: str) -> str:
    """Make the SQLite file ``agl proxy serve --db`` will use, with one started attempt in it."""
    from agentlightning.store import SqliteStore

    store = SqliteStore(path)
    try:
        return await _open_attempt(store)
    finally:
        await store.close()


def _spawn(args: list[str], src: str | None = None) -> subprocess.Popen[str]:
    """A child process; with ``src``, it imports ``agentlightning`` from that source folder (the baseline)."""
    env = None
    if src is not None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)


async def _wait_ready(url: str, proc: subprocess.Popen[str]) -> None:
    async with aiohttp.ClientSession() as http:
        for _ in range(600):
            try:
                async with http.get(url) as resp:
                    if resp.status < 500:
                        return
            except aiohttp.ClientError:
                if proc.poll() is not None:
                    raise RuntimeError(f"server process exited with {proc.returncode}") from None
                await asyncio.sleep(0.05)
    raise RuntimeError(f"{url} did not come up")


# ---------------------------------------------------------------- measurement
BODY = {"model": "toy", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "6*7?"}]}


async def _timed(http: aiohttp.ClientSession, url: str, body: bytes) -> float:
    start = time.perf_counter()
    async with http.post(url, data=body, headers={"Content-Type": "application/json"}) as resp:
        await resp.read()
        if resp.status != 200:
            raise RuntimeError(f"{url} answered {resp.status}")
    return (time.perf_counter() - start) * 1000.0


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


VLLM_BODY = {**BODY, "max_tokens": 8, "temperature": 0.0}
RESPONSES_BODY = {"model": "toy", "instructions": "Be brief.", "input": "6*7?"}
"""The conversation of `BODY` as an OpenAI Responses request (the proxy sends the backend `BODY`)."""


async def _measure(
    backend: str,
    proxy: str,
    prefix: str,
    n: int,
    stream: bool,
    pids: tuple[int, int],
    body: dict[str, Any] = BODY,
    responses: bool = False,
) -> dict[str, float]:
    agent_body = dict(RESPONSES_BODY if responses else body, stream=stream)
    backend_body = dict(body, stream=stream, return_token_ids=True, logprobs=True)  # what the proxy forwards
    if stream and responses:
        backend_body["stream_options"] = {"include_usage": True}
    direct_url = f"{backend}/v1/chat/completions"
    proxy_url = f"{proxy}{prefix}/v1/{'responses' if responses else 'chat/completions'}"
    raw_direct, raw_proxy = json.dumps(backend_body).encode(), json.dumps(agent_body).encode()
    direct: list[float] = []
    proxied: list[float] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=4)) as http:
        for _ in range(min(100, n // 5)):  # warm-up: connections, caches
            await _timed(http, direct_url, raw_direct)
            await _timed(http, proxy_url, raw_proxy)
        cpu_before = [_cpu_seconds(pid) for pid in pids]
        for i in range(n):
            if i % 2:
                direct.append(await _timed(http, direct_url, raw_direct))
                proxied.append(await _timed(http, proxy_url, raw_proxy))
            else:
                proxied.append(await _timed(http, proxy_url, raw_proxy))
                direct.append(await _timed(http, direct_url, raw_direct))
        cpu_after = [_cpu_seconds(pid) for pid in pids]
    figures = _figures(direct, proxied)
    # CPU the proxy process spent per request: what it adds on an idle machine, whatever the load here.
    figures["proxy_cpu_per_request_ms"] = (cpu_after[0] - cpu_before[0]) * 1000.0 / n
    # the backend serves both paths: 2n requests
    figures["backend_cpu_per_request_ms"] = (cpu_after[1] - cpu_before[1]) * 1000.0 / (2 * n)
    return figures


async def _measure_pair(
    backend: str, proxies: tuple[str, str], n: int, pids: tuple[int, int, int]
) -> tuple[dict[str, float], dict[str, float]]:
    """This code's proxy and the baseline's (each ``url + attempt prefix``), chat, in one loop: their figures."""
    direct_url = f"{backend}/v1/chat/completions"
    urls = [direct_url, *(f"{proxy}/v1/chat/completions" for proxy in proxies)]
    raws = [json.dumps(dict(BODY, return_token_ids=True, logprobs=True)).encode(), *[json.dumps(BODY).encode()] * 2]
    times: list[list[float]] = [[], [], []]
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=4)) as http:
        for _ in range(min(100, n // 5)):  # warm-up: connections, caches
            for url, raw in zip(urls, raws, strict=True):
                await _timed(http, url, raw)
        cpu_before = [_cpu_seconds(pid) for pid in pids]
        for i in range(n):
            for k in range(3):  # rotating order: none of the three always follows another
                j = (i + k) % 3
                times[j].append(await _timed(http, urls[j], raws[j]))
        cpu_after = [_cpu_seconds(pid) for pid in pids]
    pair = (_figures(times[0], times[1]), _figures(times[0], times[2]))
    for figures, before, after in zip(pair, cpu_before, cpu_after, strict=False):
        figures["proxy_cpu_per_request_ms"] = (after - before) * 1000.0 / n
        figures["backend_cpu_per_request_ms"] = (cpu_after[2] - cpu_before[2]) * 1000.0 / (3 * n)  # 3n requests
    return pair


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _figures(direct: list[float], proxied: list[float]) -> dict[str, float]:
    diffs = [p - d for p, d in zip(proxied, direct, strict=True)]
    return {
        "direct_p50_ms": _pct(direct, 0.5),
        "direct_p99_ms": _pct(direct, 0.99),
        "proxy_p50_ms": _pct(proxied, 0.5),
        "proxy_p99_ms": _pct(proxied, 0.99),
        "added_p50_ms": _pct(proxied, 0.5) - _pct(direct, 0.5),
        "added_p99_ms": _pct(proxied, 0.99) - _pct(direct, 0.99),
        "added_mean_ms": statistics.fmean(diffs),
    }


MESSAGES_BODY = {
    "model": "toy",
    "max_tokens": 64,
    "system": "Be brief.",
    "messages": [{"role": "user", "content": "6*7?"}],
}


async def _measure_messages(
    backend: str, proxy: str, prefix: str, n: int, stream: bool, pids: tuple[int, int]
) -> dict[str, float]:
    """The same call sent as Anthropic Messages (``/v1/messages``): direct is the chat request the proxy forwards for
    it, so the difference is the proxy's work plus the translation both ways (the stream: event by event)."""
    agent_body = dict(MESSAGES_BODY, stream=stream)
    backend_body = dict(BODY, max_tokens=64, stream=stream, return_token_ids=True, logprobs=True)  # its translation
    if stream:
        backend_body["stream_options"] = {"include_usage": True}
    urls = (f"{backend}/v1/chat/completions", f"{proxy}{prefix}/v1/messages")
    raws = (json.dumps(backend_body).encode(), json.dumps(agent_body).encode())
    times: tuple[list[float], list[float]] = ([], [])
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=4)) as http:
        for _ in range(min(100, n // 5)):  # warm-up: connections, caches
            for url, raw in zip(urls, raws, strict=True):
                await _timed(http, url, raw)
        cpu_before = [_cpu_seconds(pid) for pid in pids]
        for i in range(n):
            for side in (0, 1) if i % 2 else (1, 0):  # alternate which goes first, as `_measure` does
                times[side].append(await _timed(http, urls[side], raws[side]))
        cpu_after = [_cpu_seconds(pid) for pid in pids]
    figures = _figures(times[0], times[1])
    figures["proxy_cpu_per_request_ms"] = (cpu_after[0] - cpu_before[0]) * 1000.0 / n
    figures["backend_cpu_per_request_ms"] = (cpu_after[1] - cpu_before[1]) * 1000.0 / (2 * n)
    return figures


async def _measure_vllm(n: int, results: dict[str, Any], children: list[subprocess.Popen[str]]) -> None:
    """The ``sync`` proxy in front of a real vLLM server, plain and streamed."""
    from agentlightning_torch import VLLMServer
    from agentlightning_torch.testing import make_tiny_chat_model

    scratch = tempfile.mkdtemp(prefix="agl-proxy-bench-vllm-")
    folder = make_tiny_chat_model(os.path.join(scratch, "model"), hidden_size=128, num_layers=4, num_heads=4)
    server = VLLMServer(folder, served_model_name="toy", enforce_eager=True).start()
    try:
        pid = server.pid  # the API server process (its engine core is a child process)
        for name, stream in (("vllm", False), ("vllm-stream", True)):
            port = _free_port()
            proc = _spawn([sys.executable, HERE, "_proxy", server.url, str(port), "sync"])
            children.append(proc)
            assert proc.stdout is not None
            prefix = proc.stdout.readline().strip()
            url = f"http://127.0.0.1:{port}"
            await _wait_ready(f"{url}/v1/models", proc)
            results[name] = await _measure(server.url, url, prefix, n, stream, (proc.pid, pid), VLLM_BODY)
            proc.terminate()
            proc.wait(timeout=30)
    finally:
        server.stop()


async def _run(n: int, vllm: bool = False, baseline: str | None = None) -> dict[str, Any]:
    py = sys.executable
    children: list[subprocess.Popen[str]] = []
    results: dict[str, Any] = {"requests": n}
    try:
        backend_proc = _spawn([py, HERE, "_backend"])
        children.append(backend_proc)
        assert backend_proc.stdout is not None
        backend = backend_proc.stdout.readline().strip()
        await _wait_ready(f"{backend}/v1/models", backend_proc)
        tmp = tempfile.mkdtemp(prefix="agl-proxy-bench-")
        # (name, command, stream, attempt URL prefix; None: the child prints it)
        configs: list[tuple[str, list[str], bool, str | None]] = []
        for record in ("sync", "background"):
            configs.append((record, [py, HERE, "_proxy", backend, "{port}", record], False, None))
        agl = [py, "-c", "import sys; from agentlightning.cli import main; sys.exit(main())"]
        db = os.path.join(tmp, "bench.db")
        sqlite_cmd = [*agl, "proxy", "serve", "--db", db, "--backend", backend]
        configs.append(("sqlite-sync", [*sqlite_cmd, "--port", "{port}"], False, await _sqlite_attempt(db)))
        configs.append(("stream", [py, HERE, "_proxy", backend, "{port}", "sync"], True, None))
        configs.append(("responses", [py, HERE, "_proxy", backend, "{port}", "sync"], False, None))
        configs.append(("responses-stream", [py, HERE, "_proxy", backend, "{port}", "sync"], True, None))
        if baseline is not None:
            await _run_pair(n, backend, backend_proc.pid, baseline, results, children)
        for name, template, stream, prefix in configs:
            port = _free_port()
            proc = _spawn([part.replace("{port}", str(port)) for part in template])
            children.append(proc)
            if prefix is None:
                assert proc.stdout is not None
                prefix = proc.stdout.readline().strip()
            url = f"http://127.0.0.1:{port}"
            await _wait_ready(f"{url}/v1/models", proc)
            results[name] = await _measure(
                backend, url, prefix, n, stream, (proc.pid, backend_proc.pid), responses=name.startswith("responses")
            )
            proc.terminate()
            proc.wait(timeout=30)
        for name, stream in (("messages", False), ("messages-stream", True)):  # the Anthropic Messages path
            port = _free_port()
            proc = _spawn([py, HERE, "_proxy", backend, str(port), "sync"])
            children.append(proc)
            assert proc.stdout is not None
            prefix = proc.stdout.readline().strip()
            await _wait_ready(f"http://127.0.0.1:{port}/v1/models", proc)
            pids = (proc.pid, backend_proc.pid)
            results[name] = await _measure_messages(backend, f"http://127.0.0.1:{port}", prefix, n, stream, pids)
            proc.terminate()
            proc.wait(timeout=30)
        if vllm:
            await _measure_vllm(n, results, children)
    finally:
        for proc in children:
            if proc.poll() is None:
                if proc.stdin:
                    proc.stdin.close()
                proc.terminate()
                proc.wait(timeout=30)
    return results


async def _run_pair(
    n: int, backend: str, backend_pid: int, baseline: str, results: dict[str, Any], children: list[Any]
) -> None:
    """This code's ``sync`` proxy and the baseline's, measured together (`_measure_pair`)."""
    urls: list[str] = []
    pids: list[int] = []
    for src in (None, baseline):
        port = _free_port()
        proc = _spawn([sys.executable, HERE, "_proxy", backend, str(port), "sync"], src)
        children.append(proc)
        assert proc.stdout is not None
        prefix = proc.stdout.readline().strip()
        await _wait_ready(f"http://127.0.0.1:{port}/v1/models", proc)
        urls.append(f"http://127.0.0.1:{port}{prefix}")
        pids.append(proc.pid)
    ours, theirs = await _measure_pair(backend, (urls[0], urls[1]), n, (pids[0], pids[1], backend_pid))
    results["sync-pair"], results["sync-baseline"] = ours, theirs
    results["chat_added_ratio"] = ours["added_mean_ms"] / theirs["added_mean_ms"]


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_backend":
        _serve_backend()
        return
    if len(sys.argv) > 1 and sys.argv[1] == "_proxy":
        _serve_proxy(sys.argv[2], int(sys.argv[3]), sys.argv[4])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1000, help="timed requests per configuration and path")
    parser.add_argument("--quick", action="store_true", help="200 requests per configuration")
    parser.add_argument("--vllm", action="store_true", help="also in front of a real vLLM server")
    parser.add_argument("--baseline", help="another packages/core/src: its sync proxy measured as a pair with this one")
    args = parser.parse_args()
    n = 200 if args.quick else args.requests
    results = asyncio.run(_run(n, args.vllm, args.baseline))
    header = f"{'config':<15} {'direct p50':>10} {'proxy p50':>10} {'added p50':>10} {'direct p99':>10} "
    header += f"{'proxy p99':>10} {'added p99':>10} {'added mean':>10} {'proxy CPU':>10} {'backend CPU':>11}"
    print(f"LLM proxy added latency, {n} sequential requests per path, ms; load average {os.getloadavg()[0]:.1f}")
    print("(CPU = process CPU time per request; on a loaded machine wall-clock latency is dominated by scheduling)")
    print(header)
    for name, fig in results.items():
        if not isinstance(fig, dict):
            continue
        print(
            f"{name:<15} {fig['direct_p50_ms']:>10.3f} {fig['proxy_p50_ms']:>10.3f} {fig['added_p50_ms']:>10.3f} "
            f"{fig['direct_p99_ms']:>10.3f} {fig['proxy_p99_ms']:>10.3f} {fig['added_p99_ms']:>10.3f} "
            f"{fig['added_mean_ms']:>10.3f} {fig['proxy_cpu_per_request_ms']:>10.3f} "
            f"{fig['backend_cpu_per_request_ms']:>11.3f}"
        )
    if "chat_added_ratio" in results:
        print(f"chat path, this code's added mean latency / the baseline's: {results['chat_added_ratio']:.3f}")
    flat: dict[str, Any] = {"benchmark": "proxy_latency", "requests": n, "load_average": os.getloadavg()[0]}
    for name, fig in results.items():
        if isinstance(fig, dict):
            for key, value in fig.items():
                flat[f"{name.replace('-', '_')}_{key}"] = round(value, 4)
        elif name == "chat_added_ratio":
            flat[name] = round(fig, 4)
    print(json.dumps(flat))


if __name__ == "__main__":
    main()
