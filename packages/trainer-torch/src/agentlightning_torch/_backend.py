"""The local inference backend: a model behind a request queue that generates concurrent requests together.

At batch 128 a decoding step of the tiny model costs about what it costs at batch 1, so the backend waits for
``batch_wait_ms`` of quiet (at most ``max_batch_wait_ms``) for others to arrive, then runs them all in one batched
KV-cache loop (`generate_batch`). Weights are swapped between batches under a lock, so a batch never mixes two model
versions.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections import deque
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import PreTrainedModel

from agentlightning_torch._generate import GenerationResult, SamplingParams, StepCallback, generate_batch
from agentlightning_torch._model import load_tiny
from agentlightning_torch._template import CalcChatTemplate, ChatTemplate
from agentlightning_torch._tokenizer import CharTokenizer

__all__ = ["BackendStats", "LocalBackend", "merged_state_dict"]

logger = logging.getLogger(__name__)


@dataclass
class BackendStats:
    """Counters of what the backend has done (read them, do not write them).

    Attributes:
        requests: Generation requests completed (one per choice).
        batches: Batched generation loops run.
        tokens: Tokens generated.
        last_batch_size: Rows in the most recent batch.
        max_batch_size: Largest batch so far.
        batch_sizes: Size of every batch, in order (capped at the last 10,000).
        busy_seconds: Wall time spent generating (summed over batches).
    """

    requests: int = 0
    batches: int = 0
    tokens: int = 0
    last_batch_size: int = 0
    max_batch_size: int = 0
    batch_sizes: deque[int] = field(default_factory=lambda: deque(maxlen=10_000))
    busy_seconds: float = 0.0


@dataclass
class _Job:
    prompt_ids: list[int]
    params: SamplingParams
    future: Future[GenerationResult]
    on_step: StepCallback | None
    queued_at: float


def merged_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The plain (non-LoRA) state dict of ``model``: a PEFT model's adapters are merged into a copy first."""
    if hasattr(model, "merge_and_unload") and hasattr(model, "peft_config"):
        merged = copy.deepcopy(model).merge_and_unload()  # type: ignore[operator]
        return {k: v.detach() for k, v in merged.state_dict().items()}
    return {k: v.detach() for k, v in model.state_dict().items()}


