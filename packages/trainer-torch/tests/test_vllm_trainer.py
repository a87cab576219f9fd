"""Real vLLM (its CPU build here, ``vllm`` on GPUs) as `TorchTrainer`'s inference server.

One vLLM server for the module, launched by the trainer itself (``backend="vllm"``) for a copy of the calculator
checkpoint with a longer context (so a generation can be cut off mid-way). What must hold:

- every sync is verified by log-probs: the start, each update, and a deliberately broken sync (only embeddings and
  norms arrive: what vLLM's reload did on CPU) is caught with an error naming the version;
- what vLLM serves after a sync is what the trainer trained: a call through the proxy is recorded with the new
  version and its log-probs equal the trainer's own;
- a cancelled rollout's long generation stops in the server before the update (LocalBackend and vLLM alike): the
  proxy aborts the call, the agent gets 409, the server's running count is 0 when ``update`` starts.

vLLM is found by `find_vllm_python` (``python3 scripts/dev.py test`` installs it); without it these tests fail with
one line saying how to install it.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
import urllib.request
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
import torch

import agentlightning as agl
from agentlightning import semconv
from agentlightning.testing import start_attempts
from agentlightning_torch import (
    BackendServing,
    TorchTrainer,
    TorchTrainerConfig,
    VLLMError,
    VLLMNotInstalledError,
    VLLMSettings,
    VLLMWeightsServing,
    VLLMWeightSync,
    WeightSyncMismatch,
    find_vllm_python,
)
from agentlightning_torch.vllm._client import running_requests
from agentlightning_torch.vllm._weight_sync import reference_logprobs

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(900)]

CALC_CHECKPOINT = Path(__file__).resolve().parents[3] / "examples" / "calc" / "checkpoint"
LONG = 1500  # tokens of the generation that gets cancelled: far more than it can make before the abort lands


def _vllm_or_fail() -> None:
    try:
        find_vllm_python()
    except VLLMNotInstalledError as error:
        pytest.fail(str(error), pytrace=False)


@pytest.fixture(scope="module")
def long_context_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The calculator checkpoint with a 2048-token context (rotary positions extend; the weights are the same)."""
    folder = tmp_path_factory.mktemp("calc-long")
    for item in CALC_CHECKPOINT.iterdir():
        shutil.copy(item, folder / item.name)
    config = json.loads((folder / "config.json").read_text())
    config["max_position_embeddings"] = 2048
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def _config(model: Path, output: Path, backend: str) -> TorchTrainerConfig:
    return TorchTrainerConfig(
        model_dir=model,
        output_dir=output,
        model_name="calc",
        tool_parser=None,
        backend=backend,  # pyright: ignore[reportArgumentType]
        vllm=VLLMSettings(startup_timeout_s=800),
        iterations=1,
        tasks_per_iteration=2,
        samples_per_task=2,
        estimator="passthrough",
        drop_equal_groups=False,
        max_tokens=8,
        checkpoint_every=0,
        proxy=agl.ProxySettings(pause_timeout_s=120),
    )


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def vllm_trainer(
    long_context_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[tuple[TorchTrainer, agl.LightningStore]]:
    """A started trainer serving through its own vLLM server (verified at start)."""
    _vllm_or_fail()
    trainer = TorchTrainer(_config(long_context_model, tmp_path_factory.mktemp("run"), "vllm"))
    store = agl.MemoryStore()
    await trainer.start(store)
    try:
        yield trainer, store
    finally:
        await trainer.stop()


def _vllm(trainer: TorchTrainer) -> VLLMWeightsServing:
    """The trainer's vLLM serving (``backend="vllm"``, one policy)."""
    serving = trainer.engine.serving
    assert isinstance(serving, VLLMWeightsServing)
    return serving


def _perturb(model: torch.nn.Module, seed: int, scale: float = 0.05) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * scale)


async def test_start_loads_and_verifies_the_trainers_weights(vllm_trainer: tuple[TorchTrainer, Any]) -> None:
    trainer, _ = vllm_trainer
    assert _vllm(trainer).syncs == 1
    probe = _vllm(trainer).last_probe
    assert probe is not None and probe.version == 0 and probe.tokens == 23
    assert probe.max_abs_diff <= trainer.engine.config.vllm.tolerance
    # The server really is vLLM with the weight-sync extension (the CPU backend empties its packed linear weights).
    server = _vllm(trainer).server
    assert server is not None and "agl_vllm_worker.WeightSyncExtension" in server.command


