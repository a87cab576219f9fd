"""GPU recipe for the calculator example: GRPO with verl on SmolLM2-1.7B-Instruct, one GPU (not run here: no GPU).

The agent is unchanged (``calc_agent.py``, with the same ``prompts/smollm2.json``: SmolLM2-1.7B-Instruct has the same
tokenizer and ChatML template, with no tool section, as the 135M model the CPU recipe trains). Serve the store and
start runners first::

    agl store serve --port 4747
    CALC_PROMPT_FILE=examples/calc/prompts/smollm2.json agl runner --app-dir examples/calc \\
        --agent calc_agent:calc_agent --instrument langchain --store-url http://127.0.0.1:4747

then run this file (it is its own driver, as ``packages/trainer-verl/examples/grpo_1gpu.py`` is)::

    python examples/calc/calc_gpu_config.py --store http://127.0.0.1:4747 --proxy-token <a long random token>

The model answers ``CALC(<expression>)`` to call the calculator, as the CPU recipe's does; verl's own vLLM servers
turn that into an OpenAI tool call with ``vllm_calc_parser.py``. verl starts vLLM inside a Ray actor without
importing ``--tool-parser-plugin`` (vLLM's ``serve`` command does that; verl 0.9.1 builds the app itself), so
`ray_init_kwargs` registers the parser in every Ray worker through Ray's ``worker_process_setup_hook``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from agentlightning import LoopConfig, ProxySettings
from agentlightning_verl import VerlTrainerConfig

__all__ = ["CONFIG", "LOOP", "LOOP_SETTINGS", "MODEL", "PLUGIN", "build", "ray_init_kwargs"]

HERE = Path(__file__).resolve().parent
MODEL = "HuggingFaceTB/SmolLM2-1.7B-Instruct"
"""Hugging Face id; a local folder works too (``--model-path``, e.g. one written by ``agl model import``)."""
PLUGIN = HERE / "vllm_calc_parser.py"
"""vLLM's ``calc`` tool-call parser: a whole response ``CALC(<expression>)`` calls ``calculator``."""

# vLLM serve arguments verl passes on (rollout.engine_kwargs.vllm -> `vllm serve` flags): the agent declares the
# `calculator` tool with tool_choice "auto", which vLLM refuses without a tool-call parser
_VLLM_TOOL_ARGS: dict[str, Any] = {
    "enable_auto_tool_choice": True,
    "tool_call_parser": "calc",
    "tool_parser_plugin": str(PLUGIN),
}


def build(model_path: str = MODEL) -> VerlTrainerConfig:
    """The verl settings for ``model_path`` (a hub id or a local folder of a SmolLM2-family model)."""
    return VerlTrainerConfig(
        model_path=model_path,
        algorithm="grpo",
        n_rollouts_per_task=8,
        tasks_per_step=32,  # 256 episodes, at most 512 model calls per step (the graph allows 2 calls an episode)
        total_steps=100,
        # Full weights, not LoRA: on a GPU the update is cheap (1.7B in bf16 with fp32 Adam state, ~25 GB, fits one
        # 80 GB GPU beside vLLM) and verl's full-weight sync is the path scripts/gpu_smoke.sh checks; the CPU recipe
        # uses LoRA because a CPU update of every weight is the slow part there. For LoRA: lora_rank=16,
        # lora_alpha=32 and lr ~2e-5 (verl's LoRA runs use 10-100x the full-weight lr).
        lora_rank=0,
        lr=1e-6,  # the full-weight lr of the math and SQL recipes (Qwen2.5-1.5B, Llama-3.2-3B)
        kl_loss_coef=0.05,  # KL to the starting model, as the CPU recipe (--kl-coef 0.05)
        ppo_mini_batch_size=32,  # one optimizer step per step
        micro_batch_size_per_gpu=16,  # sequences are short: ~200 prompt tokens (the prompt file) + <=32 new ones
        max_prompt_length=512,  # system prompt + 3 worked examples + question + one tool turn
        max_response_length=32,  # "CALC(37*48+12)" or "A:1788"; the loop publishes max_tokens=16 as the CPU recipe
        temperature=1.0,
        n_gpus_per_node=1,
        nnodes=1,
        rollout_tensor_parallel_size=1,
        gpu_memory_utilization=0.4,  # vLLM shares the GPU with the FSDP trainer (verl sleeps it during updates)
        rollout_timeout_s=600.0,
        experiment_name="calc-smollm2-1.7b",
        overrides={"actor_rollout_ref.rollout.engine_kwargs.vllm": _VLLM_TOOL_ARGS},
    )


