"""Where the one vLLM worker-extension file is, for the trainers that start or extend a vLLM server.

The file (``vllm_worker/agl_vllm_worker.py`` next to this module; its docstring says why it lives in the core) runs
inside vLLM's worker process and imports only torch, safetensors and vLLM. The core never imports it: a trainer puts
`VLLM_WORKER_DIR` on a vLLM server's ``PYTHONPATH`` and names `VLLM_WORKER_EXTENSION`, or, already inside vLLM's
worker process with ``agentlightning`` installed, loads it with `load_worker_module`.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

__all__ = ["VLLM_WORKER_DIR", "VLLM_WORKER_EXTENSION", "VLLM_WORKER_MODULE", "load_worker_module"]

VLLM_WORKER_DIR = Path(__file__).resolve().parent / "vllm_worker"
"""The folder holding the standalone worker-extension module (no ``agentlightning`` imports, no ``__init__.py``)."""

VLLM_WORKER_MODULE = "agl_vllm_worker"
"""The worker-extension module's name, as vLLM imports it from `VLLM_WORKER_DIR` on its ``PYTHONPATH``."""

VLLM_WORKER_EXTENSION = f"{VLLM_WORKER_MODULE}.WeightSyncExtension"
"""vLLM's ``--worker-extension-cls`` for a server that loads weights with ``agl_load_weights``."""


def load_worker_module() -> ModuleType:
    """The worker-extension module, loaded by path once per process (it imports torch and, when used, vLLM).

    Returns:
        The module registered as `VLLM_WORKER_MODULE` in ``sys.modules`` (the same object vLLM would import by name).
    """
    loaded = sys.modules.get(VLLM_WORKER_MODULE)
    if loaded is not None:
        return loaded
    spec = importlib.util.spec_from_file_location(VLLM_WORKER_MODULE, VLLM_WORKER_DIR / f"{VLLM_WORKER_MODULE}.py")
    if spec is None or spec.loader is None:  # pragma: no cover - the file ships with the package
        raise ImportError(f"cannot load {VLLM_WORKER_MODULE} from {VLLM_WORKER_DIR}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[VLLM_WORKER_MODULE] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[VLLM_WORKER_MODULE]
        raise
    return module