async def test_a_synced_update_is_served_and_recorded_as_the_new_version(
    vllm_trainer: tuple[TorchTrainer, agl.LightningStore],
) -> None:
    trainer, store = vllm_trainer
    _perturb(trainer.engine.policy, seed=1)  # stands in for a PPO step: every weight changes
    version = trainer.model_version + 1
    await trainer.proxy.pause(timeout=60)
    await trainer.engine.sync_weights(version)
    trainer.proxy.resume(model_version=version)
    probe = _vllm(trainer).last_probe
    assert probe is not None and probe.version == version
    assert _vllm(trainer).metrics()["vllm_sync_max_logprob_diff"] <= trainer.engine.config.vllm.tolerance

    attempts = await start_attempts(store, ["served-1"])
    url = f"{trainer.proxy.base_url('served-1', attempts['served-1'])}/completions"
    prompt = "Q:12*34+5="
    body = {"model": "calc", "prompt": prompt, "max_tokens": 6, "temperature": 0, "logprobs": 1}
    auth = {"Authorization": f"Bearer {trainer.proxy.token}"}  # the loop's proxy always has a token
    async with aiohttp.ClientSession() as http, http.post(url, json=body, headers=auth) as resp:
        assert resp.status == 200, await resp.text()
    await trainer.proxy.flush()
    [call] = await store.query_llm_calls("served-1")
    assert call.model_version == version
    ours = reference_logprobs(trainer.engine.policy, list(call.prompt_token_ids), list(call.response_token_ids))
    served = ours[len(call.prompt_token_ids) - 1 :]
    logprobs = call.response_logprobs or []
    assert len(logprobs) == len(served) == len(call.response_token_ids) > 0
    assert max(abs(a - b) for a, b in zip(logprobs, served, strict=True)) <= trainer.engine.config.vllm.tolerance


async def test_a_broken_sync_is_caught_and_names_the_version(vllm_trainer: tuple[TorchTrainer, Any]) -> None:
    trainer, _ = vllm_trainer
    stale = {k: v.detach().clone() for k, v in trainer.engine.policy.state_dict().items()}
    _perturb(trainer.engine.policy, seed=2)  # the trainer moves on...
    # ...but the sync delivers the old weights (a transport that lost the update): vLLM answers 200 all the same.
    extension = VLLMWeightSync(_vllm(trainer).client, trainer.engine.tokenizer, 27, method="extension")
    with pytest.raises(WeightSyncMismatch, match=r"weight sync to version 41 failed verification"):
        await extension.sync(stale, trainer.engine.policy, 41)
    # A file without the linear layers is refused by the extension (those weights would be uninitialised memory).
    weights = {k: v.detach() for k, v in trainer.engine.policy.state_dict().items()}
    partial = {k: v for k, v in weights.items() if "proj" not in k}
    with pytest.raises(VLLMError, match=r"lacks \d+ linear layer"):
        await extension.sync(partial, trainer.engine.policy, 42)
    # The whole current state dict repairs it (and is verified).
    await _vllm(trainer).sync(43)
    probe = _vllm(trainer).last_probe
    assert probe is not None and probe.version == 43 and probe.max_abs_diff <= trainer.engine.config.vllm.tolerance


