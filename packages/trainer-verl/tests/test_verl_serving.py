"""`VerlEngine` delegates its server steps to its backend's `Serving`; the old serving names are deprecated aliases.

The Ray and vLLM ways of serving run end to end in ``test_verl_ray_loop.py`` and ``test_verl_vllm_loop.py``; here
the engine runs on `LocalVerlBackend`, whose `NoServing` serves nothing (its actor is never reached by a server step).
"""

from __future__ import annotations

from typing import Any

import pytest

import agentlightning_verl
from agentlightning_verl import (
    ExportedWeightsServing,
    LocalVerlBackend,
    NoServing,
    Serving,
    VerlEngine,
    VerlTrainerConfig,
    VLLMReplicaServing,
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


async def test_the_old_backend_methods_warn_and_call_the_serving() -> None:
    actor: Any = None
    backend = LocalVerlBackend(actor)
    with pytest.warns(DeprecationWarning, match="VerlBackend.sync_weights is deprecated"):
        assert await backend.sync_weights(3) == {}
    with pytest.warns(DeprecationWarning, match="VerlBackend.drain_rollout is deprecated"):
        assert await backend.drain_rollout() == 0
    with pytest.warns(DeprecationWarning, match="VerlBackend.release_rollout is deprecated"):
        await backend.release_rollout()
    with pytest.warns(DeprecationWarning, match="VerlBackend.rollout_addresses is deprecated"):
        assert backend.rollout_addresses() == []
    assert backend.synced_versions == [3]


@pytest.mark.parametrize(
    ("old", "new"),
    [("RolloutServing", Serving), ("VllmServing", VLLMReplicaServing), ("LocalServing", ExportedWeightsServing)],
)
def test_the_old_serving_names_are_deprecated_aliases(old: str, new: type) -> None:
    with pytest.warns(DeprecationWarning, match=f"agentlightning_verl.{old} is deprecated: use {new.__name__}"):
        assert getattr(agentlightning_verl, old) is new
