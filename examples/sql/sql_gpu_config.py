"""GPU recipe for the SQL example: GRPO with verl on Llama-3.2-3B-Instruct, one GPU (not run here: no GPU).

The agents are unchanged (``sql_agent.py``); only the model behind the proxy changes, and the agent filter is the same:
only the ``writer`` and ``rewriter`` calls are trained, the ``checker`` runs on the same model untrained. Serve the
store and start runners first (``agl store serve``, ``agl runner --app-dir examples/sql --agent sql_agent:sql_agent
--instrument langchain --store-url ...``), then hand ``CONFIG`` and ``LOOP`` to ``agentlightning_verl.VerlTrainer``
(see ``packages/trainer-verl/examples/grpo_1gpu.py`` for the driver script) with the tasks of ``data/train.jsonl`` or
Spider's (``sql_spider.load_spider``). The agents call no tools, so any chat model works as it is served.
"""

from __future__ import annotations

import sys
from pathlib import Path

from agentlightning_verl import VerlTrainerConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sql_agent import TRAINED_AGENTS

__all__ = ["CONFIG", "LOOP"]

CONFIG = VerlTrainerConfig(
    model_path="meta-llama/Llama-3.2-3B-Instruct",  # or Qwen/Qwen2.5-1.5B-Instruct (micro_batch_size_per_gpu=8)
    algorithm="grpo",
    n_rollouts_per_task=8,
    tasks_per_step=32,  # 256 episodes, 512 to 1280 model calls per step (writer, checker, up to 2 rewrites)
    total_steps=200,
    lr=1e-6,
    ppo_mini_batch_size=32,
    micro_batch_size_per_gpu=4,
    max_prompt_length=2048,  # a Spider schema line plus the question, query and result the rewriter reads
    max_response_length=256,  # one SQL query
    temperature=1.0,
    n_gpus_per_node=1,
    nnodes=1,
    rollout_tensor_parallel_size=1,
    gpu_memory_utilization=0.5,  # vLLM shares the GPU with the FSDP trainer (verl sleeps it during updates)
)
"""verl settings for one 80 GB GPU (A100/H100)."""

LOOP = CONFIG.loop_config(output_dir="runs/sql-verl", checkpoint_every=25, agent_filter=TRAINED_AGENTS)
"""The RL loop's settings (metrics, checkpoints, proxy, the writer + rewriter filter) for the same run."""
