"""Rollouts/s, generated tokens/s and seconds per phase of `RLLoop` + `VerlEngine` steps via verl's own vLLM rollout.

Runs ``packages/trainer-verl/tests/verl_vllm_loop.py`` (GRPO 2 steps + PPO with a critic 1 step + resume into step 2,
tiny Llama made on the fly, verl's vLLM replica colocated with the actor on a local Ray cluster) with the
interpreter of the verl + vLLM environment (``$AGL_VERL_VLLM_VENV`` or ``.venv-verl-vllm``, made by
``python3 scripts/dev.py verl-vllm``), then prints one JSON line from its per-step reports:

- ``rollouts_per_s`` / ``generated_tokens_per_s``: finished rollouts and response tokens over the steps' rollout
  phases (generation through the LLM proxy to vLLM, including the runners' overhead);
- ``phase_s``: per step, seconds of ``generate`` (enqueue → last rollout), ``update`` (verl's log-prob recompute,
  critic, actor) and ``sync`` (verl's ``CheckpointEngineManager.update_weights`` into vLLM);
- ``startup_s``: Ray, the worker group and vLLM's start.

    python benchmarks/verl_vllm_bench.py               # CPU (vLLM's CPU build)
    python benchmarks/verl_vllm_bench.py --device cuda # one GPU (vllm), as scripts/gpu_smoke.sh does
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "packages" / "trainer-verl" / "tests" / "verl_vllm_loop.py"


def summarize(result: dict[str, Any], device: str) -> dict[str, Any]:
    """The benchmark's JSON line from `verl_vllm_loop.py`'s ``RESULT``."""
    phases = [result[name] for name in ("grpo", "ppo_first", "ppo_resumed") if name in result]
    steps = [m for phase in phases for m in phase["history"]]
    if not steps:
        raise ValueError("the run reported no training step")
    generate_s = sum(m["time_rollouts"] for m in steps)
    return {
        "device": device,
        "steps": len(steps),
        "rollouts_per_s": round(sum(m["finished"] for m in steps) / generate_s, 3),
        "generated_tokens_per_s": round(sum(m["batch/response_tokens"] for m in steps) / generate_s, 2),
        "phase_s": [
            {
                "generate": round(m["time_rollouts"], 3),
                "update": round(m["time_update"], 3),
                "sync": round(m["time_sync"], 3),
            }
            for m in steps
        ],
        "startup_s": {k: round(v, 1) for k, v in result["timings"].items()},
        "vllm_actor_logprob_gap_max": max(m["rollout/logprob_diff_max"] for m in steps),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--python", default=None, help="interpreter with verl + vLLM (default: the verl-vllm venv)")
    args = parser.parse_args(argv)
    venv = Path(os.environ.get("AGL_VERL_VLLM_VENV") or ROOT / ".venv-verl-vllm")
    python = args.python or (str(venv / "bin" / "python") if args.device == "cpu" else sys.executable)
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "RAY_USAGE_STATS_ENABLED": "0"}
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in sorted((ROOT / "packages").glob("*/src")))
    with tempfile.TemporaryDirectory(prefix="agl-verl-vllm-bench-") as workdir:
        proc = subprocess.run(
            [python, str(SCRIPT), "--device", args.device, "--workdir", workdir, "--phases", "grpo,ppo"],
            capture_output=True,
            text=True,
            env=env,
        )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode or not lines:
        print(proc.stdout[-3000:], proc.stderr[-6000:], sep="\n", file=sys.stderr)
        print(f"error: the run failed (rc={proc.returncode})", file=sys.stderr)
        return 1
    print(json.dumps(summarize(json.loads(lines[-1][len("RESULT ") :]), args.device)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
