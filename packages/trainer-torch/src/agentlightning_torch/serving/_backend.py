"""The local inference backend: any Hugging Face causal LM behind a request queue, with continuous batching.

A worker thread drives one `DecodeBatch`. Between two decode steps it admits waiting requests (they join the
running batch at the next step), so a request never waits for a batch to end; rows leave as soon as they finish.
Two bounds keep memory flat: ``max_batch_size`` concurrent sequences and ``max_kv_tokens`` token slots in the KV
cache (rows x longest row, padding included). When the running rows would outgrow the cache bound, the most recently
joined rows are evicted and resume later by re-prefilling what they already generated (vLLM's recompute preemption).

Weights are swapped only between sequences: `load_state_dict` stops admitting new requests, lets the in-flight ones
finish on the old weights, swaps, and admits again. Every `GenerationResult` carries the ``model_version`` that
generated all of its tokens. (The trainer pauses and drains the LLM proxy before a swap, so normally nothing is in
flight then.)

LoRA adapters (one per policy) are served beside the base model: `load_lora` adds or replaces one (swapped the
same way), a request names its adapter (`submit`'s ``adapter``; the OpenAI endpoints take it from the request's
``model``, as vLLM does), and rows of different adapters decode together in one step. Each adapter has its own
version (`lora_versions`), which its results carry.
"""

from __future__ import annotations

import copy
import functools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import GenerationConfig, PreTrainedModel
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from agentlightning_torch.models._chat import ChatTemplate, HFChatTemplate
from agentlightning_torch.models._loading import LoadedModel, eos_token_ids, load_model
from agentlightning_torch.serving._backend_stats import BackendStats
from agentlightning_torch.serving._decode_batch import DecodeBatch, RunningSequence, TokenCallback
from agentlightning_torch.serving._generate import GenerationResult, SamplingParams, StepCallback
from agentlightning_torch.serving._lora_weights import NO_LORA, install_lora, lora_weights, merged_state_dict

__all__ = ["BackendStats", "LocalBackend", "RequestCancelled", "merged_state_dict"]

logger = logging.getLogger(__name__)


class RequestCancelled(RuntimeError):
    """A request was cancelled (`LocalBackend.cancel`) while it was generating."""


@dataclass
class _Job:
    prompt_ids: list[int]
    params: SamplingParams
    future: Future[GenerationResult]
    on_step: StepCallback | None
    queued_at: float
    lora: str | None = None


def _forward_token(on_step: StepCallback, token: int, logprob: float, top: list[tuple[int, float]], end: Any) -> None:
    try:
        on_step(0, token, logprob, top, end)
    except Exception:  # a listener that went away must not fail the other rows
        logger.debug("dropping a token event for a listener that failed", exc_info=True)


