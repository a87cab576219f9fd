"""Agent Lightning trainer for one machine: plain PyTorch PPO/GRPO, a local batched inference backend, a tiny model.

The pieces the torch trainer is built from:

- `CharTokenizer`, `build_tiny_model`, `save_tiny`/`load_tiny`: the CPU quickstart's ~1M-parameter Llama.
- `CalcChatTemplate`: renders chat messages to token ids (prefix-extending across tool rounds) and parses
  ``CALC(<expr>)`` into OpenAI tool calls.
- `LocalBackend` + `serve_backend`: an OpenAI-compatible server with vLLM's token-id wire format and dynamic
  batching of concurrent requests.
- `PPOConfig` + `ppo_update`: the clipped policy-gradient step on an `agentlightning.TrainingBatch`.
"""

from agentlightning_torch._backend import BackendStats, LocalBackend, merged_state_dict
from agentlightning_torch._checkpoint import load_adapter_weights, load_trainer_state, merged_model, save_checkpoint
from agentlightning_torch._generate import GenerationResult, SamplingParams, generate_batch
from agentlightning_torch._model import build_tiny_model, count_parameters, load_tiny, save_tiny
from agentlightning_torch._ppo import (
    LoraSettings,
    PPOConfig,
    apply_lora,
    is_lora,
    make_optimizer,
    plan_micro_batches,
    ppo_update,
    prepare_policy,
    response_logprobs,
)
from agentlightning_torch._server import BackendServer, create_app, serve_backend
from agentlightning_torch._template import CalcChatTemplate, ChatTemplate, ParsedResponse, TemplateError
from agentlightning_torch._tokenizer import CALC_ALPHABET, CharTokenizer
from agentlightning_torch._trainer import IterationReport, TorchTrainer
from agentlightning_torch._trainer_config import TorchTrainerConfig

__version__ = "0.1.0"

__all__ = [
    "CALC_ALPHABET",
    "BackendServer",
    "BackendStats",
    "CalcChatTemplate",
    "CharTokenizer",
    "ChatTemplate",
    "GenerationResult",
    "IterationReport",
    "LocalBackend",
    "LoraSettings",
    "PPOConfig",
    "ParsedResponse",
    "SamplingParams",
    "TemplateError",
    "TorchTrainer",
    "TorchTrainerConfig",
    "__version__",
    "apply_lora",
    "build_tiny_model",
    "count_parameters",
    "create_app",
    "generate_batch",
    "is_lora",
    "load_adapter_weights",
    "load_tiny",
    "load_trainer_state",
    "make_optimizer",
    "merged_model",
    "merged_state_dict",
    "plan_micro_batches",
    "ppo_update",
    "prepare_policy",
    "response_logprobs",
    "save_checkpoint",
    "save_tiny",
    "serve_backend",
]
