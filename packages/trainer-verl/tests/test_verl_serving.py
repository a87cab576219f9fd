"""`VerlEngine` delegates its server steps to its backend's `Serving`; the old serving names are gone.

The Ray and vLLM ways of serving run end to end in ``test_verl_ray_loop.py`` and ``test_verl_vllm_loop.py``; here
the engine runs on `LocalVerlBackend`, whose `NoServing` serves nothing (its actor is never reached by a server step).
"""

from __future__ import annotations

from typing import Any

import pytest

import agentlightning_verl
from agentlightning_verl import (
    LocalVerlBackend,
    NoServing,
    Serving,
    VerlEngine,
    VerlTrainerConfig,
)


async def test_the_engine_steps_are_its_backends_servings(tmp_path: Any) -> None:
    actor: Any = None  # the serving steps never reach the actor
    backend = LocalVerlBackend(actor)
    engine = VerlEngine(VerlTrainerConfig(model_path=str(tmp_path)), backend=backend)
    assert isinstance(engine.serving, NoServing) and isinstance(engine.serving, Serving)
    assert await engine.start_servers(0) == []  # nothing serves: no address
    assert await engine.drain_servers(1.0) == 0
    engine.serving.release()
    await engine.sync_weights(1)
    assert backend.synced_versions == [0, 1]
    assert engine.iteration_metrics() == {}
    await engine.stop_servers()


@pytest.mark.parametrize("old", ["RolloutServing", "VllmServing", "LocalServing", "install_cpu_platform"])
def test_the_old_serving_names_are_gone(old: str) -> None:
    with pytest.raises(AttributeError, match=f"has no attribute '{old}'"):
        getattr(agentlightning_verl, old)
    actor: Any = None
    backend = LocalVerlBackend(actor)  # its serving steps are backend.serving's only
    assert not any(hasattr(backend, name) for name in ("sync_weights", "drain_rollout", "release_rollout"))
