"""Agent Lightning trainer for one machine: plain PyTorch PPO/GRPO on any Hugging Face chat model, a local backend.

Every public name is importable from here; the package is four parts, each its own subpackage:

- `agentlightning_torch.models`: loading any Hugging Face causal LM with a chat template (`load_model`), chat templates
  and tool-call parsers (`HFChatTemplate`, `get_tool_parser`), warm starts of small chat models made from scratch
  (`train_chat_tokenizer`, `build_chat_model`, `supervised_finetune`), LoRA (`apply_lora`), checkpoints
  (`save_checkpoint`), and real models fetched without a hub (`smollm2`, `import_gguf`).
- `agentlightning_torch.serving`: `LocalBackend` + `serve_backend` (an OpenAI-compatible server with vLLM's token-id
  wire format and continuous batching), and the `Serving` contract the engine delegates to (`make_serving` picks
  `BackendServing`, `BackendPoliciesServing`, `VLLMWeightsServing` or `VLLMLoRAServing`).
- `agentlightning_torch.vllm`: a real vLLM server for the policy (`VLLMServer`), weight and LoRA syncs verified by
  log-probs, and the two servings through it.
- `agentlightning_torch.training`: `PPOConfig` + `ppo_update`, `TorchEngine` (an `agentlightning.Engine`) and
  `TorchTrainer` (the engine and its `agentlightning.RLLoop` from one `TorchTrainerConfig`), several policies in one
  run (`LoRAPolicies`, `FullPolicies`, `TrainedPolicies`).
- `agentlightning_torch.runkit`: what ``agl train`` and the examples share to run a training (stores, runners, Ray).

Words: an *adapter* is a framework adapter (``agentlightning-langchain``...); LoRA weights are called *LoRA*
(`LoRAPolicies`, `load_lora_weights`, `LocalBackend.load_lora`). Deprecated names (each warns; removed in 0.3.0):
``VLLMServing`` (`VLLMWeightsServing`), ``PolicyAdapters`` (`LoRAPolicies`), ``load_adapter_weights``
(`load_lora_weights`), ``VLLMAdapterError`` (`VLLMLoRAError`), ``load_vllm_adapter`` (`load_vllm_lora`).
"""

import warnings
from typing import Any

from agentlightning_torch.models import (
    CHAT_SPECIAL_TOKENS,
    CHAT_TOOL_TOKENS,
    HERMES_CHAT_TEMPLATE,
    ChatTemplate,
    HFChatTemplate,
    LoadedModel,
    LoraSettings,
    MissingChatTemplateError,
    ParsedResponse,
    SFTConfig,
    SFTExample,
    SFTResult,
    TemplateError,
    ToolParser,
    apply_lora,
    build_chat_model,
    chatml_template,
    count_parameters,
    eos_token_ids,
    fit_examples,
    get_tool_parser,
    guess_tool_parser,
    is_lora,
    load_lora_weights,
    load_model,
    load_trainer_state,
    make_tool_call,
    merged_model,
    register_tool_parser,
    save_checkpoint,
    split_reasoning,
    supervised_finetune,
    tokenize_conversation,
    tool_parser_names,
    train_chat_tokenizer,
)
from agentlightning_torch.serving import (
    BackendPoliciesServing,
    BackendServer,
    BackendServing,
    BackendStats,
    GenerationResult,
    LocalBackend,
    OpenAIEndpoint,
    RequestCancelled,
    SamplingParams,
    Serving,
    create_app,
    generate_batch,
    make_serving,
    merged_state_dict,
    serve_backend,
)
from agentlightning_torch.training import (
    FullPolicies,
    IterationReport,
    LoRAPolicies,
    PolicyProgress,
    PolicySettings,
    PPOConfig,
    TorchEngine,
    TorchTrainer,
    TorchTrainerConfig,
    TrainedPolicies,
    make_optimizer,
    plan_micro_batches,
    policy_metric,
    ppo_update,
    prepare_policy,
    response_logprobs,
)
from agentlightning_torch.vllm import (
    VLLM_LORA_ARGS,
    VLLM_LORA_ENV,
    VLLMClient,
    VLLMError,
    VLLMLoRAError,
    VLLMLoRAServing,
    VLLMNotInstalledError,
    VLLMServer,
    VLLMSettings,
    VLLMStartError,
    VLLMWeightsServing,
    VLLMWeightSync,
    WeightSyncMismatch,
    find_vllm_python,
    load_vllm_lora,
)

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
    "LoRAPolicies",
    "LoadedModel",
    "LocalBackend",
    "LoraSettings",
    "MissingChatTemplateError",
    "OpenAIEndpoint",
    "PPOConfig",
    "ParsedResponse",
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
    "VLLMClient",
    "VLLMError",
    "VLLMLoRAError",
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
    "load_lora_weights",
    "load_model",
    "load_trainer_state",
    "load_vllm_lora",
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


_DEPRECATED: dict[str, tuple[str, str]] = {
    "VLLMServing": (
        "VLLMWeightsServing",
        "agentlightning_torch.VLLMServing is deprecated: use VLLMWeightsServing (one policy on vLLM; several LoRA "
        "policies: VLLMLoRAServing), whose start/sync take only the version",
    ),
    "PolicyAdapters": (
        "LoRAPolicies",
        "agentlightning_torch.PolicyAdapters is deprecated: use LoRAPolicies (the same class)",
    ),
    "load_adapter_weights": (
        "load_lora_weights",
        "agentlightning_torch.load_adapter_weights is deprecated: use load_lora_weights (the same function)",
    ),
    "VLLMAdapterError": (
        "VLLMLoRAError",
        "agentlightning_torch.VLLMAdapterError is deprecated: use VLLMLoRAError (the same exception)",
    ),
    "load_vllm_adapter": (
        "load_vllm_lora",
        "agentlightning_torch.load_vllm_adapter is deprecated: use load_vllm_lora (the same function)",
    ),
}
"""Old name -> (new name, its warning before "it is removed in 0.3.0"): renamed so that "adapter" means only a
framework adapter."""


def __getattr__(name: str) -> Any:
    """Deprecated names (`_DEPRECATED`), removed in 0.3.0: each warns and returns what replaced it."""
    if name in _DEPRECATED:
        new, message = _DEPRECATED[name]
        warnings.warn(f"{message}; it is removed in 0.3.0", DeprecationWarning, stacklevel=2)
        return globals()[new]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
