"""`VerlEngine` delegates its server steps to its runtime's `Serving`; the old serving names are gone.

The Ray and vLLM ways of serving run end to end in ``test_verl_ray_loop.py`` and ``test_verl_vllm_loop.py``; here
the engine runs on `LocalVerlRuntime`, whose `NoServing` serves nothing (its actor is never reached by a server step).
"""

from __future__ import annotations

from typing import Any

import pytest

import agentlightning_verl
from agentlightning.loop import Serving
from agentlightning_verl import (
    LocalVerlRuntime,
    NoServing,
    VerlEngine,
    VerlTrainerConfig,
)


async def test_the_engine_steps_are_its_runtimes_servings(tmp_path: Any) -> None:
    actor: Any = None  # the serving steps never reach the actor
    runtime = LocalVerlRuntime(actor)
    engine = VerlEngine(VerlTrainerConfig(model_path=str(tmp_path)), runtime=runtime)
    assert isinstance(engine.serving, NoServing) and isinstance(engine.serving, Serving)
    assert await engine.start_servers(0) == []  # nothing serves: no address
    assert await engine.wait_servers_idle(1.0) == 0
    engine.serving.release()
    await engine.sync_weights(1)
    assert runtime.synced_versions == [0, 1]
    assert engine.iteration_metrics() == {}
    await engine.stop_servers()


@pytest.mark.parametrize(
    "old",
    [
        "RolloutServing",
        "VllmServing",
        "LocalServing",
        "install_cpu_platform",
        "Serving",  # core's agentlightning.loop.Serving is the one contract
        "VerlBackend",  # a backend is an inference server: verl's actor side is its runtime
        "LocalVerlBackend",
        "RayVerlBackend",
    ],
)
def test_the_old_serving_names_are_gone(old: str) -> None:
    with pytest.raises(AttributeError, match=f"has no attribute '{old}'"):
        getattr(agentlightning_verl, old)
    actor: Any = None
    runtime = LocalVerlRuntime(actor)  # its serving steps are runtime.serving's only
    assert not any(hasattr(runtime, name) for name in ("sync_weights", "drain_rollout", "release_rollout"))
