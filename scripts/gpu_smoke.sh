#!/usr/bin/env bash
# GPU smoke check for a single-GPU machine with torch + transformers + verl installed; no Ray cluster, no vLLM,
# no network. Builds a tiny Llama locally, runs verl's actor update (TrainingWorker + FSDP2 + ppo_loss) on CUDA
# from a DataProto made by agentlightning_verl.to_data_proto, prints step time and tokens/s. Under 5 minutes.
#
#   bash scripts/gpu_smoke.sh            # uses .venv/bin/python when present, else python3
#   PYTHON=/path/to/python bash scripts/gpu_smoke.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-4}" TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1

"$PY" - <<'PY'
import torch
assert torch.cuda.is_available(), "no CUDA device visible to torch"
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, device {torch.cuda.get_device_name(0)}")
import verl, transformers
print(f"verl {verl.__version__}, transformers {transformers.__version__}")
PY

echo "== verl actor update on CUDA (tiny Llama: hidden 256, 4 layers; 16 samples, 128+256 tokens; 3 steps) =="
timeout 280 "$PY" packages/trainer-verl/tests/verl_actor_step.py --device cuda \
  --hidden 256 --layers 4 --groups 4 --per-group 4 --prompt-len 128 --response-len 256 --steps 3 \
  > /tmp/agl_verl_gpu_smoke.log 2>&1 || { tail -50 /tmp/agl_verl_gpu_smoke.log; exit 1; }

"$PY" - <<'PY'
import json
import sys

line = [x for x in open("/tmp/agl_verl_gpu_smoke.log") if x.startswith("RESULT ")][-1]
r = json.loads(line[len("RESULT "):])
m = r["metrics"]
print(f"samples {r['n_samples']}, tokens/step {r['tokens_per_step']}")
print("step times (s): " + ", ".join(f"{t:.3f}" for t in r["step_s"]) + " (the first includes warm-up)")
print(f"best step {min(r['step_s']):.3f} s -> {r['tokens_per_s']:.0f} tokens/s")
print(f"last pg_loss {m['actor/pg_loss']:.4f} (step 1 expected {r['expected_pg_loss']:.4f}), grad_norm {m['grad_norm']:.3f}")
print(f"max |verl logp - transformers logp| {r['max_abs_logprob_diff_vs_hf']:.2e}")
ok = r["objective_after"] > r["objective_before"] and r["max_abs_logprob_diff_vs_hf"] < 1e-3
print("verl GPU smoke:", "OK" if ok else "FAILED")
print(json.dumps({"verl_step_s": min(r["step_s"]), "verl_tokens_per_s": r["tokens_per_s"], "ok": ok}))
sys.exit(0 if ok else 1)
PY

# ---------------------------------------------------------------------------------------------------------------
# HOOK (lead): trainer-torch CUDA run goes here, e.g.
#   timeout 120 "$PY" -m agentlightning_torch.<smoke module> --device cuda
# ---------------------------------------------------------------------------------------------------------------
