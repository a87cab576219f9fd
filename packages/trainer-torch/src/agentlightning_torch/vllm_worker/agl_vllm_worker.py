# pyright: basic
"""A vLLM worker extension that loads new weights into a running vLLM correctly on CPU (and on GPUs).

This module runs inside vLLM's worker process, in vLLM's own environment: it imports only torch, safetensors and
vLLM, never ``agentlightning`` (the trainer puts this folder on the server's ``PYTHONPATH`` and starts vLLM with
``--worker-extension-cls agl_vllm_worker.WeightSyncExtension``). pyright checks it in basic mode: vLLM's objects
are untyped here and vLLM need not be installed where the project is type-checked.

Why not vLLM's own ``reload_weights``: on CPU, vLLM repacks each linear layer's weight into a kernel buffer and
leaves the layer's ``weight`` parameter empty, so a reload changes only embeddings, norms and biases while
answering 200. `WeightSyncExtension.agl_load_weights` gives each emptied linear layer a full-size weight again,
runs the model's own ``load_weights`` (checkpoint names, stacked q/k/v and gate/up shards), then re-runs every
layer's ``process_weights_after_loading`` so the kernels repack from the new weights.
"""

from __future__ import annotations

import time
from typing import Any

import torch

__all__ = ["WeightSyncExtension"]


def _emptied_linear_layers(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """Linear layers (name, layer) whose weight the CPU backend emptied after packing it (``numel() == 0``)."""
    layers: list[tuple[str, torch.nn.Module]] = []
    for name, module in model.named_modules():
        weight = getattr(module, "weight", None)
        if getattr(module, "quant_method", None) is None or not isinstance(weight, torch.Tensor):
            continue
        if weight.numel() == 0 and hasattr(module, "output_partition_sizes"):
            layers.append((name, module))
    return layers


def _restore_full_weight(layer: Any) -> None:
    """Create the layer's weight parameter again, full size, with vLLM's own loader attached (as at start-up)."""
    from vllm.model_executor.layers.linear import WEIGHT_LOADER_V2_SUPPORTED  # pyright: ignore[reportMissingImports]

    method = layer.quant_method
    uses_v2 = method.__class__.__name__ in WEIGHT_LOADER_V2_SUPPORTED and hasattr(layer, "weight_loader_v2")
    device = layer.weight.device
    del layer.weight  # register_parameter refuses a name that is already taken
    method.create_weights(
        layer=layer,
        input_size_per_partition=getattr(layer, "input_size_per_partition", layer.input_size),
        output_partition_sizes=layer.output_partition_sizes,
        input_size=layer.input_size,
        output_size=layer.output_size,
        params_dtype=layer.params_dtype,
        weight_loader=layer.weight_loader_v2 if uses_v2 else layer.weight_loader,
    )
    if layer.weight.device != device:
        layer.weight.data = layer.weight.data.to(device)


class WeightSyncExtension:
    """Mixed into vLLM's worker class; its methods are called through ``POST /collective_rpc``."""

    def agl_load_weights(self, path: str) -> dict[str, Any]:
        """Load every tensor of the safetensors file at ``path`` (checkpoint names) into the served model.

        Returns:
            ``{"tensors": n, "restored_layers": n, "seconds": s}``, for the caller's log.
        """
        from safetensors.torch import load_file

        started = time.perf_counter()
        worker: Any = self
        model: torch.nn.Module = worker.model_runner.get_model()
        device = next(model.parameters()).device
        weights = load_file(path, device=str(device))
        emptied = _emptied_linear_layers(model)
        for _, layer in emptied:
            _restore_full_weight(layer)
        with torch.no_grad():
            loaded = model.load_weights(weights=iter(weights.items()))  # pyright: ignore[reportCallIssue]
            # A restored weight the file did not fill holds uninitialised memory: refuse rather than serve it.
            missing = [name for name, _ in emptied if isinstance(loaded, set) and f"{name}.weight" not in loaded]
            if missing:
                raise ValueError(
                    f"the weights file {path} lacks {len(missing)} linear layer(s) ({', '.join(missing[:3])}...): "
                    "send the whole state dict"
                )
            self._process_after_loading(model)
        return {"tensors": len(weights), "restored_layers": len(emptied), "seconds": time.perf_counter() - started}

    def agl_emptied_layers(self) -> int:
        """How many linear layers hold an empty weight now (the CPU backend's packing; 0 on GPUs)."""
        worker: Any = self
        return len(_emptied_linear_layers(worker.model_runner.get_model()))

    def _process_after_loading(self, model: torch.nn.Module) -> None:
        """Re-run what vLLM runs once after loading a checkpoint: each layer's kernel repacking."""
        from vllm.model_executor.model_loader.utils import (  # pyright: ignore[reportMissingImports]
            process_weights_after_loading,
        )

        worker: Any = self
        config = worker.model_runner.vllm_config.model_config
        process_weights_after_loading(model, config, next(model.parameters()).device)
