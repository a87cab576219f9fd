# pyright: basic
"""The one vLLM worker extension that restores vLLM's CPU-packed linear weights so new weights can be loaded.

Both trainers use this file, and no other copy exists (``tests/test_vllm_worker_single_copy.py`` fails on a second
one): trainer-torch starts vLLM with ``--worker-extension-cls agl_vllm_worker.WeightSyncExtension`` and this folder
on the server's ``PYTHONPATH``; trainer-verl's worker extension (a subclass of verl's) loads this file by path
(`agentlightning.vllm_worker_files.load_worker_module`) and calls `restore_emptied_linear_layers` before verl's sync.

Why it lives in the core as a standalone file: neither trainer package depends on the other, and the file runs inside
vLLM's worker process, in vLLM's own environment (``.venv-vllm`` has no ``agentlightning``), so it imports only
torch, safetensors and vLLM, never ``agentlightning`` (a test checks this). The folder has no ``__init__.py``: it is
not a module of the core, which never imports it (the core's import-boundary tests skip this folder for that reason).
pyright checks it in basic mode: vLLM's objects are untyped and vLLM need not be installed where the project is
type-checked.

Why not vLLM's own ``reload_weights``: on CPU, vLLM repacks each linear layer's weight into a kernel buffer and
leaves the layer's ``weight`` parameter empty (``numel() == 0``), so a reload changes only embeddings, norms and
biases while answering 200, and verl's ``model.load_weights`` fails ("Attempted to load weight ... into parameter
(torch.Size([0]))"). `restore_emptied_linear_layers` gives each emptied linear layer a full-size weight again
(created by the layer's own quant method, with vLLM's own weight loader, filled with NaN until loaded);
`WeightSyncExtension.agl_load_weights` then runs the model's own ``load_weights`` (checkpoint names, stacked q/k/v
and gate/up shards) and re-runs every layer's ``process_weights_after_loading`` so the kernels repack from the new
weights. On GPUs nothing is emptied and nothing is restored.
"""

from __future__ import annotations

import time
from typing import Any

import torch

__all__ = ["WeightSyncExtension", "emptied_linear_layers", "restore_emptied_linear_layers", "restore_full_weight"]


def emptied_linear_layers(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """Linear layers (name, layer) whose weight the CPU backend emptied after packing it (``numel() == 0``)."""
    layers: list[tuple[str, torch.nn.Module]] = []
    for name, module in model.named_modules():
        weight = getattr(module, "weight", None)
        if getattr(module, "quant_method", None) is None or not isinstance(weight, torch.Tensor):
            continue
        if weight.numel() == 0 and hasattr(module, "output_partition_sizes"):
            layers.append((name, module))
    return layers


def restore_full_weight(layer: Any) -> None:
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
    # NaN until loaded: a layer a sync forgets makes every log-prob NaN instead of silently serving garbage
    layer.weight.data.fill_(float("nan"))


def restore_emptied_linear_layers(model: torch.nn.Module) -> list[str]:
    """Give every emptied linear layer of ``model`` a full-size weight again (see the module docstring).

    Returns:
        The restored layers' names (empty on GPUs, where vLLM empties nothing).
    """
    emptied = emptied_linear_layers(model)
    for _, layer in emptied:
        restore_full_weight(layer)
    return [name for name, _ in emptied]


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
        emptied = restore_emptied_linear_layers(model)
        with torch.no_grad():
            loaded = model.load_weights(weights=iter(weights.items()))  # pyright: ignore[reportCallIssue]
            # A restored weight the file did not fill holds uninitialised memory: refuse rather than serve it.
            missing = [name for name in emptied if isinstance(loaded, set) and f"{name}.weight" not in loaded]
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
        return len(emptied_linear_layers(worker.model_runner.get_model()))

    def _process_after_loading(self, model: torch.nn.Module) -> None:
        """Re-run what vLLM runs once after loading a checkpoint: each layer's kernel repacking."""
        from vllm.model_executor.model_loader.utils import (  # pyright: ignore[reportMissingImports]
            process_weights_after_loading,
        )

        worker: Any = self
        config = worker.model_runner.vllm_config.model_config
        process_weights_after_loading(model, config, next(model.parameters()).device)