async def test_a_sync_goes_through_vllms_rl_endpoints_and_a_kept_request_survives_a_pause(
    vllm_trainer: tuple[TorchTrainer, Any], caplog: pytest.LogCaptureFixture
) -> None:
    trainer, _ = vllm_trainer
    serving = _vllm(trainer)
    client = serving.client
    assert await client.has_rl_api()
    _perturb(trainer.engine.policy, seed=4)
    await serving.sync(60)
    # the load ran between /pause?mode=keep and /resume, the version is set on the server, and the checksums of
    # the served tensors say the sync changed them
    assert await client.weight_version() == "60" and not await client.is_paused()
    metrics = serving.metrics()
    assert metrics["vllm_sync_rl_api"] == 1.0 and metrics["vllm_sync_changed_tensors"] > 0
    assert metrics["vllm_sync_max_logprob_diff"] <= trainer.engine.config.vllm.tolerance
    # weights loaded behind the trainer's back are noticed by the next sync (weight_checker compare)
    other = VLLMWeightSync(client, trainer.engine.tokenizer, 27, method="extension")
    _perturb(trainer.engine.policy, seed=5)
    await other.sync({k: v.detach() for k, v in trainer.engine.policy.state_dict().items()}, trainer.engine.policy, 61)
    _perturb(trainer.engine.policy, seed=6)
    with caplog.at_level("WARNING", logger="agentlightning_torch.vllm._weight_sync"):
        await serving.sync(62)
    assert "tensor(s) of vLLM's weights changed since the last verified sync" in caplog.text
    assert await client.weight_version() == "62"
    # a request sent during a keep pause is not refused nor lost: it is answered once vLLM resumes (whether it
    # reached vLLM before the resume cannot be observed: a paused engine publishes no queue gauges)
    await client.pause("keep")
    try:
        assert await client.is_paused()
        held = asyncio.create_task(client.greedy([5, 6, 7, 8], 4))
        await asyncio.sleep(0)  # let the request start
    finally:
        await client.resume()
    ids, logprobs, _ = await asyncio.wait_for(held, 120)
    assert len(ids) == len(logprobs) == 4


# ----- cancelled rollouts stop generating -------------------------------------------------------------------

STATUS: list[tuple[str, int]] = []
SHORTS_DONE: list[asyncio.Event] = []
"""Set once the short rollouts have finished: only then do the long ones call (the runner shares the test's loop).
Started together, a long generation could end before slow short rollouts did, on a busy machine."""


def _is_long(rollout_id: str) -> bool:
    return rollout_id.endswith("-s0")  # the first sample of each group generates long


@agl.rollout
async def long_or_short_agent(task: dict[str, Any], resources: agl.Resources) -> float:
    """One call: a short answer, or (a group's first sample) a generation of `LONG` tokens cancelled mid-way."""
    llm, rollout = resources.llm, agl.current_rollout()
    assert llm is not None and rollout is not None
    long = _is_long(rollout.rollout_id)
    if long:
        await SHORTS_DONE[-1].wait()
    request: dict[str, Any] = {"model": llm.model, "messages": [{"role": "user", "content": task["q"]}]}
    if long:
        request.update(max_tokens=LONG, ignore_eos=True, temperature=1.0)
    else:
        request.update(max_tokens=4, temperature=1.0)
    with agl.get_tracer().start_as_current_span("chat", attributes={semconv.SPAN_KIND: semconv.KIND_LLM}) as span:
        async with (
            aiohttp.ClientSession() as http,
            http.post(
                f"{agl.llm_base_url()}/chat/completions",
                json=request,
                headers={"Authorization": f"Bearer {llm.api_key}"},  # the key the loop publishes with the endpoint
            ) as resp,
        ):
            body = await resp.json()
            STATUS.append(("long" if long else "short", resp.status))
        if resp.status == 200:
            span.set_attribute(semconv.GEN_AI_RESPONSE_ID, body["id"])
    return 1.0


def _running_now(trainer: TorchTrainer) -> int:
    """The server's running requests, read synchronously (from the update's worker thread)."""
    serving = trainer.engine.serving
    if isinstance(serving, VLLMWeightsServing):
        with urllib.request.urlopen(f"{serving.url}/metrics", timeout=30) as answer:
            return running_requests(answer.read().decode())
    assert isinstance(serving, BackendServing) and serving.backend is not None
    return serving.backend.running


def _hold_vllm(trainer: TorchTrainer, route: str) -> None:
    """vLLM's ``/pause?mode=keep`` or ``/resume`` (nothing for the embedded backend, which generates far slower).

    A tiny model on vLLM can generate all ``LONG`` tokens between "seen generating" and the loop's cancel on a busy
    machine; kept paused, the request stays in vLLM unfinished until the cancel's abort removes it."""
    serving = trainer.engine.serving
    if isinstance(serving, VLLMWeightsServing):
        with urllib.request.urlopen(urllib.request.Request(f"{serving.url}{route}", method="POST"), timeout=60):
            pass


async def _running(trainer: TorchTrainer) -> int:
    return await asyncio.to_thread(_running_now, trainer)


