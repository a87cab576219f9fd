"""`TorchEngine` serves through one `Serving`, picked once by `make_serving`: one implementation per way of serving.

Nothing is launched here: the vLLM ones are built, not started (their lifecycle runs in ``test_vllm_trainer.py`` and
``tests/test_lora_policies.py``); the local ones start, serve the version they were given, sync, drain and stop.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agentlightning import FROZEN, PolicyMap
from agentlightning.loop import Serving
from agentlightning.proxy import registered_backend
from agentlightning_torch import (
    BackendPoliciesServing,
    BackendServing,
    PolicySettings,
    TorchEngine,
    TorchTrainerConfig,
    VLLMLoRAServing,
    VLLMSettings,
    VLLMWeightsServing,
)
from agentlightning_torch.testing import make_tiny_chat_model

POLICIES = PolicyMap(agents={"writer": "writer", "rewriter": "rewriter", "checker": FROZEN})


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("serving") / "model"
    make_tiny_chat_model(folder)
    return folder


def _config(model_dir: Path, **update: Any) -> TorchTrainerConfig:
    return TorchTrainerConfig(model_dir=model_dir, output_dir=model_dir.parent / "run", model_name="small", **update)


# a URL given: building the vLLM serving launches nothing
VLLM = {"backend": "vllm", "vllm": VLLMSettings(url="http://127.0.0.1:9/v1")}


@pytest.mark.parametrize(
    ("update", "expected"),
    [
        ({}, BackendServing),
        ({"backend_http": True}, BackendServing),
        ({"policies": POLICIES}, BackendPoliciesServing),
        ({"policies": POLICIES, "policy_settings": {"writer": PolicySettings(weights="full")}}, BackendPoliciesServing),
        (VLLM, VLLMWeightsServing),
        ({**VLLM, "policies": POLICIES}, VLLMLoRAServing),
    ],
    ids=["local", "local-http", "local-policies", "local-full-policy", "vllm", "vllm-lora"],
)
def test_each_way_of_serving_is_one_serving(model_dir: Path, update: dict[str, Any], expected: type) -> None:
    engine = TorchEngine(_config(model_dir, **update))
    assert type(engine.serving) is expected
    assert isinstance(engine.serving, Serving)  # every step of the protocol, checked at run time too


async def _version(url: str) -> int:
    reply = await registered_backend(url).request("GET", "/health", b"")
    return int(json.loads(await reply.read())["model_version"])


async def test_the_engine_steps_are_its_servings(model_dir: Path) -> None:
    """start → sync → drain → metrics → stop, through the engine, on the local backend with a full-weight policy."""
    config = _config(model_dir, policies=POLICIES, policy_settings={"writer": PolicySettings(weights="full")})
    engine = TorchEngine(config)
    serving = engine.serving
    assert isinstance(serving, BackendPoliciesServing)
    [url] = await engine.start_servers(3)
    try:
        assert await engine.start_servers(3) == [url]  # starting again keeps the running servers
        assert serving.full_backends is not None and serving.full_backends.backends["writer"].model_version == 3
        assert await _version(url) == 3
        assert engine.trained is not None
        engine.trained.updated = ["writer"]  # as an update of the writer alone leaves it
        await engine.sync_weights(4)
        assert serving.full_backends.backends["writer"].model_version == 4
        assert await engine.wait_servers_idle(1.0) == 0
        metrics = engine.iteration_metrics()
        assert metrics["backend_batches"] == 0.0 and engine.iteration_metrics()["tokens_generated"] == 0.0
        assert engine.policy_versions() == {}
    finally:
        await engine.stop_servers()
    assert serving.url is None and serving.full_backends is None


async def test_a_sync_before_start_says_to_start(model_dir: Path) -> None:
    engine = TorchEngine(_config(model_dir))
    with pytest.raises(RuntimeError, match="not started"):
        await engine.sync_weights(1)
