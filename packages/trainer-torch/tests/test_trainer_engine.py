"""`TorchTrainer`: `agl.RLLoop` driving a `TorchEngine`; checkpoint/resume of weights, optimizer, iteration, version."""

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
from agentlightning.testing import start_attempts
from agentlightning_torch import TorchEngine, TorchTrainer, TorchTrainerConfig
from agentlightning_torch.testing import make_tiny_chat_model


def _batch() -> agl.TrainingBatch:
    prompt, response = [5, 6, 7, 8], [9, 10, 11]
    sample = agl.TrainingSample(
        prompt_token_ids=prompt,
        response_token_ids=response,
        response_mask=[1] * len(response),
        credit=1.0,
        advantage=1.0,
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
    # one shape: the trainer is the core's RLLoop, the model side is its engine
    assert isinstance(trainer, agl.RLLoop) and isinstance(trainer.engine, TorchEngine)
    assert not isinstance(trainer, agl.Engine) and not hasattr(trainer, "update")
    engine = trainer.engine
    base = [p.detach().clone() for p in engine.policy.parameters()]
    engine.update(_batch())  # weights and optimizer state move
    assert any(not torch.equal(b, p.detach()) for b, p in zip(base, engine.policy.parameters(), strict=True))
    trainer.iteration, trainer.model_version = 3, 4
    folder = trainer.save_checkpoint()
    reloaded = AutoModelForCausalLM.from_pretrained(folder)  # a plain transformers folder, identical logits
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.no_grad():
        assert torch.equal(reloaded(input_ids=ids).logits, engine.policy(input_ids=ids).logits)

    resumed = TorchTrainer(config.model_copy(update={"resume": True}))
    assert (resumed.iteration, resumed.model_version) == (3, 4)
    for saved, loaded in zip(engine.policy.parameters(), resumed.engine.policy.parameters(), strict=True):
        assert torch.equal(saved.detach(), loaded.detach())
    steps = [state["step"] for state in resumed.engine.optimizer.state_dict()["state"].values()]
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


async def test_with_max_staleness_2_the_backend_serves_its_own_weights_until_the_sync(tmp_path: Path) -> None:
    make_tiny_chat_model(tmp_path / "model")
    with pytest.raises(ValueError, match="max_staleness"):
        TorchTrainerConfig(model_dir=tmp_path / "model", max_staleness=-1)
    config = TorchTrainerConfig(model_dir=tmp_path / "model", output_dir=tmp_path / "run", max_staleness=2)
    trainer = TorchTrainer(config)
    engine = trainer.engine
    assert engine.serves_during_update and trainer.config.max_staleness == 2 and engine.ppo.is_correction
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.no_grad():
        policy_before = engine.policy(input_ids=ids).logits
    store = agl.MemoryStore()
    try:
        await trainer.start(store)
        attempts = await start_attempts(store, ["ro"])
        base_url = trainer.proxy.base_url("ro", attempts["ro"])
        auth = {"Authorization": f"Bearer {trainer.proxy.token}"}  # the loop's proxy always has a token
        async with httpx.AsyncClient(base_url=base_url, timeout=120, headers=auth) as client:

            async def ask() -> tuple[int, list[int], list[float]]:
                body = {
                    "model": "local",
                    "messages": [{"role": "user", "content": "Q:1+2="}],
                    "temperature": 0,
                    "max_tokens": 6,
                }
                reply = await client.post("/chat/completions", json=body)
                assert reply.status_code == 200, reply.text
                calls = await store.query_llm_calls("ro")
                return reply.json()["model_version"], calls[-1].response_token_ids, calls[-1].response_logprobs or []

            before = await ask()
            # off-policy samples carry their behaviour log-probs (what the importance correction needs)
            [plain] = _batch().samples
            logged = plain.model_copy(update={"response_logprobs": [-1.0] * len(plain.response_token_ids)})
            engine.update(agl.TrainingBatch(samples=[logged]))  # the policy changes in place, as during the update
            with torch.no_grad():
                assert not torch.equal(engine.policy(input_ids=ids).logits, policy_before)
            assert await ask() == before  # the backend still serves version 0's weights, bit for bit
            await engine.sync_weights(1)
            version, tokens, logprobs = await ask()
            assert before[0] == 0 and version == 1 and (tokens, logprobs) != before[1:]
    finally:
        await trainer.stop()


def test_the_engine_picks_what_it_trains_once_and_never_branches_on_it(tmp_path: Path) -> None:
    """One policy or several is decided when the engine is built (`Policies`): update, save_state and load_state act
    on it without asking which (no ``if self.trained is not None`` in them)."""
    import ast
    import inspect
    import textwrap

    from agentlightning_torch import SinglePolicy, TrainedPolicies

    make_tiny_chat_model(tmp_path / "model")
    one = TorchEngine(TorchTrainerConfig(model_dir=tmp_path / "model", output_dir=tmp_path / "one"))
    assert isinstance(one.policies, SinglePolicy) and one.trained is None
    several = TorchEngine(
        TorchTrainerConfig(
            model_dir=tmp_path / "model",
            output_dir=tmp_path / "several",
            policies=agl.PolicyMap(agents={"writer": "writer"}),
        )
    )
    assert isinstance(several.policies, TrainedPolicies) and several.policies is several.trained
    for step in (TorchEngine.update, TorchEngine.save_state, TorchEngine.load_state):
        tree = ast.parse(textwrap.dedent(inspect.getsource(step)))
        branches = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.If | ast.IfExp | ast.Match)]
        assert branches == [], f"TorchEngine.{step.__name__} branches on what it trains"
