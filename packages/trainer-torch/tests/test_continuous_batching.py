"""Continuous batching in `LocalBackend`: joining mid-batch, the KV-cache bound, weight swaps between sequences."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
import torch

from agentlightning_torch import GenerationResult, LoadedModel, LocalBackend, SamplingParams, load_model


@pytest.fixture(scope="module")
def loaded(chat_model_dir: Path) -> LoadedModel:
    return load_model(chat_model_dir)


@pytest.fixture
def backend(loaded: LoadedModel) -> Iterator[LocalBackend]:
    running = LocalBackend(loaded, batch_wait_ms=0.0, max_batch_wait_ms=0.0).start()
    yield running
    running.stop()


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


def reference(loaded: LoadedModel, prompt: list[int], max_tokens: int) -> list[int]:
    """Plain transformers greedy decoding, eos ignored (the same as ``ignore_eos``)."""
    output = loaded.model.generate(
        torch.tensor([prompt]), max_new_tokens=max_tokens, min_new_tokens=max_tokens, do_sample=False
    )
    return output[0, len(prompt) :].tolist()


def test_a_request_joins_a_running_batch_and_leaves_before_it_ends(backend: LocalBackend, loaded: LoadedModel) -> None:
    long_prompt, short_prompt = list(range(10, 30)), list(range(40, 45))
    long_tokens: list[int] = []
    short_future: list[Future[GenerationResult]] = []
    long_count_when_short_finished: list[int] = []

    def on_short_done(_: Future[GenerationResult]) -> None:
        long_count_when_short_finished.append(len(long_tokens))

    def on_long_token(_row: int, token: int, *_: Any) -> None:
        long_tokens.append(token)
        if len(long_tokens) == 5:  # the long request is decoding: submit the short one now
            future = backend.submit(short_prompt, greedy(3))
            future.add_done_callback(on_short_done)
            short_future.append(future)

    long_result = backend.submit(long_prompt, greedy(40), on_long_token).result(timeout=120)
    short_result = short_future[0].result(timeout=120)
    # The short request joined at the next step and finished 3 tokens later, while the long one kept going.
    assert long_count_when_short_finished and 5 < long_count_when_short_finished[0] <= 5 + 3 + 1 < 40
    assert len(long_result.token_ids) == 40 and len(short_result.token_ids) == 3
    assert backend.stats.max_batch_size == 2 and backend.stats.batches == 2
    # Sharing the batch (and its padded cache) changed neither answer.
    assert long_result.token_ids == reference(loaded, long_prompt, 40)
    assert short_result.token_ids == reference(loaded, short_prompt, 3)


def test_256_concurrent_requests_stay_under_the_kv_bound(loaded: LoadedModel) -> None:
    bound = 1500
    rng = random.Random(7)
    requests = [([rng.randrange(3, 300) for _ in range(rng.randint(4, 24))], rng.randint(1, 24)) for _ in range(256)]
    backend = LocalBackend(loaded, max_batch_size=256, max_kv_tokens=bound, batch_wait_ms=0.0, max_batch_wait_ms=0.0)
    backend.start()
    try:
        backend.pause()  # all 256 wait together, then compete for the cache
        futures = [backend.submit(prompt, greedy(count)) for prompt, count in requests]
        assert backend.queue_depth == 256
        backend.resume()
        results = [f.result(timeout=300) for f in futures]
    finally:
        backend.stop()
    assert [len(r.token_ids) for r in results] == [count for _, count in requests]
    stats = backend.stats
    assert stats.requests == 256 and stats.kv_tokens == 0
    assert stats.cpu_seconds > 0  # the generation thread's own CPU, counted around every prefill and step
    assert 0 < stats.peak_kv_tokens <= bound  # measured on the cache tensors after every prefill and step
    assert stats.max_batch_size < 256  # the bound, not the sequence limit, held the batch back
    # Sequences evicted to stay under the bound resumed where they were: outputs equal plain greedy decoding.
    for index in range(0, 256, 37):
        prompt, count = requests[index]
        assert results[index].token_ids == reference(loaded, prompt, count)


def test_eviction_resumes_without_losing_tokens(loaded: LoadedModel) -> None:
    # Two long rows cannot both grow to 60 tokens under a 90-token bound: one is evicted and resumes later.
    backend = LocalBackend(loaded, max_kv_tokens=90, batch_wait_ms=0.0, max_batch_wait_ms=0.0).start()
    try:
        backend.pause()
        prompts = [list(range(10, 20)), list(range(50, 60))]
        futures = [backend.submit(p, greedy(40)) for p in prompts]
        backend.resume()
        results = [f.result(timeout=120) for f in futures]
    finally:
        backend.stop()
    assert backend.stats.preemptions >= 1 and backend.stats.peak_kv_tokens <= 90
    for prompt, result in zip(prompts, results, strict=True):
        assert result.token_ids == reference(loaded, prompt, 40)
        assert len(result.logprobs) == 40


def test_weights_swap_between_sequences_and_label_each_result(backend: LocalBackend, loaded: LoadedModel) -> None:
    swapped = threading.Event()
    later: list[Future[GenerationResult]] = []
    new_weights = {k: v + 0.01 for k, v in loaded.model.state_dict().items()}

    def swap() -> None:
        backend.load_state_dict(new_weights)
        swapped.set()

    def on_token(_row: int, _token: int, *_: Any) -> None:
        if not later:
            threading.Thread(target=swap).start()
            later.append(backend.submit(list(range(40, 45)), greedy(3)))  # arrives while the swap waits

    first = backend.submit(list(range(10, 30)), greedy(30), on_token).result(timeout=120)
    second = later[0].result(timeout=120)
    assert swapped.wait(timeout=120)
    assert first.model_version == 0 and len(first.token_ids) == 30
    assert first.token_ids == reference(loaded, list(range(10, 30)), 30)  # all on the old weights
    assert second.model_version == 1 and backend.model_version == 1


def test_stop_token_ids_and_sampling_seed(backend: LocalBackend) -> None:
    prompt = list(range(10, 30))
    free = backend.submit(prompt, greedy(12)).result(timeout=60)
    stop_at = free.token_ids[3]
    stopped = backend.submit(prompt, SamplingParams(temperature=0.0, max_tokens=12, stop_token_ids=(stop_at,)))
    result = stopped.result(timeout=60)
    assert result.token_ids == free.token_ids[: free.token_ids.index(stop_at) + 1]
    assert result.finish_reason == "stop" and result.stop_reason == stop_at
    sampled = [backend.submit(prompt, SamplingParams(max_tokens=8, seed=5, ignore_eos=True)) for _ in range(2)]
    assert sampled[0].result(timeout=60).token_ids == sampled[1].result(timeout=60).token_ids
