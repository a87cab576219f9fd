"""Generated tokens/s of `LocalBackend` (continuous batching) against plain transformers ``generate`` and real vLLM.

For each concurrency (default 1, 16 and 128) the same requests — prompt lengths and output lengths drawn from
``--prompt-tokens`` and ``--output-tokens``, greedy, eos ignored so every request produces exactly the tokens it
asked for — are served twice:

- **transformers**: one ``model.generate`` call over all of them, left-padded (static batching: every row decodes
  as many steps as the longest request; only the tokens each request asked for are counted);
- **backend**: all submitted at once to a started `LocalBackend` (rows leave as they finish, KV cache per row);
- **vLLM**: the same requests sent at once to a real vLLM OpenAI server serving the same model folder (completions
  with token-id prompts over loopback HTTP, ``min_tokens = max_tokens``, float32), launched by this script from
  ``$AGL_VLLM_VENV`` or ``.venv-vllm`` (``--no-vllm`` leaves the column out). Its server is its own processes: on a
  small machine it competes with this one for the same cores, as it would in training.

Throughput is requested tokens / wall seconds (best of ``--repeats``); the ratio backend / transformers is printed per
concurrency, in one run on one machine. Ends with one JSON line of all figures.

    .venv/bin/python benchmarks/backend_bench.py                 # a tiny Qwen2 built on the fly
    .venv/bin/python benchmarks/backend_bench.py --model examples/calc/checkpoint
    .venv/bin/python benchmarks/backend_bench.py --no-vllm        # LocalBackend and transformers only
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

import torch

from agentlightning_torch import LoadedModel, LocalBackend, SamplingParams, load_model
from agentlightning_torch.testing import make_tiny_chat_model


def _requests(count: int, vocab: int, prompt_range: tuple[int, int], output_range: tuple[int, int], seed: int):
    rng = random.Random(seed)
    return [
        ([rng.randrange(3, vocab) for _ in range(rng.randint(*prompt_range))], rng.randint(*output_range))
        for _ in range(count)
    ]


@torch.no_grad()
def transformers_tokens_per_s(loaded: LoadedModel, requests: list[tuple[list[int], int]]) -> float:
    """One left-padded ``generate`` call over every request (static batching)."""
    pad = int(loaded.tokenizer.pad_token_id or 0)  # pyright: ignore[reportArgumentType]
    width = max(len(p) for p, _ in requests)
    ids = torch.full((len(requests), width), pad, dtype=torch.long)
    mask = torch.zeros((len(requests), width), dtype=torch.long)
    for row, (prompt, _) in enumerate(requests):
        ids[row, width - len(prompt) :] = torch.tensor(prompt)
        mask[row, width - len(prompt) :] = 1
    longest = max(n for _, n in requests)
    started = time.perf_counter()
    loaded.model.generate(  # pyright: ignore[reportCallIssue]
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=longest,
        min_new_tokens=longest,
        do_sample=False,
        pad_token_id=pad,
    )
    return sum(n for _, n in requests) / (time.perf_counter() - started)


def backend_tokens_per_s(backend: LocalBackend, requests: list[tuple[list[int], int]]) -> float:
    """Every request submitted at once; wall time until the last one is answered."""
    started = time.perf_counter()
    futures = [
        backend.submit(prompt, SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)) for prompt, n in requests
    ]
    produced = sum(len(f.result().token_ids) for f in futures)
    elapsed = time.perf_counter() - started
    assert produced == sum(n for _, n in requests), "the backend produced a different number of tokens"
    return produced / elapsed


async def _vllm_round(url: str, requests: list[tuple[list[int], int]]) -> float:
    import aiohttp

    async def one(http: aiohttp.ClientSession, prompt: list[int], n: int) -> int:
        body = {"model": "bench", "prompt": prompt, "max_tokens": n, "min_tokens": n, "temperature": 0.0}
        body["ignore_eos"] = True
        async with http.post(f"{url}/v1/completions", json=body) as resp:
            data = await resp.json()
            if resp.status != 200:
                raise RuntimeError(f"vLLM answered {resp.status}: {data}")
            return int(data["usage"]["completion_tokens"])

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=3600)) as http:
        started = time.perf_counter()
        produced = sum(await asyncio.gather(*(one(http, p, n) for p, n in requests)))
        elapsed = time.perf_counter() - started
    assert produced == sum(n for _, n in requests), "vLLM produced a different number of tokens"
    return produced / elapsed


def vllm_tokens_per_s(url: str, requests: list[tuple[list[int], int]]) -> float:
    """Every request sent at once to vLLM; wall time until the last answer."""
    return asyncio.run(_vllm_round(url, requests))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, help="model folder (default: build a tiny Qwen2 chat model)")
    parser.add_argument("--hidden-size", type=int, default=128, help="width of the built model")
    parser.add_argument("--layers", type=int, default=4, help="layers of the built model")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 128])
    parser.add_argument("--prompt-tokens", type=int, nargs=2, default=[16, 64], metavar=("MIN", "MAX"))
    parser.add_argument("--output-tokens", type=int, nargs=2, default=[8, 64], metavar=("MIN", "MAX"))
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--no-vllm", action="store_true", help="leave out the vLLM column")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    scratch = tempfile.TemporaryDirectory()
    folder = args.model or make_tiny_chat_model(
        Path(scratch.name) / "model", hidden_size=args.hidden_size, num_layers=args.layers, num_heads=4
    )
    loaded = load_model(folder, device=args.device)
    server = None
    if not args.no_vllm:
        from agentlightning_torch import VLLMNotInstalledError, VLLMServer, VLLMStartError

        try:
            server = VLLMServer(folder, served_model_name="bench", kv_cache_gib=2, enforce_eager=True).start()
        except (VLLMNotInstalledError, VLLMStartError) as error:
            print(f"error: {str(error).splitlines()[0]} (or pass --no-vllm)", file=sys.stderr)
            return 2
    parameters = sum(p.numel() for p in loaded.model.parameters())
    backend = LocalBackend(
        loaded, max_batch_size=max(args.concurrency), batch_wait_ms=0.0, max_batch_wait_ms=0.0, num_threads=None
    ).start()
    vocab = int(loaded.model.config.vocab_size)
    rows: list[dict[str, float]] = []
    try:
        backend_tokens_per_s(backend, _requests(4, vocab, (8, 8), (4, 4), seed=0))  # warm up both paths
        transformers_tokens_per_s(loaded, _requests(4, vocab, (8, 8), (4, 4), seed=0))
        if server is not None:
            vllm_tokens_per_s(server.url, _requests(4, vocab, (8, 8), (4, 4), seed=0))
        for concurrency in args.concurrency:
            requests = _requests(concurrency, vocab, tuple(args.prompt_tokens), tuple(args.output_tokens), seed=1)
            plain = max(transformers_tokens_per_s(loaded, requests) for _ in range(args.repeats))
            ours = max(backend_tokens_per_s(backend, requests) for _ in range(args.repeats))
            row = {"concurrency": concurrency, "transformers_tok_s": plain, "backend_tok_s": ours}
            row["ratio"] = ours / plain
            if server is not None:
                row["vllm_tok_s"] = max(vllm_tokens_per_s(server.url, requests) for _ in range(args.repeats))
                row["backend_vs_vllm"] = ours / row["vllm_tok_s"]
            rows.append(row)
    finally:
        backend.stop()
        if server is not None:
            server.stop()
        scratch.cleanup()
    name = folder if args.model else "tiny Qwen2 (built)"
    print(f"model: {name}, {parameters / 1e6:.2f}M parameters, {args.threads} thread(s), {args.device}")
    print(f"prompts of {args.prompt_tokens} tokens, outputs of {args.output_tokens} tokens, best of {args.repeats}")
    vllm = " " + f"{'vLLM tok/s':>12}  {'LocalBackend/vLLM':>17}" if server is not None else ""
    print(f"{'concurrency':>11}  {'transformers tok/s':>18}  {'LocalBackend tok/s':>18}  {'ratio':>6}{vllm}")
    for row in rows:
        line = (
            f"{row['concurrency']:>11}  {row['transformers_tok_s']:>18.1f}  {row['backend_tok_s']:>18.1f}  "
            f"{row['ratio']:>6.2f}"
        )
        if "vllm_tok_s" in row:
            line += f" {row['vllm_tok_s']:>12.1f}  {row['backend_vs_vllm']:>17.2f}"
        print(line)
    summary: dict[str, float | int | str] = {"parameters": parameters, "threads": args.threads}
    for row in rows:
        c = int(row["concurrency"])
        summary[f"c{c}_transformers_tok_s"] = round(row["transformers_tok_s"], 1)
        summary[f"c{c}_backend_tok_s"] = round(row["backend_tok_s"], 1)
        summary[f"c{c}_ratio"] = round(row["ratio"], 3)
        if "vllm_tok_s" in row:
            summary[f"c{c}_vllm_tok_s"] = round(row["vllm_tok_s"], 1)
            summary[f"c{c}_backend_vs_vllm"] = round(row["backend_vs_vllm"], 3)
    summary["load_average"] = round(os.getloadavg()[0], 1)
    sys.stdout.write(json.dumps(summary) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
