"""Agent Lightning trainer for one machine: plain PyTorch PPO/GRPO on any Hugging Face chat model, a local backend.

The pieces the torch trainer is built from (the CPU quickstart's tiny calculator model is an ordinary Hugging Face
folder in ``examples/calc``, served and trained through the same path as any other model):

- `load_model`: any Hugging Face causal LM with a chat template (folder or hub id) through the Auto classes.
- `HFChatTemplate`: the tokenizer's own chat template for prompts, a named tool-call parser (`get_tool_parser`:
  ``hermes``, ``llama3_json``, ``calc``) for responses; `HERMES_CHAT_TEMPLATE` for folders without a template
  (`chatml_template`: the same turns with a system turn of your own).
- Warm starts of small chat models made from scratch: `train_chat_tokenizer` (byte-level BPE + hermes chat template),
  `build_chat_model` (random Qwen2/Llama), `supervised_finetune` (OpenAI-format conversations rendered as the
  backend renders them, loss on assistant tokens only), `save_checkpoint` (a plain ``save_pretrained`` folder).
- `LocalBackend` + `serve_backend`: an OpenAI-compatible server with vLLM's token-id wire format and continuous
  batching of concurrent requests.
- `PPOConfig` + `ppo_update`: the clipped policy-gradient step on an `agentlightning.TrainingBatch`.
- `TorchEngine`: the policy, its optimizer and its server as an `agentlightning.Engine`; `TorchTrainer` builds it
  and the `agentlightning.RLLoop` that trains it from one `TorchTrainerConfig`. The engine serves through one
  `Serving` (`make_serving` picks it): `BackendServing`, `BackendPoliciesServing`, `VLLMWeightsServing` or
  `VLLMLoRAServing`. ``VLLMServing`` is the deprecated old name of `VLLMWeightsServing` (removed in 0.3.0).
"""

import warnings
from typing import Any

from agentlightning_torch._backend import BackendStats, LocalBackend, RequestCancelled, merged_state_dict
from agentlightning_torch._chat import ChatTemplate, HFChatTemplate, ParsedResponse, TemplateError
from agentlightning_torch._chat_model import (
    CHAT_SPECIAL_TOKENS,
    CHAT_TOOL_TOKENS,
    build_chat_model,
    train_chat_tokenizer,
)
from agentlightning_torch._chat_templates import HERMES_CHAT_TEMPLATE, chatml_template
from agentlightning_torch._checkpoint import load_adapter_weights, load_trainer_state, merged_model, save_checkpoint
from agentlightning_torch._endpoint import OpenAIEndpoint
from agentlightning_torch._generate import GenerationResult, SamplingParams, generate_batch
from agentlightning_torch._loading import (
    LoadedModel,
    MissingChatTemplateError,
    count_parameters,
    eos_token_ids,
    load_model,
)
from agentlightning_torch._local_serving import BackendPoliciesServing, BackendServing
from agentlightning_torch._lora import LoraSettings, apply_lora, is_lora
from agentlightning_torch._policy_adapters import PolicyAdapters, policy_metric
from agentlightning_torch._policy_full import FullPolicies
from agentlightning_torch._policy_progress import PolicyProgress
from agentlightning_torch._policy_set import TrainedPolicies
from agentlightning_torch._policy_settings import PolicySettings
from agentlightning_torch._ppo import (
    PPOConfig,
    make_optimizer,
    plan_micro_batches,
    ppo_update,
    prepare_policy,
    response_logprobs,
)
from agentlightning_torch._server import BackendServer, create_app, serve_backend
from agentlightning_torch._serving import Serving, make_serving
from agentlightning_torch._sft import (
    SFTConfig,
    SFTExample,
    SFTResult,
    fit_examples,
    supervised_finetune,
    tokenize_conversation,
)
from agentlightning_torch._tool_parsers import (
    ToolParser,
    get_tool_parser,
    guess_tool_parser,
    make_tool_call,
    register_tool_parser,
    split_reasoning,
    tool_parser_names,
)
from agentlightning_torch._trainer import IterationReport, TorchEngine, TorchTrainer
from agentlightning_torch._trainer_config import TorchTrainerConfig
from agentlightning_torch._vllm_client import VLLMClient, VLLMError
from agentlightning_torch._vllm_lora import VLLM_LORA_ARGS, VLLM_LORA_ENV, VLLMAdapterError, load_vllm_adapter
from agentlightning_torch._vllm_server import VLLMNotInstalledError, VLLMServer, VLLMStartError, find_vllm_python
from agentlightning_torch._vllm_serving import VLLMLoRAServing, VLLMSettings, VLLMWeightsServing
from agentlightning_torch._vllm_sync import VLLMWeightSync, WeightSyncMismatch

__version__ = "0.1.0"

__all__ = [
    "CHAT_SPECIAL_TOKENS",
    "CHAT_TOOL_TOKENS",
    "HERMES_CHAT_TEMPLATE",
    "VLLM_LORA_ARGS",
    "VLLM_LORA_ENV",
    "BackendPoliciesServing",
    "BackendServer",
    "BackendServing",
    "BackendStats",
    "ChatTemplate",
    "FullPolicies",
    "GenerationResult",
    "HFChatTemplate",
    "IterationReport",
    "LoadedModel",
    "LocalBackend",
    "LoraSettings",
    "MissingChatTemplateError",
    "OpenAIEndpoint",
    "PPOConfig",
    "ParsedResponse",
    "PolicyAdapters",
    "PolicyProgress",
    "PolicySettings",
    "RequestCancelled",
    "SFTConfig",
    "SFTExample",
    "SFTResult",
    "SamplingParams",
    "Serving",
    "TemplateError",
    "ToolParser",
    "TorchEngine",
    "TorchTrainer",
    "TorchTrainerConfig",
    "TrainedPolicies",
    "VLLMAdapterError",
    "VLLMClient",
    "VLLMError",
    "VLLMLoRAServing",
    "VLLMNotInstalledError",
    "VLLMServer",
    "VLLMSettings",
    "VLLMStartError",
    "VLLMWeightSync",
    "VLLMWeightsServing",
    "WeightSyncMismatch",
    "__version__",
    "apply_lora",
    "build_chat_model",
    "chatml_template",
    "count_parameters",
    "create_app",
    "eos_token_ids",
    "find_vllm_python",
    "fit_examples",
    "generate_batch",
    "get_tool_parser",
    "guess_tool_parser",
    "is_lora",
    "load_adapter_weights",
    "load_model",
    "load_trainer_state",
    "load_vllm_adapter",
    "make_optimizer",
    "make_serving",
    "make_tool_call",
    "merged_model",
    "merged_state_dict",
    "plan_micro_batches",
    "policy_metric",
    "ppo_update",
    "prepare_policy",
    "register_tool_parser",
    "response_logprobs",
    "save_checkpoint",
    "serve_backend",
    "split_reasoning",
    "supervised_finetune",
    "tokenize_conversation",
    "tool_parser_names",
    "train_chat_tokenizer",
]


def __getattr__(name: str) -> Any:
    """Deprecated names, removed in 0.3.0 (each warns): ``VLLMServing`` (`VLLMWeightsServing`)."""
    if name == "VLLMServing":
        warnings.warn(
            "agentlightning_torch.VLLMServing is deprecated: use VLLMWeightsServing (one policy on vLLM; several LoRA "
            "policies: VLLMLoRAServing), whose start/sync take only the version; it is removed in 0.3.0",
            DeprecationWarning,
            stacklevel=2,
        )
        return VLLMWeightsServing
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