CONFIG = build()
"""verl settings for one 80 GB GPU (A100/H100)."""

LOOP_SETTINGS: dict[str, Any] = {
    "output_dir": Path("runs/calc-verl"),
    "checkpoint_every": 25,
    "max_tokens": 16,  # as the CPU recipe: an answer or a call fits, a ramble is cut
    "eval_every": 10,
    "best_metric": "accuracy",  # rewards are 1 / 0 / -0.1 (malformed): the mean is not the accuracy
}
"""The loop's own settings (`VerlTrainerConfig.loop_config` adds the ones it owns)."""

LOOP: LoopConfig = CONFIG.loop_config(**LOOP_SETTINGS)
"""The RL loop's settings (metrics, checkpoints, held-out evaluations, proxy) for the same run."""


def register_calc_tool_parser() -> None:
    """Ray worker setup hook: register vLLM's ``calc`` tool parser in this process (where vLLM is installed).

    vLLM's ``serve`` command imports ``--tool-parser-plugin`` before it builds the app; verl's vLLM server (a Ray
    actor) builds the app itself and skips that, so the parser must already be registered in the actor's process.
    """
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return
    # as vLLM's own plugin import: the module must stay importable by name (vLLM looks a parser up by its module)
    spec = importlib.util.spec_from_file_location(PLUGIN.stem, PLUGIN)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load the calc tool parser from {PLUGIN}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[PLUGIN.stem] = module
    spec.loader.exec_module(module)  # its decorator registers "calc"


def ray_init_kwargs() -> dict[str, Any]:
    """``ray.init`` arguments that register the ``calc`` parser in every Ray worker (call ``ray.init`` first)."""
    import ray.cloudpickle

    # the hook travels by value: the workers cannot import this file (examples/calc is not on their path)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    return {"runtime_env": {"worker_process_setup_hook": register_calc_tool_parser}}


async def main(argv: list[str] | None = None) -> None:
    """Train SmolLM2-1.7B-Instruct on the calculator tasks with verl (runners and store started as above)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", required=True, help="URL of `agl store serve`")
    parser.add_argument("--store-token", default=os.environ.get("AGL_STORE_TOKEN"), help="($AGL_STORE_TOKEN)")
    parser.add_argument("--proxy-token", required=True, help="bearer token of the LLM proxy")
    parser.add_argument("--model-path", default=MODEL, help=f"hub id or local folder (default {MODEL})")
    parser.add_argument("--train-tasks", type=Path, default=HERE / "data" / "train.jsonl")
    parser.add_argument("--val-tasks", type=Path, default=HERE / "data" / "val.jsonl")
    parser.add_argument("--eval-size", type=int, default=256, help="held-out tasks for greedy accuracy")
    args = parser.parse_args(argv)

    import ray

    from agentlightning.store import StoreClient
    from agentlightning_verl import VerlTrainer

    config = build(args.model_path)
    loop = config.loop_config(**LOOP_SETTINGS, proxy=ProxySettings(host="127.0.0.1", token=args.proxy_token))
    train_tasks, val_tasks = _tasks(args.train_tasks), _tasks(args.val_tasks)[: args.eval_size]
    ray.init(**ray_init_kwargs())  # before VerlTrainer: it would start Ray without the hook
    trainer = VerlTrainer(config, loop=loop)
    try:
        await trainer.run(StoreClient(args.store, token=args.store_token), train_tasks, val_tasks)
    finally:
        await trainer.stop()


def _tasks(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    asyncio.run(main())
