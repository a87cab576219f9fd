"""LoRA adapters served beside one base model: rows of one decode step use different adapters.

A mixed batch (rows of adapter ``a``, adapter ``b`` and the bare base, admitted together and decoded in the same
steps) must give the same greedy tokens as serving each adapter alone, one request at a time. The adapters are
random and strong enough that they disagree with each other and with the base, so a backend that ignored the row's
adapter would fail.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from agentlightning_torch import LocalBackend, OpenAIEndpoint
from agentlightning_torch.serving._generate import SamplingParams

pytestmark = pytest.mark.filterwarnings("ignore:Adapter name:UserWarning")  # peft dislikes one-letter names

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
PROMPTS = [[3, 4, 5, 6], [7, 8, 9], [10, 11, 12, 13, 14], [15, 16]]


def _lora(seed: int) -> LoraConfig:
    torch.manual_seed(seed)
    return LoraConfig(
        r=4, lora_alpha=64, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False, lora_dropout=0.0
    )


@pytest.fixture
def base(make_small_model: Callable[..., PreTrainedModel], tokenizer: PreTrainedTokenizerFast) -> PreTrainedModel:
    return make_small_model(tokenizer, seed=3)


@pytest.fixture
def policies(base: PreTrainedModel) -> PeftModel:
    """The trainer's side: one peft model holding adapters ``a`` and ``b`` (random, not the identity)."""
    model = get_peft_model(copy.deepcopy(base), _lora(1), adapter_name="a")
    torch.manual_seed(2)
    model.add_adapter("b", _lora(2))
    return model


@pytest.fixture
def backend(base: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, policies: PeftModel) -> Iterator[LocalBackend]:
    served = LocalBackend(base, tokenizer, batch_wait_ms=0).start()
    served.load_lora("a", policies)
    served.load_lora("b", policies)
    yield served
    served.stop()


def _alone(
    base: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, policies: PeftModel, adapter: str | None
) -> list[list[int]]:
    """Each prompt served one at a time by a backend that serves only ``adapter`` (or only the base)."""
    alone = LocalBackend(base, tokenizer, batch_wait_ms=0).start()
    try:
        if adapter is not None:
            alone.load_lora(adapter, policies)
        return [alone.submit(p, GREEDY, lora=adapter).result().token_ids for p in PROMPTS]
    finally:
        alone.stop()


def test_a_mixed_batch_gives_each_row_its_own_adapters_greedy_tokens(
    backend: LocalBackend, base: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, policies: PeftModel
) -> None:
    adapters: list[str | None] = ["a", "b", None]
    backend.pause()  # everything queued now is admitted together and decoded in the same steps
    futures = [(adapter, backend.submit(p, GREEDY, lora=adapter)) for p in PROMPTS for adapter in adapters]
    backend.resume()
    mixed: dict[str | None, list[list[int]]] = {adapter: [] for adapter in adapters}
    for adapter, future in futures:
        mixed[adapter].append(future.result().token_ids)
    assert backend.stats.max_batch_size == len(futures)  # one batch: rows of every adapter in each step
    assert backend.stats.batches == 1
    alone = {adapter: _alone(base, tokenizer, policies, adapter) for adapter in adapters}
    assert mixed == alone
    assert mixed["a"] != mixed["b"] and mixed["a"] != mixed[None] and mixed["b"] != mixed[None]


def test_each_adapter_has_its_own_version_and_a_replacement_serves_new_weights(
    backend: LocalBackend, policies: PeftModel
) -> None:
    assert backend.lora_versions == {"a": 0, "b": 0}
    before = backend.submit(PROMPTS[0], GREEDY, lora="a").result()
    assert before.model_version == 0
    with torch.no_grad():  # the trainer updates adapter a only
        for name, parameter in policies.named_parameters():
            if "lora_B.a." in name:
                parameter.mul_(-3.0)
    assert backend.load_lora("a", policies) == 1
    assert backend.lora_versions == {"a": 1, "b": 0}
    after = backend.submit(PROMPTS[0], GREEDY, lora="a").result()
    assert after.model_version == 1 and after.token_ids != before.token_ids
    assert backend.submit(PROMPTS[0], GREEDY, lora="b").result().model_version == 0
    assert backend.generate(PROMPTS[0], GREEDY).model_version == backend.model_version
    assert not hasattr(backend, "load_adapter") and not hasattr(backend, "adapter_versions")  # renamed, no alias


def test_bad_adapters_are_refused_and_change_nothing(
    backend: LocalBackend, base: PreTrainedModel, policies: PeftModel
) -> None:
    with pytest.raises(ValueError, match="no LoRA adapter 'c' is served"):
        backend.submit(PROMPTS[0], GREEDY, lora="c")
    wider = LoraConfig(r=8, target_modules=["q_proj", "v_proj", "down_proj"])
    other_rank = get_peft_model(copy.deepcopy(base), wider, adapter_name="a")
    reference = backend.submit(PROMPTS[1], GREEDY, lora="a").result().token_ids
    with pytest.raises(ValueError, match="keeps its rank"):
        backend.load_lora("a", other_rank)
    assert backend.lora_versions["a"] == 0
    assert backend.submit(PROMPTS[1], GREEDY, lora="a").result().token_ids == reference
    with pytest.raises(ValueError, match="no adapter 'z'"):
        backend.load_lora("z", policies)
    with pytest.raises(RuntimeError, match="load_lora"):
        backend.load_state_dict(base.state_dict())


def test_an_adapter_saved_with_save_pretrained_serves_the_same_tokens(
    backend: LocalBackend, policies: PeftModel, tmp_path: Path
) -> None:
    policies.save_pretrained(str(tmp_path), selected_adapters=["b"])
    folder = tmp_path / "b"
    assert (folder / "adapter_config.json").is_file()
    served = backend.submit(PROMPTS[2], GREEDY, lora="b").result().token_ids
    backend.load_lora("b", folder)
    assert backend.submit(PROMPTS[2], GREEDY, lora="b").result().token_ids == served
    with pytest.raises(ValueError, match="holds no LoRA adapter"):
        backend.load_lora("b", tmp_path / "missing")


async def test_the_request_model_names_the_adapter_as_with_vllm(backend: LocalBackend) -> None:
    endpoint = OpenAIEndpoint(backend)
    listed = json.loads(await (await endpoint.request("GET", "/v1/models", b"")).read())
    assert [m["id"] for m in listed["data"]] == [backend.model_name, "a", "b"]
    assert [m.get("parent") for m in listed["data"]] == [None, backend.model_name, backend.model_name]
    answers: dict[str, list[int]] = {}
    for model in ("a", "b", backend.model_name):
        body = {"model": model, "prompt": PROMPTS[0], "max_tokens": 6, "temperature": 0, "return_token_ids": True}
        answer = json.loads(await (await endpoint.request("POST", "/v1/completions", json.dumps(body).encode())).read())
        answers[model] = answer["choices"][0]["token_ids"]
        assert answer["model"] == model
    short = SamplingParams(temperature=0.0, max_tokens=6)
    direct = {name: backend.submit(PROMPTS[0], short, lora=name).result().token_ids for name in ("a", "b")}
    assert answers["a"] == direct["a"] and answers["b"] == direct["b"]
    assert answers["a"] != answers["b"]