class LocalBackend:
    """A causal LM serving generation requests with dynamic batching, on CPU or one GPU.

    Args:
        model: A model directory saved by `save_tiny` (or ``tiny warmstart``), or a model instance (deep-copied so
            training the original never races with generation; push new weights with `update_weights`).
        tokenizer: Required with a model instance; loaded from the directory otherwise.
        template: Chat template for chat requests; defaults to `CalcChatTemplate` over the tokenizer.
        device: Torch device for generation.
        max_batch_size: Most rows generated together.
        batch_wait_ms: A batch starts once no new request has arrived for this long (ms).
        max_batch_wait_ms: ...or this long after its first request, whichever comes first.
        model_name: Name reported by the OpenAI endpoints.
        num_threads: ``torch.set_num_threads`` applied at start (process-wide); ``None`` leaves it alone.
        seed: Seeds sampling of requests that carry no seed of their own.

    Raises:
        ValueError: If a model instance comes without a tokenizer, or a size is not positive.
    """

    def __init__(
        self,
        model: str | Path | PreTrainedModel,
        tokenizer: CharTokenizer | None = None,
        template: ChatTemplate | None = None,
        *,
        device: str | torch.device = "cpu",
        max_batch_size: int = 128,
        batch_wait_ms: float = 5.0,
        max_batch_wait_ms: float = 50.0,
        model_name: str = "tiny-calc",
        num_threads: int | None = 1,
        seed: int = 0,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if batch_wait_ms < 0:
            raise ValueError(f"batch_wait_ms must be >= 0, got {batch_wait_ms}")
        if isinstance(model, (str, Path)):
            loaded, saved_tokenizer = load_tiny(model, device=device)
            self.model: PreTrainedModel = loaded
            tokenizer = tokenizer or saved_tokenizer
        else:
            if tokenizer is None:
                raise ValueError("a tokenizer is required when the backend is given a model instance")
            self.model = copy.deepcopy(model)
            torch.nn.Module.to(self.model, device)
        self.model.eval()
        self.tokenizer = tokenizer
        self.template: ChatTemplate = template or CalcChatTemplate(tokenizer)
        self.device = torch.device(device)
        self.max_batch_size = max_batch_size
        self.batch_wait_ms = batch_wait_ms
        self.max_batch_wait_ms = max(max_batch_wait_ms, batch_wait_ms)
        self.model_name = model_name
        self.num_threads = num_threads
        self.stats = BackendStats()
        self.model_version = 0
        self._generator = torch.Generator().manual_seed(seed)
        self._queue: deque[_Job] = deque()
        self._condition = threading.Condition()
        self._weights_lock = threading.Lock()
        self._paused = False
        self._running = False
        self._worker: threading.Thread | None = None

    @property
    def max_context(self) -> int:
        """The model's context length in tokens."""
        return int(getattr(self.model.config, "max_position_embeddings", 2048))

    @property
    def queue_depth(self) -> int:
        """Requests waiting for a batch."""
        with self._condition:
            return len(self._queue)

    def start(self) -> LocalBackend:
        """Start the generation worker thread (idempotent); returns ``self``."""
        with self._condition:
            if self._running:
                return self
            self._running = True
        if self.num_threads is not None:
            torch.set_num_threads(self.num_threads)
        self._worker = threading.Thread(target=self._work, name="agentlightning-local-backend", daemon=True)
        self._worker.start()
        return self

    def stop(self) -> None:
        """Stop the worker; queued requests fail with `RuntimeError`."""
        with self._condition:
            self._running = False
            pending = list(self._queue)
            self._queue.clear()
            self._condition.notify_all()
        for job in pending:
            job.future.set_exception(RuntimeError("the backend was stopped"))
        if self._worker is not None:
            self._worker.join(timeout=30)
            self._worker = None

    def pause(self) -> None:
        """Hold new batches (the running one finishes); requests keep queueing until `resume`."""
        with self._condition:
            self._paused = True

    def resume(self) -> None:
        """Let batches start again after `pause`."""
        with self._condition:
            self._paused = False
            self._condition.notify_all()

    def submit(
        self, prompt_ids: list[int], params: SamplingParams, on_step: StepCallback | None = None
    ) -> Future[GenerationResult]:
        """Queue one generation; the future resolves when its batch finishes.

        ``on_step`` is called from the worker thread for every token (``row`` is always 0 for the caller).

        Raises:
            ValueError: If the prompt is empty, holds an id outside the vocabulary, or does not fit the context.
            RuntimeError: If the backend is not started.
        """
        if not prompt_ids:
            raise ValueError("the prompt is empty")
        vocab = int(self.model.config.vocab_size)
        bad = [t for t in prompt_ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"prompt token ids {bad[:5]} are outside the vocabulary (size {vocab})")
        if len(prompt_ids) + params.max_tokens > self.max_context:
            raise ValueError(
                f"the prompt has {len(prompt_ids)} tokens; with max_tokens={params.max_tokens} it exceeds the "
                f"model's context of {self.max_context} tokens"
            )
        job = _Job(list(prompt_ids), params, Future(), on_step, time.monotonic())
        with self._condition:
            if not self._running:
                raise RuntimeError("the backend is not started; call start() first")
            self._queue.append(job)
            self._condition.notify_all()
        return job.future

    def generate(self, prompt_ids: list[int], params: SamplingParams) -> GenerationResult:
        """Blocking convenience around `submit`."""
        return self.submit(prompt_ids, params).result()

    def load_state_dict(self, state_dict: Mapping[str, torch.Tensor], version: int | None = None) -> int:
        """Swap in new weights between batches; returns the new `model_version` (``version`` or the old one + 1)."""
        with self._weights_lock:
            self.model.load_state_dict(dict(state_dict), strict=True)
            self.model_version = self.model_version + 1 if version is None else version
            logger.info("backend now serves model version %d", self.model_version)
            return self.model_version

    def update_weights(self, model: torch.nn.Module, version: int | None = None) -> int:
        """Copy the weights of ``model`` (LoRA adapters merged) into the served model; returns the new version."""
        return self.load_state_dict(merged_state_dict(model), version)

    def _take_batch(self) -> list[_Job] | None:
        with self._condition:
            while self._running and (self._paused or not self._queue):
                self._condition.wait()
            if not self._running:
                return None
            # Wait while requests keep coming: a batch closes once the queue has been quiet for batch_wait_ms
            # (agents reach their LLM call spread over a few ms) or max_batch_wait_ms after its first request.
            hard_deadline = self._queue[0].queued_at + self.max_batch_wait_ms / 1000.0
            while self._running and len(self._queue) < self.max_batch_size:
                quiet_deadline = self._queue[-1].queued_at + self.batch_wait_ms / 1000.0
                remaining = min(hard_deadline, quiet_deadline) - time.monotonic()
                if remaining <= 0:
                    break
                self._condition.wait(remaining)
            if not self._running:
                return None
            count = min(len(self._queue), self.max_batch_size)
            return [self._queue.popleft() for _ in range(count)]

    def _work(self) -> None:
        while True:
            jobs = self._take_batch()
            if jobs is None:
                return
            jobs = [job for job in jobs if job.future.set_running_or_notify_cancel()]
            if not jobs:
                continue

            def relay(
                row: int,
                token: int,
                logprob: float,
                top: list[tuple[int, float]],
                finish: object,
                jobs: list[_Job] = jobs,
            ) -> None:
                callback = jobs[row].on_step
                if callback is None:
                    return
                try:
                    callback(0, token, logprob, top, finish)  # type: ignore[arg-type]
                except Exception:  # a listener that went away must not fail the other rows
                    logger.debug("dropping a token event for a listener that failed", exc_info=True)

            started = time.monotonic()
            try:
                with self._weights_lock:
                    version = self.model_version  # weights only change under this lock: the batch's version
                    results = generate_batch(
                        self.model,
                        [job.prompt_ids for job in jobs],
                        [job.params for job in jobs],
                        eos_token_id=self.tokenizer.eos_token_id,
                        pad_token_id=self.tokenizer.pad_token_id,
                        generator=self._generator,
                        on_step=relay if any(job.on_step for job in jobs) else None,
                    )
            except Exception as error:  # a failed batch must not kill the worker
                logger.exception("batched generation failed")
                for job in jobs:
                    job.future.set_exception(error)
                continue
            self.stats.busy_seconds += time.monotonic() - started
            self.stats.batches += 1
            self.stats.requests += len(jobs)
            self.stats.tokens += sum(len(r.token_ids) for r in results)
            self.stats.last_batch_size = len(jobs)
            self.stats.max_batch_size = max(self.stats.max_batch_size, len(jobs))
            self.stats.batch_sizes.append(len(jobs))
            for job, result in zip(jobs, results, strict=True):
                result.model_version = version
                job.future.set_result(result)
