"""Serving the torch trainer's policy through a real vLLM server: the server process, its client, weight and LoRA
syncs verified by log-probs, and the two implementations of core's serving contract (`agentlightning.loop.Serving`)
on vLLM.

- `VLLMServer` (vLLM's OpenAI server as a subprocess; `find_vllm_python` finds vLLM's own venv) and `VLLMClient`.
- `VLLMWeightSync`: full weights pushed after each update, checked against the trainer's own log-probs.
- `VLLMWeightsServing` (one policy, full weights) and `VLLMLoRAServing` (one LoRA adapter per policy, vLLM's
  multi-LoRA; `load_vllm_lora` loads one, `vllm_lora_args` are the flags vLLM needs), configured by `VLLMSettings`.
"""

from agentlightning_torch.vllm._client import VLLMClient, VLLMError
from agentlightning_torch.vllm._lora import VLLM_LORA_ENV, VLLMLoRAError, load_vllm_lora, vllm_lora_args
from agentlightning_torch.vllm._server import VLLMNotInstalledError, VLLMServer, VLLMStartError, find_vllm_python
from agentlightning_torch.vllm._serving import VLLMLoRAServing, VLLMSettings, VLLMWeightsServing
from agentlightning_torch.vllm._weight_sync import VLLMWeightSync, WeightSyncMismatch

__all__ = [
    "VLLM_LORA_ENV",
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
    "find_vllm_python",
    "load_vllm_lora",
    "vllm_lora_args",
]
