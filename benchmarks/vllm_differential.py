"""LocalBackend against real vLLM on one model folder, greedy: the same tokens, log-probs within a tolerance.

Serves the folder twice (the embedded `LocalBackend` and a vLLM server, both float32) and sends each the same
greedy chat requests: by default SmolLM2-135M-Instruct (``python3 scripts/dev.py smollm2`` fetches it) with the
calculator's prompt file and ``--prompts`` held-out questions, the second turn after a calculator result, and a few
open chat prompts. For every request it compares the answers step by step: the same token ids, and at each step the
chosen token's log-prob and the two best log-probs within ``--tolerance`` of vLLM's. Two float32 engines may order
two candidates differently when their log-probs are closer than ``--tie``; such a step counts as a near tie and the
comparison of that request ends there (the rest is another continuation). Any other difference is a mismatch.

Prints a table (one row per request) and ends with one JSON line of all figures; exits 1 on a mismatch.

    .venv/bin/python benchmarks/vllm_differential.py                       # SmolLM2, 32 calculator questions
    .venv/bin/python benchmarks/vllm_differential.py --model-dir DIR --prompts 8
    .venv/bin/python benchmarks/vllm_differential.py --vllm-url http://127.0.0.1:8000/v1 --served-name NAME
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
CALC = ROOT / "examples" / "calc"
OPEN_PROMPTS = (
    "What is the capital of France?",
    "Write one sentence about the sea.",
    "List three prime numbers.",
    "Explain in one sentence what a calculator does.",
)


@dataclass
class Comparison:
    """How one request's two greedy answers compare.

    Attributes:
        name: The request's label.
        steps: Tokens compared (up to the shorter answer, or to a near tie).
        same_tokens: Whether both answers have the same token ids throughout.
        tie_at: The step where the engines chose different tokens at a near tie (else None).
        max_logprob_diff: Largest difference of a chosen or top-2 log-prob over the compared steps.
        mismatch: What differs beyond the tolerances (else None).
    """

    name: str
    steps: int
    same_tokens: bool
    tie_at: int | None
    max_logprob_diff: float
    mismatch: str | None


def compare(name: str, reference: dict[str, Any], ours: dict[str, Any], tolerance: float, tie: float) -> Comparison:
    """Compare two answers ``{"ids": [...], "entries": [{"logprob", "top_logprobs": [...]}, ...]}`` step by step."""
    worst = 0.0
    for step, (want, got) in enumerate(zip(reference["ids"], ours["ids"], strict=False)):
        theirs, mine = reference["entries"][step], ours["entries"][step]
        best = [t["logprob"] for t in theirs["top_logprobs"][:2]]
        if want != got:
            gap = best[0] - best[1] if len(best) == 2 else float("inf")
            if gap < tie and abs(mine["logprob"] - best[1]) <= tolerance:
                return Comparison(name, step, False, step, worst, None)
            why = f"step {step}: token {got} vs vLLM's {want} (gap {gap:.2e})"
            return Comparison(name, step, False, None, worst, why)
        diffs = [abs(mine["logprob"] - theirs["logprob"])]
        pairs = zip(mine["top_logprobs"], theirs["top_logprobs"], strict=False)
        diffs += [abs(a["logprob"] - b["logprob"]) for a, b in pairs]
        worst = max(worst, *diffs)
        if max(diffs) > tolerance:
            return Comparison(name, step + 1, False, None, worst, f"step {step}: log-probs differ by {max(diffs):.2e}")
    if len(reference["ids"]) != len(ours["ids"]):
        steps = min(len(reference["ids"]), len(ours["ids"]))
        lengths = f"{len(ours['ids'])} tokens vs vLLM's {len(reference['ids'])}"
        return Comparison(name, steps, False, None, worst, lengths)
    return Comparison(name, len(reference["ids"]), True, None, worst, None)


def chat_answer(client: httpx.Client, base_url: str, body: dict[str, Any]) -> dict[str, Any]:
    """One greedy chat answer: prompt ids, token ids, per-step log-probs (with the two best) and text."""
    resp = client.post(f"{base_url}/chat/completions", json=body)
    if resp.status_code != 200:
        raise RuntimeError(f"{base_url} answered {resp.status_code}: {resp.text[:300]}")
    data = resp.json()
    choice = data["choices"][0]
    return {
        "prompt": data.get("prompt_token_ids"),
        "ids": choice["token_ids"],
        "entries": choice["logprobs"]["content"],
        "text": choice["message"].get("content"),
    }


def requests(prompt_file: Path | None, questions: Sequence[str], max_tokens: int, model: str) -> dict[str, Any]:
    """The chat requests by label: each question (prompt file first), its second turn, and open prompts."""
    opening: list[dict[str, Any]] = json.loads(prompt_file.read_text()) if prompt_file else []
    conversations: dict[str, list[dict[str, Any]]] = {}
    for index, question in enumerate(questions):
        conversations[f"q{index}"] = [*opening, {"role": "user", "content": question}]
    if questions:  # the turn after a calculator call, as the agent sends it (the call's turn has no text)
        expression = questions[0].removeprefix("Q:").removesuffix("=")
        call = {"id": "c1", "type": "function", "function": {"name": "calculator", "arguments": "{}"}}
        conversations["after-tool"] = [
            *conversations["q0"],
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": expression},
        ]
    for index, text in enumerate(OPEN_PROMPTS):
        conversations[f"open{index}"] = [{"role": "user", "content": text}]
    greedy = {"temperature": 0, "max_tokens": max_tokens, "logprobs": True, "top_logprobs": 2, "return_token_ids": True}
    return {name: {"model": model, "messages": messages, **greedy} for name, messages in conversations.items()}


def run_differential(
    local_url: str, vllm_url: str, bodies: dict[str, Any], tolerance: float, tie: float
) -> list[Comparison]:
    """Send every request to both servers; compare each pair (prompt ids must be equal)."""
    rows: list[Comparison] = []
    with httpx.Client(timeout=600) as client:
        for name, body in bodies.items():
            reference, ours = chat_answer(client, vllm_url, body), chat_answer(client, local_url, body)
            if reference["prompt"] is not None and ours["prompt"] != reference["prompt"]:
                rows.append(Comparison(name, 0, False, None, 0.0, "the rendered prompts differ"))
                continue
            rows.append(compare(name, reference, ours, tolerance, tie))
    return rows


def summarise(rows: Sequence[Comparison], tolerance: float, tie: float) -> dict[str, Any]:
    """The figures of a run, as the JSON line prints them."""
    diffs = [r.max_logprob_diff for r in rows]
    return {
        "requests": len(rows),
        "same_tokens": sum(r.same_tokens for r in rows),
        "near_ties": sum(r.tie_at is not None for r in rows),
        "mismatches": sum(r.mismatch is not None for r in rows),
        "steps_compared": sum(r.steps for r in rows),
        "max_logprob_diff": max(diffs, default=0.0),
        "median_max_logprob_diff": statistics.median(diffs) if diffs else 0.0,
        "tolerance": tolerance,
        "tie": tie,
    }


def _serve(args: argparse.Namespace, model_dir: Path) -> tuple[Any, Any]:
    from agentlightning_torch import LocalBackend, serve_backend
    from agentlightning_torch.testing import VLLMServer

    local = serve_backend(LocalBackend(model_dir, model_name=args.served_name, num_threads=args.threads))
    if args.vllm_url:
        return local, None
    started = time.perf_counter()
    server = VLLMServer(
        model_dir, served_model_name=args.served_name, max_model_len=2048, enforce_eager=True, threads=args.threads
    ).start()
    print(f"vLLM started in {time.perf_counter() - started:.0f} s (log: {server.log_path})", file=sys.stderr)
    return local, server


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", type=Path, default=None, help="default: the fetched SmolLM2 folder")
    parser.add_argument("--prompt-file", type=Path, default=CALC / "prompts" / "smollm2.json")
    parser.add_argument("--prompts", type=int, default=32, help="held-out calculator questions")
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--tolerance", type=float, default=1e-3, help="largest log-prob difference allowed")
    parser.add_argument("--tie", type=float, default=1e-3, help="a different token is a near tie below this gap")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--served-name", default="model")
    parser.add_argument("--vllm-url", default=None, help="a vLLM already serving --model-dir (its /v1 URL)")
    args = parser.parse_args(argv)
    from agentlightning_torch.models import models_dir

    model_dir = args.model_dir or models_dir() / "smollm2-135m-instruct"
    if not (model_dir / "config.json").is_file():
        parser.error(f"{model_dir} is not a model folder (for SmolLM2: python3 scripts/dev.py smollm2)")
    lines = (CALC / "data" / "val.jsonl").read_text().splitlines()[: args.prompts]
    questions = [json.loads(line)["question"] for line in lines]
    bodies = requests(args.prompt_file, questions, args.max_tokens, args.served_name)
    local, server = _serve(args, model_dir)
    try:
        rows = run_differential(local.base_url, args.vllm_url or server.base_url, bodies, args.tolerance, args.tie)
    finally:
        local.stop()
        if server is not None:
            server.stop()
    print(f"{'request':<12} {'steps':>5} {'same':>5} {'tie at':>6} {'max |dlogp|':>11}  mismatch")
    for row in rows:
        tie_at = "-" if row.tie_at is None else str(row.tie_at)
        print(f"{row.name:<12} {row.steps:>5} {row.same_tokens!s:>5} {tie_at:>6} {row.max_logprob_diff:>11.2e}  "
              f"{row.mismatch or ''}")  # fmt: skip
    figures = summarise(rows, args.tolerance, args.tie)
    print(json.dumps({"model": str(model_dir.name), **figures, "rows": [asdict(r) for r in rows]}))
    return 1 if figures["mismatches"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
