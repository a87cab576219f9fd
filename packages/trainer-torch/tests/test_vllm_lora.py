"""Real vLLM's multi-LoRA serving (CPU build) behind the LLM proxy's policy routing, against `LocalBackend`.

vLLM runs with ``--enable-lora`` and loads the writer's adapter at run time; the proxy routes a call naming agent
``writer`` to it and a call naming ``checker`` (``frozen``) to the base. Greedy tokens equal `LocalBackend`'s serving
the same adapter; after the adapter's weights change, loading the new folder in place serves the new tokens (again
equal to `LocalBackend`'s), and a folder without an adapter is refused with the old adapter still served.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from openai import AsyncOpenAI
from peft import LoraConfig, PeftModel, get_peft_model

from agentlightning import AGENT_HEADER, FROZEN, PolicyMap
from agentlightning.proxy import LLMProxy
from agentlightning.store import MemoryStore
from agentlightning.testing import start_attempts
from agentlightning_torch import LocalBackend
from agentlightning_torch.models._loading import load_model
from agentlightning_torch.serving._generate import SamplingParams
from agentlightning_torch.testing import VLLMServer
from agentlightning_torch.vllm._lora import VLLMLoRAError, load_vllm_lora

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1200)]

PROMPT = [5, 6, 7, 8, 9, 10]
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


@pytest.fixture
def lora_vllm(lora_vllm_server: VLLMServer) -> VLLMServer:
    """The session's multi-LoRA vLLM (root conftest; the trainer's test loads adapters of other names into it)."""
    return lora_vllm_server


def _writer(tool_model_dir: Path) -> PeftModel:
    torch.manual_seed(1)
    config = LoraConfig(r=4, lora_alpha=64, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    return get_peft_model(copy.deepcopy(load_model(tool_model_dir).model), config, adapter_name="writer")


def _local_tokens(tool_model_dir: Path, writer: PeftModel) -> tuple[list[int], list[int]]:
    backend = LocalBackend(load_model(tool_model_dir), batch_wait_ms=0).start()
    try:
        backend.load_lora("writer", writer)
        adapted = backend.submit(PROMPT, GREEDY, lora="writer").result().token_ids
        return adapted, backend.generate(PROMPT, GREEDY).token_ids
    finally:
        backend.stop()


async def _through_proxy(vllm: VLLMServer, agent: str) -> list[int]:
    store = MemoryStore()
    attempts = await start_attempts(store, ["ro-1"])
    policies = PolicyMap(agents={"writer": "writer", "checker": FROZEN})
    async with LLMProxy(store, [vllm.base_url], served_model="tiny", policies=policies) as proxy:
        client = AsyncOpenAI(base_url=proxy.base_url("ro-1", attempts["ro-1"]), api_key="k", max_retries=0)
        await client.completions.create(
            model="tiny", prompt=PROMPT, max_tokens=8, temperature=0, extra_body={"ignore_eos": True},
            extra_headers={AGENT_HEADER: agent},
        )  # fmt: skip
        (call,) = await store.query_llm_calls("ro-1")
    assert call.policy == ("writer" if agent == "writer" else FROZEN)
    return call.response_token_ids


async def test_vllm_serves_each_policys_adapter_as_the_local_backend_does(
    lora_vllm: VLLMServer, tool_model_dir: Path, tmp_path: Path
) -> None:
    writer = _writer(tool_model_dir)
    writer.save_pretrained(str(tmp_path / "v1"))
    load_vllm_lora(lora_vllm.url, "writer", tmp_path / "v1" / "writer")
    adapted, base = _local_tokens(tool_model_dir, writer)
    assert adapted != base  # the adapter changes the greedy answer
    assert await _through_proxy(lora_vllm, "writer") == adapted
    assert await _through_proxy(lora_vllm, "checker") == base

    with torch.no_grad():  # an update of the writer's adapter, replaced in place
        for name, parameter in writer.named_parameters():
            if "lora_B" in name:
                parameter.mul_(-2.0)
    writer.save_pretrained(str(tmp_path / "v2"))
    load_vllm_lora(lora_vllm.url, "writer", tmp_path / "v2" / "writer")
    updated, _ = _local_tokens(tool_model_dir, writer)
    assert updated != adapted
    assert await _through_proxy(lora_vllm, "writer") == updated

    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "adapter_config.json").write_text("{}")
    with pytest.raises(VLLMLoRAError, match="refused adapter 'writer'"):
        load_vllm_lora(lora_vllm.url, "writer", tmp_path / "empty")
    assert await _through_proxy(lora_vllm, "writer") == updated  # the adapter served before stays
