"""The RAG agent on a GPU: GRPO with verl on Qwen2.5-1.5B-Instruct (needs ``agentlightning-verl[gpu]``; not run here).

On the GPU machine, three processes (see ``examples/rag/README.md``)::

    export AGL_STORE_TOKEN=$(python3 -c "import secrets; print(secrets.token_urlsafe(32))")
    agl store serve --db runs/rag-verl/store.db --host 127.0.0.1 --port 4747
    agl runner --app-dir examples/rag --agent rag_agent:rag_agent --instrument openai_agents \
        --store-url http://127.0.0.1:4747 --workers 128
    python examples/rag/verl_gpu.py --store http://127.0.0.1:4747 --proxy-token "$AGL_PROXY_TOKEN"

The agent is the same ``rag_agent.rag_agent`` as on the CPU (same tool, same instructions, same F1 reward); only
the model behind the LLM proxy changes: vLLM serves Qwen2.5 with its own chat template and hermes tool calls.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from pathlib import Path
from typing import Any

from agentlightning import ProxySettings
from agentlightning_verl import VerlTrainer, VerlTrainerConfig

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from rag_task import read_tasks  # noqa: E402

CONFIG = VerlTrainerConfig(
    model_path="Qwen/Qwen2.5-1.5B-Instruct",
    algorithm="grpo",
    n_rollouts_per_task=8,
    tasks_per_step=32,  # 256 episodes of ~3 model calls per step
    ppo_mini_batch_size=16,
    micro_batch_size_per_gpu=8,
    lr=1e-6,
    max_prompt_length=2048,  # instructions + tool schema + two searches of two short documents: < 600 tokens
    max_response_length=256,
    temperature=1.0,
    n_gpus_per_node=1,
    nnodes=1,
    rollout_tensor_parallel_size=1,
    gpu_memory_utilization=0.5,  # vLLM shares the GPU with the FSDP trainer (verl sleeps it during updates)
    lora_rank=0,
    total_steps=100,
    experiment_name="rag-qwen2.5-1.5b-grpo",
)
"""GRPO on one 80 GB GPU; trajectories of one agent are merged into one sample per episode."""


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", required=True, help="URL of `agl store serve`")
    parser.add_argument("--store-token", default=os.environ.get("AGL_STORE_TOKEN"), help="($AGL_STORE_TOKEN)")
    parser.add_argument("--proxy-token", required=True, help="bearer token agents send to the LLM proxy (16+ chars)")
    parser.add_argument("--data", type=Path, default=HERE / "data", help="folder with train.jsonl (make_data.py)")
    args = parser.parse_args()
    from agentlightning.store import StoreClient

    # StoreClient serves the LightningStore API; pyright reads its retry_policy property as a protocol mismatch
    store: Any = StoreClient(args.store, token=args.store_token)
    tasks = [task.to_dict() for task in read_tasks(args.data / "train.jsonl")]
    loop = CONFIG.loop_config(
        output_dir="runs/rag-verl",
        checkpoint_every=20,
        transition_mode="trajectory",
        proxy=ProxySettings(host="127.0.0.1", port=8765, token=args.proxy_token),
    )
    trainer = VerlTrainer(CONFIG, loop=loop)
    try:
        await trainer.run(store, tasks)
    finally:
        await trainer.stop()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    asyncio.run(main())
