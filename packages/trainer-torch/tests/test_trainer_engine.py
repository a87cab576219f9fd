"""`TorchTrainer` as an engine behind `agl.RLLoop`: checkpoint/resume of weights, optimizer, iteration, version."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM

import agentlightning as agl
from agentlightning.proxy import IN_PROCESS_SCHEME, registered_backend
from agentlightning_torch import TorchTrainer, TorchTrainerConfig
from agentlightning_torch.testing import make_tiny_chat_model


def _batch() -> agl.TrainingBatch:
    prompt, response = [5, 6, 7, 8], [9, 10, 11]
    sample = agl.TrainingSample(
        prompt_ids=prompt,
        response_ids=response,
        response_mask=[1] * len(response),
        credit=1.0,
        advantage=1.0,
        returns=1.0,
        group_id="g",
        rollout_id="r",
        attempt_id="a",
        step_index=0,
        model_version=0,
    )
    return agl.TrainingBatch(samples=[sample])


async def _health(backend_url: str) -> dict[str, Any]:
    """The backend's ``/health``, in-process or over HTTP."""
    if backend_url.startswith(IN_PROCESS_SCHEME):
        reply = await registered_backend(backend_url).request("GET", "/health", b"")
        return json.loads(await reply.read())
    async with httpx.AsyncClient() as client:
        return (await client.get(f"{backend_url}/health")).json()


@pytest.mark.parametrize("backend_http", [False, True], ids=["in-process", "http"])
async def test_a_checkpoint_resumes_weights_optimizer_iteration_and_served_version(
    tmp_path: Path, backend_http: bool
) -> None:
    make_tiny_chat_model(tmp_path / "model")
    config = TorchTrainerConfig(
        model_dir=tmp_path / "model", output_dir=tmp_path / "run", model_name="small", backend_http=backend_http
    )
    trainer = TorchTrainer(config)
    assert isinstance(trainer, agl.Engine) and trainer.loop.engine is trainer
    base = [p.detach().clone() for p in trainer.policy.parameters()]
    trainer.update(_batch())  # weights and optimizer state move
    assert any(not torch.equal(b, p.detach()) for b, p in zip(base, trainer.policy.parameters(), strict=True))
    trainer.loop.iteration, trainer.loop.model_version = 3, 4
    folder = trainer.loop.save_checkpoint()
    reloaded = AutoModelForCausalLM.from_pretrained(folder)  # a plain transformers folder, identical logits
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.no_grad():
        assert torch.equal(reloaded(input_ids=ids).logits, trainer.policy(input_ids=ids).logits)

    resumed = TorchTrainer(config.model_copy(update={"resume": True}))
    assert (resumed.iteration, resumed.model_version) == (3, 4)
    for saved, loaded in zip(trainer.policy.parameters(), resumed.policy.parameters(), strict=True):
        assert torch.equal(saved.detach(), loaded.detach())
    steps = [state["step"] for state in resumed.optimizer.state_dict()["state"].values()]
    assert steps and all(float(step) == 1.0 for step in steps)
    store = agl.MemoryStore()
    try:
        await resumed.start(store)
        [backend_url] = resumed.proxy.backends
        assert backend_url.startswith("http://" if backend_http else IN_PROCESS_SCHEME)
        assert (await _health(backend_url))["model_version"] == 4  # served as the resumed version
        published = await store.get_resources()
        assert published is not None and published.resources_id.startswith("policy-v4-")
    finally:
        await resumed.stop()