class LocalBackend:
    """A causal LM serving generation requests with continuous batching, on CPU or one GPU.

    Args:
        model: A model folder or hub id (loaded with `load_model`), a `LoadedModel`, or a model instance
            (deep-copied so training the original never races with generation; push new weights with
            `update_weights`).
        tokenizer: Required with a model instance: a transformers tokenizer with a chat template.
        template: Chat template for chat requests; defaults to `HFChatTemplate` over the tokenizer.
        device: Torch device for generation.
        dtype: Weight dtype when loading from a folder (see `load_model`).
        max_batch_size: Most sequences decoded together.
        max_kv_tokens: Most token slots the KV cache may hold (rows x longest row); ``None`` means
            ``max_batch_size x`` the context length. A request whose prompt plus ``max_tokens`` exceeds it is refused.
        batch_wait_ms: When idle, generation starts once no new request has arrived for this long (ms), so a burst
            is prefilled together; requests arriving while it runs join at the next step without waiting.
        max_batch_wait_ms: ...or this long after the first request, whichever comes first.
        model_name: Name reported by the OpenAI endpoints (default: the folder or hub id, or ``local``).
        num_threads: ``torch.set_num_threads`` applied at start (process-wide); ``None`` leaves it alone.
        seed: Seeds sampling of requests that carry no seed of their own.
        tool_parser: Tool-call parser name for the default template (``None``: guessed from the chat template).
        reasoning: Split ``<think>`` blocks into ``reasoning_content`` (default template only).
        generation_config: Eos ids come from it (default: the model's own ``generation_config``).

    Raises:
        ValueError: If a model instance comes without a tokenizer, or a size is not positive.
    """

    def __init__(
        self,
        model: str | Path | PreTrainedModel | LoadedModel,
        tokenizer: PreTrainedTokenizerBase | None = None,
        template: ChatTemplate | None = None,
        *,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | None = None,
        max_batch_size: int = 128,
        max_kv_tokens: int | None = None,
        batch_wait_ms: float = 5.0,
        max_batch_wait_ms: float = 50.0,
        model_name: str | None = None,
        num_threads: int | None = 1,
        seed: int = 0,
        tool_parser: str | None = None,
        reasoning: bool = False,
        generation_config: GenerationConfig | None = None,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if batch_wait_ms < 0:
            raise ValueError(f"batch_wait_ms must be >= 0, got {batch_wait_ms}")
        if max_kv_tokens is not None and max_kv_tokens < 2:
            raise ValueError(f"max_kv_tokens must be >= 2, got {max_kv_tokens}")
        source: str | None = None
        if isinstance(model, (str, Path)):
            source = str(model)
            folder = Path(model)
            model = load_model(folder if folder.exists() else source, device=device, dtype=dtype)
        if isinstance(model, LoadedModel):
            self.model: PreTrainedModel = model.model if source else copy.deepcopy(model.model)
            tokenizer = tokenizer or model.tokenizer
            generation_config = generation_config or model.generation_config
            source = source or model.source
        elif source is not None:
            self.model = model
        else:
            if tokenizer is None:
                raise ValueError("a tokenizer is required when the backend is given a model instance")
            self.model = copy.deepcopy(model)
        torch.nn.Module.to(self.model, device)
        self.model.eval()
        # read once: a transformers config's attribute access costs microseconds, and every request checks both
        self._max_context = int(getattr(self.model.config, "max_position_embeddings", 2048))
        self._vocab_size = int(self.model.config.vocab_size)
        assert tokenizer is not None
        self.tokenizer: PreTrainedTokenizerBase = tokenizer
        self.template: ChatTemplate = template or HFChatTemplate(
            tokenizer, tool_parser=tool_parser, reasoning=reasoning
        )
        self.eos_token_ids = eos_token_ids(tokenizer, generation_config or self.model.generation_config)
        pad: Any = tokenizer.pad_token_id
        self.pad_token_id = int(pad) if isinstance(pad, int) else min(self.eos_token_ids, default=0)
        self.device = torch.device(device)
        self.max_batch_size = max_batch_size
        self.max_kv_tokens = max_kv_tokens or max_batch_size * self.max_context
        self.batch_wait_ms = batch_wait_ms
        self.max_batch_wait_ms = max(max_batch_wait_ms, batch_wait_ms)
        self.model_name = model_name or source or "local"
        self.num_threads = num_threads
        self.stats = BackendStats()
        self.model_version = 0
        self.lora_versions: dict[str, int] = {}
        """The LoRA adapters served, each with the version of its weights (`load_lora`)."""
        self._batch: DecodeBatch | None = None
        self._generator = torch.Generator().manual_seed(seed)
        self._queue: deque[_Job] = deque()
        self._resumed: deque[RunningSequence] = deque()  # evicted sequences, admitted before new requests
        self._inflight = 0  # sequences admitted and not finished (the worker's count)
        self._swaps_waiting = 0
        self._cancelled: set[Future[GenerationResult]] = set()  # requests whose client left: dropped by the worker
        self._abort_all = False  # `abort`: the worker drops every request it holds before its next step
        self._condition = threading.Condition()
        self._weights_lock = threading.Lock()
        self._paused = False
        self._running = False
        self._worker: threading.Thread | None = None

    @property
    def max_context(self) -> int:
        """The model's context length in tokens."""
        return self._max_context

    @property
    def queue_depth(self) -> int:
        """Requests waiting to join the batch."""
        with self._condition:
            return len(self._queue)

    @property
    def running(self) -> int:
        """Sequences admitted and not yet finished (evicted ones waiting to resume included)."""
        with self._condition:
            return self._inflight

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
        """Stop the worker; queued and running requests fail with `RuntimeError`."""
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
        """Admit no new requests (running sequences finish); requests keep queueing until `resume`."""
        with self._condition:
            self._paused = True

    def resume(self) -> None:
        """Admit requests again after `pause`."""
        with self._condition:
            self._paused = False
            self._condition.notify_all()

    def submit(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        on_step: StepCallback | None = None,
        lora: str | None = None,
    ) -> Future[GenerationResult]:
        """Queue one generation; it joins the running batch at the next decode step (bounds permitting).

        ``on_step`` is called from the worker thread for every token (``row`` is always 0 for the caller).
        ``lora`` names the LoRA policy that generates it (``None``: the base model).

        Raises:
            ValueError: If the prompt is empty, holds an id outside the vocabulary, or with ``max_tokens`` does not
                fit the context or the KV-cache bound, or the adapter is not served.
            RuntimeError: If the backend is not started.
        """
        if not prompt_ids:
            raise ValueError("the prompt is empty")
        vocab = self._vocab_size
        bad = [t for t in prompt_ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"prompt token ids {bad[:5]} are outside the vocabulary (size {vocab})")
        if len(prompt_ids) + params.max_tokens > self.max_context:
            raise ValueError(
                f"the prompt has {len(prompt_ids)} tokens; with max_tokens={params.max_tokens} it exceeds the "
                f"model's context of {self.max_context} tokens"
            )
        if len(prompt_ids) + params.max_tokens >= self.max_kv_tokens:
            raise ValueError(
                f"the prompt has {len(prompt_ids)} tokens; with max_tokens={params.max_tokens} it needs more than the "
                f"backend's KV-cache bound of {self.max_kv_tokens} tokens"
            )
        if lora is not None and lora not in self.lora_versions:
            served = sorted(self.lora_versions)
            raise ValueError(f"no LoRA adapter {lora!r} is served (served: {served}); load it with load_lora")
        job = _Job(list(prompt_ids), params, Future(), on_step, time.monotonic(), lora)
        with self._condition:
            if not self._running:
                raise RuntimeError("the backend is not started; call start() first")
            self._queue.append(job)
            self._condition.notify_all()
        return job.future

    def cancel(self, futures: Iterable[Future[GenerationResult]]) -> None:
        """Stop generating these requests (their client left, or their rollout was cancelled).

        Queued ones never start; running ones leave the batch before the next decode step and their futures fail
        with `RequestCancelled`, so `running` drops without waiting for them to finish.
        """
        with self._condition:
            self._cancelled.update(f for f in futures if not f.done())
            self._condition.notify_all()

    def abort(self) -> None:
        """Stop every request the backend holds, queued or generating: before its next decode step the worker drops
        them all (a request submitted meanwhile too), their futures fail with `RequestCancelled` (queued ones are
        cancelled) and `running` drops to 0; requests submitted after that are served as usual."""
        with self._condition:
            self._abort_all = True
            self._condition.notify_all()

    def generate(self, prompt_ids: list[int], params: SamplingParams) -> GenerationResult:
        """Blocking convenience around `submit`."""
        return self.submit(prompt_ids, params).result()

    def load_state_dict(self, state_dict: Mapping[str, torch.Tensor], version: int | None = None) -> int:
        """Swap in new weights; returns the new `model_version` (``version`` or the old one + 1).

        New requests are held while the sequences in flight finish on the old weights (each result is labelled
        with the version that generated it); then the weights change and held requests run on the new ones.

        Raises:
            RuntimeError: If the state dict does not match the model (nothing changes then).
        """
        if self.lora_versions:
            raise RuntimeError(
                "this backend serves LoRA adapters over a frozen base model: update an adapter with load_lora"
            )

        def swap() -> None:
            self.model.load_state_dict(dict(state_dict), strict=True)
            self.model_version = self.model_version + 1 if version is None else version

        self._swap(swap)
        logger.info("backend now serves model version %d", self.model_version)
        return self.model_version

    def load_lora(self, name: str, source: Any, *, config: Any = None, version: int | None = None) -> int:
        """Serve LoRA adapter ``name`` (added, or its weights replaced); returns its new version.

        Swapped as `load_state_dict` swaps: sequences in flight finish on the old weights first.

        Args:
            name: The adapter's name (requests name it as their ``model``).
            source: A peft model holding adapter ``name`` (the trainer's copy), a ``save_pretrained`` folder, or a
                state dict (with ``config``).
            config: The ``LoraConfig`` of a state dict.
            version: The adapter's new version (default: its old one + 1, or 0 for a new adapter).

        Raises:
            ValueError: The weights do not fit (another rank or targets than the served adapter); nothing changes.
        """
        if name == NO_LORA or not name:
            raise ValueError(f"{name!r} cannot name an adapter")
        weights = lora_weights(source, name, config)

        def swap() -> None:
            self.model = install_lora(self.model, name, weights)
            if self._batch is not None:
                self._batch.model, self._batch.lora = self.model, True
            old = self.lora_versions.get(name)
            self.lora_versions[name] = version if version is not None else (0 if old is None else old + 1)

        self._swap(swap)
        logger.info("backend now serves adapter %s version %d", name, self.lora_versions[name])
        return self.lora_versions[name]

    def _swap(self, change: Callable[[], None]) -> None:
        """Run ``change`` once no sequence is in flight, holding new ones back meanwhile."""
        with self._condition:
            self._swaps_waiting += 1
            try:
                while self._running and self._worker is not None and self._inflight:
                    self._condition.wait()
                with self._weights_lock:
                    change()
            finally:
                self._swaps_waiting -= 1
                self._condition.notify_all()

    def update_weights(self, model: torch.nn.Module, version: int | None = None) -> int:
        """Copy the weights of ``model`` (LoRA adapters merged) into the served model; returns the new version."""
        return self.load_state_dict(merged_state_dict(model), version)

    # ----- the worker ----------------------------------------------------------------------------------------

    def _sequence(self, job: _Job) -> RunningSequence:
        params = job.params
        stop_ids = frozenset(params.stop_token_ids) | (frozenset() if params.ignore_eos else self.eos_token_ids)
        callback: TokenCallback | None = None
        if job.on_step is not None:
            callback = functools.partial(_forward_token, job.on_step)
        sequence = RunningSequence(job.prompt_ids, params, stop_ids, self.max_context, callback, tag=job, lora=job.lora)
        lora = job.lora
        sequence.result.model_version = self.model_version if lora is None else self.lora_versions[lora]
        return sequence

    def _admissible(self, batch: DecodeBatch) -> list[RunningSequence]:
        """Sequences that join now: evicted ones first, then queued requests (unless paused or a swap waits)."""
        taken: list[RunningSequence] = []
        lengths: list[int] = []

        def fits(length: int) -> bool:
            if len(batch.rows) + len(taken) >= self.max_batch_size:
                return False
            return batch.kv_tokens_after_admitting([*lengths, length]) <= self.max_kv_tokens

        while self._resumed and fits(self._resumed[0].length):
            taken.append(self._resumed.popleft())
            lengths.append(taken[-1].length)
        if self._paused or self._swaps_waiting or self._resumed:
            return taken
        while self._queue and fits(len(self._queue[0].prompt_ids)):
            job = self._queue.popleft()
            if job.future.set_running_or_notify_cancel():
                taken.append(self._sequence(job))
                lengths.append(len(job.prompt_ids))
        return taken

    def _wait_for_work(self, batch: DecodeBatch) -> list[RunningSequence] | None:
        """Under the condition: block until there is something to do; ``None`` when stopping."""
        with self._condition:
            while True:
                if self._cancelled or self._abort_all:
                    self._drop_cancelled(batch)
                self._inflight = len(batch.rows) + len(self._resumed)
                if not self._running:
                    return None
                admitting = bool(self._queue) and not (self._paused or self._swaps_waiting)
                if batch.rows or self._resumed or admitting:
                    break
                self._condition.notify_all()  # a swap may be waiting for the batch to drain
                self._condition.wait()
            if not batch.rows and not self._resumed:
                self._gather_burst()
            taken = self._admissible(batch)
            self._inflight += len(taken)
            return taken

    def _drop_cancelled(self, batch: DecodeBatch) -> None:
        """Under the condition, in the worker: remove cancelled requests from the queue, the evicted and the batch."""
        cancelled, self._cancelled = self._cancelled, set()
        if self._abort_all:
            self._abort_all = False
            held = [job.future for job in self._queue] + [s.tag.future for s in [*self._resumed, *batch.rows]]
            cancelled.update(held)
        self._queue = deque(job for job in self._queue if job.future not in cancelled or not job.future.cancel())
        dropped = [s for s in self._resumed if s.tag.future in cancelled]
        self._resumed = deque(s for s in self._resumed if s.tag.future not in cancelled)
        dropped += batch.remove([row for row in batch.rows if row.tag.future in cancelled])
        for sequence in dropped:
            sequence.tag.future.set_exception(RequestCancelled("the request was cancelled before it finished"))

    def _gather_burst(self) -> None:
        """When idle, wait while requests keep coming (agents reach their call spread over a few ms)."""
        hard_deadline = self._queue[0].queued_at + self.max_batch_wait_ms / 1000.0
        while self._running and len(self._queue) < self.max_batch_size:
            quiet_deadline = self._queue[-1].queued_at + self.batch_wait_ms / 1000.0
            remaining = min(hard_deadline, quiet_deadline) - time.monotonic()
            if remaining <= 0:
                break
            self._condition.wait(remaining)

    def _work(self) -> None:
        batch = DecodeBatch(
            self.model, pad_token_id=self.pad_token_id, decode=self.template.decode, generator=self._generator
        )
        self._batch = batch
        while True:
            taken = self._wait_for_work(batch)
            if taken is None:
                break
            started, started_cpu = time.monotonic(), time.thread_time()
            finished: list[RunningSequence] = []
            try:
                with self._weights_lock:
                    if taken:
                        finished += batch.admit(taken)
                        self.stats.batches += 1
                        self.stats.last_batch_size = len(taken)
                        self.stats.batch_sizes.append(len(taken))
                    self._note_cache(batch)
                    self._keep_under_bound(batch)
                    if batch.rows:
                        self.stats.steps += 1
                        self.stats.row_steps += len(batch.rows)
                        self.stats.max_batch_size = max(self.stats.max_batch_size, len(batch.rows))
                        finished += batch.step()
                    self._note_cache(batch)
            except Exception as error:  # a failed step must not kill the worker
                logger.exception("generation failed")
                failed = [*taken, *batch.clear()]
                self._recount(batch)
                for sequence in {id(s): s for s in failed}.values():
                    sequence.tag.future.set_exception(error)
                continue
            finally:
                self.stats.busy_seconds += time.monotonic() - started
                self.stats.cpu_seconds += time.thread_time() - started_cpu
            if finished:
                self._recount(batch)  # `running` drops before any caller sees its answer
            for sequence in finished:
                self.stats.requests += 1
                self.stats.tokens += len(sequence.result.token_ids)
                sequence.tag.future.set_result(sequence.result)
        stopped = RuntimeError("the backend was stopped")
        for sequence in [*batch.clear(), *self._resumed]:
            sequence.tag.future.set_exception(stopped)
        self._resumed.clear()

    def _recount(self, batch: DecodeBatch) -> None:
        """In the worker: the sequences still admitted (the batch's rows and the evicted ones waiting to resume)."""
        with self._condition:
            self._inflight = len(batch.rows) + len(self._resumed)
            self._condition.notify_all()  # a swap may be waiting for the count to reach 0

    def _keep_under_bound(self, batch: DecodeBatch) -> None:
        """Evict the newest rows while the next step would take the cache past ``max_kv_tokens``."""
        evicted: list[RunningSequence] = []
        while len(batch.rows) > 1 and len(batch.rows) * (batch.width + 1) > self.max_kv_tokens:
            evicted += batch.evict(1)
        if evicted:
            self.stats.preemptions += len(evicted)
            with self._condition:
                self._resumed.extendleft(reversed(evicted))

    def _note_cache(self, batch: DecodeBatch) -> None:
        self.stats.kv_tokens = batch.kv_tokens
        self.stats.peak_kv_tokens = max(self.stats.peak_kv_tokens, self.stats.kv_tokens)
