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
from agentlightning_torch._calc import (
    CALCULATOR_TOOL,
    MALFORMED_REWARD,
    CalcTask,
    evaluate_expression,
    make_calc_tasks,
    parse_answer,
    score_answer,
)
from agentlightning_torch._episodes import CalcEpisode, run_calc_episodes, summarize_episodes
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
from agentlightning_torch._warmstart import WarmStartConfig, warm_start

__version__ = "0.1.0"

__all__ = [
    "CALCULATOR_TOOL",
    "CALC_ALPHABET",
    "MALFORMED_REWARD",
    "BackendServer",
    "BackendStats",
    "CalcChatTemplate",
    "CalcEpisode",
    "CalcTask",
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
    "WarmStartConfig",
    "__version__",
    "apply_lora",
    "build_tiny_model",
    "count_parameters",
    "create_app",
    "evaluate_expression",
    "generate_batch",
    "is_lora",
    "load_tiny",
    "make_calc_tasks",
    "make_optimizer",
    "merged_state_dict",
    "parse_answer",
    "plan_micro_batches",
    "ppo_update",
    "prepare_policy",
    "response_logprobs",
    "run_calc_episodes",
    "save_tiny",
    "score_answer",
    "serve_backend",
    "summarize_episodes",
    "warm_start",
]