async def _cancelled_generation_frees_its_slot(trainer: TorchTrainer, store: agl.LightningStore) -> None:
    STATUS.clear()
    SHORTS_DONE.append(asyncio.Event())
    real_wait = store.wait_for_rollouts
    at_update: list[int] = []
    real_update = trainer.engine.update

    async def wait_until_the_long_call_generates(rollout_ids: Sequence[str], timeout: float | None = None) -> Any:
        # Stands in for the rollout timeout without a clock: "late" = the long rollouts, their call generating.
        long_ids = {i for i in rollout_ids if _is_long(i)}
        await real_wait([i for i in rollout_ids if i not in long_ids])
        SHORTS_DONE[-1].set()
        deadline = time.monotonic() + 300
        # Both long calls are in the proxy and one generates in the server (polled, bounded): none can come late.
        while trainer.proxy.in_flight < len(long_ids) or await _running(trainer) < 1:
            assert time.monotonic() < deadline, f"the long generation never started (answers: {STATUS})"
            await asyncio.sleep(0.05)
        _hold_vllm(trainer, "/pause?mode=keep")  # frozen mid-generation: it cannot finish before the loop cancels it
        return await real_wait(rollout_ids, timeout=0)

    def recording_update(batch: agl.TrainingBatch) -> dict[str, float]:
        at_update.append(_running_now(trainer))
        _hold_vllm(trainer, "/resume")
        return real_update(batch)

    store.wait_for_rollouts = wait_until_the_long_call_generates  # type: ignore[method-assign]
    trainer.engine.update = recording_update  # type: ignore[method-assign]
    runner = agl.Runner(long_or_short_agent, store=store, n_workers=8, worker_mode="async", poll_interval=0.01)
    runner_task = asyncio.create_task(runner.arun())
    tasks = [{"q": "Q:1+2="}, {"q": "Q:3*4="}]
    try:
        report = await trainer.train_iteration(store, tasks)
    finally:
        runner.stop()
        await asyncio.wait_for(runner_task, 120)
        store.wait_for_rollouts = real_wait  # type: ignore[method-assign]
        del trainer.engine.update
    assert at_update == [0], "a cancelled rollout's generation was still running when the update started"
    assert report.metrics.get("skipped_update") is None and report.finished == 2
    assert sorted(STATUS) == [("long", 409), ("long", 409), ("short", 200), ("short", 200)]  # aborted, not answered
    assert trainer.proxy.in_flight == 0 and await _running(trainer) == 0
    cancelled = await store.query_rollouts(status=["cancelled"])
    assert len(cancelled) == 2 and all(_is_long(r.rollout_id) for r in cancelled)


async def test_vllm_a_cancelled_long_generation_stops_before_the_update(
    vllm_trainer: tuple[TorchTrainer, agl.LightningStore],
) -> None:
    trainer, store = vllm_trainer  # the store the trainer's proxy records into
    await _cancelled_generation_frees_its_slot(trainer, store)
    vllm = _vllm(trainer)
    assert vllm.last_probe is not None  # the update was synced and verified
    assert vllm.last_probe.version == trainer.model_version


async def test_local_backend_a_cancelled_long_generation_stops_before_the_update(
    long_context_model: Path, tmp_path: Path
) -> None:
    trainer = TorchTrainer(_config(long_context_model, tmp_path, "local"))
    store = agl.MemoryStore()
    await trainer.start(store)
    try:
        await _cancelled_generation_frees_its_slot(trainer, store)
        assert trainer.model_version == 1
    finally:
        await trainer.stop()


async def test_a_server_given_by_url_is_synced_and_verified_at_start(
    vllm_trainer: tuple[TorchTrainer, Any], long_context_model: Path, tmp_path: Path
) -> None:
    """``--vllm-url``: a second trainer uses the running server (with the extension) instead of launching one; its
    own weights (the checkpoint's, not the first trainer's) are loaded and verified at start. Runs last: it leaves
    the shared server serving the second trainer's weights."""
    trainer, _ = vllm_trainer
    config = _config(long_context_model, tmp_path, "vllm").model_copy(
        update={"vllm": VLLMSettings(url=f"{_vllm(trainer).url}/v1")}
    )
    other = TorchTrainer(config)
    await other.start(agl.MemoryStore())
    try:
        assert _vllm(other).server is None  # nothing launched
        probe = _vllm(other).last_probe
        assert probe is not None and probe.version == 0 and probe.max_abs_diff <= config.vllm.tolerance
    finally:
        await other.stop()
    assert await _vllm(trainer).running() == 0  # stopping the second trainer left the server it had not launched
