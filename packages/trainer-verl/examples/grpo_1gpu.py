"""GRPO on ONE GPU with verl: a 0.5B model, vLLM colocated with the FSDP trainer (needs `agentlightning-verl[gpu]`).

Start a store and runners first (their agents call the LLM proxy the run publishes in the store; the store's token
in ``$AGL_STORE_TOKEN``), then:

    python packages/trainer-verl/examples/grpo_1gpu.py --store http://127.0.0.1:4747 --tasks tasks.jsonl \
        --proxy-token <a long random token>
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os

from agentlightning import ProxySettings
from agentlightning_verl import VerlTrainer, VerlTrainerConfig

CONFIG = VerlTrainerConfig(
    model_path="Qwen/Qwen2.5-0.5B-Instruct",
    algorithm="grpo",
    n_rollouts_per_task=8,
    tasks_per_step=16,
    ppo_mini_batch_size=8,
    micro_batch_size_per_gpu=8,
    lr=1e-6,
    max_prompt_length=2048,
    max_response_length=1024,
    n_gpus_per_node=1,
    nnodes=1,
    rollout_tensor_parallel_size=1,
    gpu_memory_utilization=0.4,  # vLLM shares the GPU with the trainer (verl sleeps it during updates)
    lora_rank=0,
    total_steps=200,
)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--store", required=True, help="URL of `agl store serve`")
    parser.add_argument("--store-token", default=os.environ.get("AGL_STORE_TOKEN"), help="($AGL_STORE_TOKEN)")
    parser.add_argument("--tasks", required=True, help="JSON lines, one task per line")
    parser.add_argument("--proxy-token", required=True, help="bearer token of the LLM proxy's admin routes")
    args = parser.parse_args()
    from agentlightning.store import StoreClient

    store = StoreClient(args.store, token=args.store_token)
    with open(args.tasks, encoding="utf-8") as handle:
        tasks = [json.loads(line) for line in handle if line.strip()]
    # The loop starts the LLM proxy in front of verl's vLLM servers and publishes its URL to the runners.
    loop = CONFIG.loop_config(
        output_dir="runs/verl-grpo",
        checkpoint_every=20,
        proxy=ProxySettings(host="0.0.0.0", port=8765, token=args.proxy_token),
    )
    trainer = VerlTrainer(CONFIG, loop=loop)
    try:
        await trainer.run(store, tasks)
    finally:
        await trainer.stop()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    asyncio.run(main())
