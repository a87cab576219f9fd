"""The torch engine's run specification: the shared `agentlightning.cli.RunSpec` and the torch engine's own options.

`TorchSpec` is what ``agl train --engine torch`` hands its plug-in and what a training script's parser is built
from (`add_run_arguments`); `TORCH_CAPABILITIES` says that the torch engine honours every shared option.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from agentlightning.cli import EngineCapabilities, RunSpec

__all__ = ["TORCH_CAPABILITIES", "TorchSpec"]


class TorchSpec(RunSpec):
    """`agentlightning.cli.RunSpec` and the torch engine's own options (device, threads, LoRA, serving backend)."""

    device: str = Field("cpu", description="cpu, cuda or cuda:N")
    threads: int = Field(1, description="torch CPU threads (few is faster on small machines)")
    lora_rank: int | None = Field(None, description="train LoRA adapters of this rank (needs peft)")
    model_name: str = Field("policy", description="name the model is served under")
    tool_parser: str | None = Field(None, description="tool-call parser (hermes, llama3_json, ...)")
    backend: Literal["local", "vllm"] = Field(
        "local",
        description="inference server: the embedded backend or vLLM (launched for --model from $AGL_VLLM_VENV or "
        ".venv-vllm, or the one at --vllm-url; each weight sync is verified by log-probs)",
    )
    vllm_url: str | None = Field(None, description="--backend vllm: use this running vLLM server")
    tool_parser_plugin: Path | None = Field(
        None, description="--backend vllm: a vLLM tool-parser plugin file (--tool-parser)"
    )


_HONOURS = (
    "agent", "agent_command", "agent_timeout", "model", "tasks", "val_tasks", "minutes", "iterations", "eval_every",
    "runners", "runners_ray", "ray_address", "runner_processes", "runner_cpus", "ray_placement", "workers", "output",
    "app_dir", "tasks_per_iteration", "samples_per_task", "max_tokens", "rollout_timeout", "max_staleness", "lr",
    "kl_coef", "entropy_coef", "ppo_epochs", "policy", "default_policy", "policies", "policy_settings",
    "dashboard_port", "seed", "store", "store_servers", "serve_store", "store_url", "store_token", "proxy_host",
    "proxy_port", "advertise_url", "proxy_token", "heartbeat_timeout", "judge", "judge_model", "rubric", "judge_mode",
    "judge_weight", "judge_max_calls", "judge_max_tokens", "judge_answer_tokens",
    "judge_attempts", "judge_timeout", "judge_api_key", "quiet", "log_level",
)  # fmt: skip

TORCH_CAPABILITIES = EngineCapabilities(honours=frozenset(_HONOURS))
"""The torch engine honours every shared option today; one added to `RunSpec` later is refused until it is listed."""
