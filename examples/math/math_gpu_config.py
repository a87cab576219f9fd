"""GPU recipe for the math example: GRPO with verl on Qwen2.5-1.5B-Instruct, one GPU (not run here: no GPU).

The agent is unchanged (``math_agent.py``); only the model behind the proxy changes. Serve the store and start runners
first (``agl store serve``, ``agl runner --app-dir examples/math --agent math_agent:math_agent --instrument autogen
--store-url ...``), then hand ``CONFIG`` and ``LOOP`` to ``agentlightning_verl.VerlTrainer`` (see
``packages/trainer-verl/examples/grpo_1gpu.py`` for the driver script; pass ``split_problems`` tasks). The serving
engine must turn the model's hermes ``<tool_call>`` blocks into OpenAI ``tool_calls``: the config passes vLLM
``--enable-auto-tool-choice --tool-call-parser hermes`` (vLLM's own parser) through verl's rollout engine arguments.
"""

from __future__ import annotations

from agentlightning_verl import VerlTrainerConfig

__all__ = ["CONFIG", "LOOP", "VLLM_TOOL_ARGS"]

VLLM_TOOL_ARGS = {"enable_auto_tool_choice": True, "tool_call_parser": "hermes"}
"""vLLM serve arguments verl passes on (``rollout.engine_kwargs.vllm``): Qwen's hermes tool calls."""

CONFIG = VerlTrainerConfig(
    model_path="Qwen/Qwen2.5-1.5B-Instruct",  # or Qwen/Qwen2.5-3B-Instruct (then micro_batch_size_per_gpu=4)
    algorithm="grpo",
    n_rollouts_per_task=8,
    tasks_per_step=32,  # 256 episodes, up to ~512 model calls per step
    total_steps=150,
    lr=1e-6,
    ppo_mini_batch_size=32,
    micro_batch_size_per_gpu=8,
    max_prompt_length=1024,  # Qwen's own template lists the tool's JSON schema: ~350 prompt tokens
    max_response_length=256,  # a tool call or a short final answer
    temperature=1.0,
    n_gpus_per_node=1,
    nnodes=1,
    rollout_tensor_parallel_size=1,
    gpu_memory_utilization=0.5,  # vLLM shares the GPU with the FSDP trainer (verl sleeps it during updates)
    # the agent declares its tool with tool_choice "auto", which vLLM refuses without a tool-call parser
    overrides={"actor_rollout_ref.rollout.engine_kwargs.vllm": VLLM_TOOL_ARGS},
)
"""verl settings for one 80 GB GPU (A100/H100)."""

LOOP = CONFIG.loop_config(output_dir="runs/math-verl", checkpoint_every=25)
"""The RL loop's settings (metrics, checkpoints, proxy) for the same run."""
