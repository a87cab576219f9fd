"""Continuous batching: the running sequences share one left-padded KV cache; new ones join between decode steps.

`DecodeBatch` holds the rows being generated. `admit` prefills new sequences (one forward over their left-padded
prompts), samples their first token and merges their cache into the running one (the narrower side is padded on the
left, the attention mask hides the padding, position ids are kept per row). `step` runs one decode step for every
row; rows that finish leave the batch and the cache at once, and cache columns that only padding still uses are
dropped, so the cache is ``rows x longest live row`` wide. `evict` takes rows out (their cache dropped) so a caller
can keep the cache under a token bound; an evicted sequence keeps its tokens and resumes by re-prefilling them.

With LoRA adapters (a peft model, `lora` on), every forward names each row's adapter (peft's mixed batch), so rows of
different policies decode in one step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import DynamicCache, PreTrainedModel

from agentlightning_torch.serving._generate import FinishReason, GenerationResult, SamplingParams
from agentlightning_torch.serving._lora_weights import NO_LORA

__all__ = ["DecodeBatch", "RunningSequence", "TokenCallback"]

TokenCallback = Callable[[int, float, list[tuple[int, float]], FinishReason | None], None]
"""Called as ``(token_id, logprob, top_logprobs, finish_reason_or_None)`` for every token of one sequence."""


@dataclass(eq=False)
class RunningSequence:
    """One request being generated.

    Attributes:
        prompt_ids: The prompt.
        params: How it is sampled.
        stop_ids: Token ids that end it (eos ids, unless ``params.ignore_eos``, plus ``params.stop_token_ids``).
        max_length: Prompt plus generated tokens may not exceed this (the context length).
        on_token: Called for every generated token.
        result: What it generated so far.
        generator: Its own random generator when the request carries a seed.
        tag: Whatever the owner attaches (the backend keeps its request here).
        lora: The LoRA policy that generates it (``None``: the base model); rows of one step may differ.
    """

    prompt_ids: list[int]
    params: SamplingParams
    stop_ids: frozenset[int]
    max_length: int
    on_token: TokenCallback | None = None
    result: GenerationResult = field(default_factory=GenerationResult)
    generator: torch.Generator | None = None
    tag: Any = None
    lora: str | None = None

    def __post_init__(self) -> None:
        if self.params.seed is not None and self.generator is None:
            self.generator = torch.Generator().manual_seed(self.params.seed)

    @property
    def length(self) -> int:
        """Tokens in the sequence so far (prompt and generated)."""
        return len(self.prompt_ids) + len(self.result.token_ids)


def _layers(cache: DynamicCache) -> list[Any]:
    return list(cache.layers)  # pyright: ignore[reportUnknownMemberType, reportUnknownArgumentType]


def _sample(logits: torch.Tensor, params: Sequence[SamplingParams], uniforms: torch.Tensor) -> torch.Tensor:
    """One token per row by inverse-CDF sampling from temperature / top-p processed probabilities."""
    greedy_rows = [p.temperature == 0 for p in params]
    greedy = logits.argmax(dim=-1)
    if all(greedy_rows):
        return greedy
    temperatures = torch.tensor([max(p.temperature, 1e-6) for p in params], dtype=logits.dtype, device=logits.device)
    probs = torch.softmax(logits / temperatures[:, None], dim=-1)
    if all(p.top_p >= 1.0 for p in params):
        order: torch.Tensor | None = None
        sorted_probs = probs
    else:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        top_p = torch.tensor([p.top_p for p in params], dtype=logits.dtype, device=logits.device)
        # keep a token while the mass before it is below top_p (the most likely token is always kept)
        sorted_probs = sorted_probs.masked_fill(sorted_probs.cumsum(dim=-1) - sorted_probs >= top_p[:, None], 0.0)
    cumulative = sorted_probs.cumsum(dim=-1)
    threshold = uniforms.to(logits.dtype)[:, None] * cumulative[:, -1:]
    index = torch.searchsorted(cumulative, threshold).clamp(max=logits.shape[-1] - 1)
    sampled = index.squeeze(-1) if order is None else order.gather(-1, index).squeeze(-1)
    return torch.where(torch.tensor(greedy_rows, device=logits.device), greedy, sampled)


class DecodeBatch:
    """The running rows of a continuously batched generation loop (one thread drives it).

    Args:
        model: A causal LM in eval mode.
        pad_token_id: Fills the left padding of prompts.
        decode: Ids to text, used only for requests with stop strings.
        generator: Randomness for rows without their own seed.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        *,
        pad_token_id: int,
        decode: Callable[[Sequence[int]], str] | None = None,
        generator: torch.Generator | None = None,
    ) -> None:
        self.model = model
        self.lora = hasattr(model, "peft_config")
        """Whether the model serves LoRA adapters (set again by the owner when it wraps the model)."""
        self.pad_token_id = pad_token_id
        self.decode = decode
        self.generator = generator
        self.rows: list[RunningSequence] = []
        self._cache: DynamicCache | None = None
        self._mask: torch.Tensor | None = None  # (rows, width): 1 where the cache holds a real token
        self._positions = torch.zeros(0, dtype=torch.long)  # next position id of each row
        self._pending = torch.zeros(0, dtype=torch.long)  # last sampled token of each row, not yet in the cache

    @property
    def device(self) -> torch.device:
        """Where the model runs."""
        return next(self.model.parameters()).device

    @property
    def width(self) -> int:
        """Cache length in tokens (the longest live row, with everything right-aligned)."""
        return 0 if self._mask is None else int(self._mask.shape[1])

    @property
    def kv_tokens(self) -> int:
        """Token slots the cache holds now, padding included: ``rows x width``, read from the cache tensors."""
        if self._cache is None:
            return 0
        keys = _layers(self._cache)[0].keys
        return int(keys.shape[0] * keys.shape[-2])

    def kv_tokens_after_admitting(self, lengths: Sequence[int]) -> int:
        """Token slots the cache would hold one step after admitting sequences of these lengths."""
        width = max([self.width, *lengths])
        return (len(self.rows) + len(lengths)) * (width + 1)

    # ----- joining -------------------------------------------------------------------------------------------

    @torch.no_grad()
    def admit(self, sequences: Sequence[RunningSequence]) -> list[RunningSequence]:
        """Prefill ``sequences`` (prompt plus anything they already generated), sample one token each, join the batch.

        Returns:
            The sequences that finished on that first token (they do not join).
        """
        if not sequences:
            return []
        device = self.device
        inputs = [s.prompt_ids + s.result.token_ids for s in sequences]
        width = max(len(i) for i in inputs)
        ids = torch.full((len(inputs), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(inputs), width), dtype=torch.long)
        for row, tokens in enumerate(inputs):
            ids[row, width - len(tokens) :] = torch.tensor(tokens, dtype=torch.long)
            mask[row, width - len(tokens) :] = 1
        ids, mask = ids.to(device), mask.to(device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache()
        logits = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            **self._lora_names(sequences),
        ).logits[:, -1, :]
        tokens, keep, finished = self._advance(list(sequences), logits)
        if keep:
            self._merge(
                [sequences[i] for i in keep],
                cache,
                mask,
                positions[:, -1] + 1,
                tokens,
                torch.tensor(keep, dtype=torch.long, device=device),
            )
        return finished

    def _merge(
        self,
        sequences: list[RunningSequence],
        cache: DynamicCache,
        mask: torch.Tensor,
        positions: torch.Tensor,
        tokens: torch.Tensor,
        index: torch.Tensor,
    ) -> None:
        if len(index) < mask.shape[0]:
            cache.batch_select_indices(index)
            mask, positions, tokens = mask[index], positions[index], tokens[index]
        if self._cache is None or self._mask is None:
            self._cache, self._mask = cache, mask
            self._positions, self._pending, self.rows = positions, tokens, sequences
            self._trim()
            return
        old, new = self._mask.shape[1], mask.shape[1]
        width = max(old, new)
        for mine, theirs in zip(_layers(self._cache), _layers(cache), strict=True):
            mine.keys = torch.cat([_pad_left(mine.keys, width - old, 2), _pad_left(theirs.keys, width - new, 2)])
            mine.values = torch.cat([_pad_left(mine.values, width - old, 2), _pad_left(theirs.values, width - new, 2)])
        self._mask = torch.cat([_pad_left(self._mask, width - old, 1), _pad_left(mask, width - new, 1)])
        self._positions = torch.cat([self._positions, positions])
        self._pending = torch.cat([self._pending, tokens])
        self.rows = self.rows + sequences
        self._trim()

    # ----- decoding ------------------------------------------------------------------------------------------

    @torch.no_grad()
    def step(self) -> list[RunningSequence]:
        """One decode step for every row; returns the sequences that finished (they have left the batch)."""
        if not self.rows or self._cache is None or self._mask is None:
            return []
        mask = torch.cat([self._mask, self._mask.new_ones((len(self.rows), 1))], dim=-1)
        logits = self.model(
            input_ids=self._pending[:, None],
            attention_mask=mask,
            position_ids=self._positions[:, None],
            past_key_values=self._cache,
            use_cache=True,
            **self._lora_names(self.rows),
        ).logits[:, -1, :]
        self._mask, self._positions = mask, self._positions + 1
        tokens, keep, finished = self._advance(self.rows, logits)
        self._pending = tokens
        if len(keep) < len(self.rows):
            self._select(keep)
        return finished

    def _lora_names(self, rows: Sequence[RunningSequence]) -> dict[str, Any]:
        """The forward's per-row adapter names (peft's mixed batch); nothing for a model without adapters."""
        if not self.lora:
            return {}
        return {"adapter_names": [row.lora or NO_LORA for row in rows]}

    def evict(self, count: int) -> list[RunningSequence]:
        """Take the ``count`` most recently joined rows out (their cache is dropped); returns them to resume later."""
        count = min(count, len(self.rows))
        if count <= 0:
            return []
        # A row's cache holds its prompt and all but its last sampled token; resuming re-prefills prompt plus every
        # generated token and samples the next one, so nothing recorded is dropped or repeated.
        evicted = self.rows[len(self.rows) - count :]
        self._select(list(range(len(self.rows) - count)))
        return evicted

    def remove(self, sequences: Sequence[RunningSequence]) -> list[RunningSequence]:
        """Take these rows out (their cache dropped, nothing more generated); returns those that were rows."""
        gone = {id(s) for s in sequences}
        removed = [row for row in self.rows if id(row) in gone]
        if removed:
            self._select([i for i, row in enumerate(self.rows) if id(row) not in gone])
        return removed

    def clear(self) -> list[RunningSequence]:
        """Drop every row and the cache; returns the rows."""
        rows, self.rows = self.rows, []
        self._cache, self._mask = None, None
        self._positions = self._pending = torch.zeros(0, dtype=torch.long)
        return rows

    def _select(self, keep: list[int]) -> None:
        if not keep:
            self.clear()
            return
        assert self._cache is not None and self._mask is not None
        index = torch.tensor(keep, dtype=torch.long, device=self._mask.device)
        mask = self._mask[index]
        first = _first_used(mask)
        # one copy per tensor: the rows kept, without the leading columns only padding uses now
        for layer in _layers(self._cache):
            layer.keys = layer.keys[index, :, first:]
            layer.values = layer.values[index, :, first:]
        self._mask, self._positions, self._pending = mask[:, first:], self._positions[index], self._pending[index]
        self.rows = [self.rows[i] for i in keep]

    def _trim(self) -> None:
        """Drop leading cache columns that no row uses (only padding left there)."""
        assert self._cache is not None and self._mask is not None
        first = _first_used(self._mask)
        if first == 0:
            return
        for layer in _layers(self._cache):  # views: the next step's cache update copies them into new tensors anyway
            layer.keys = layer.keys[:, :, first:]
            layer.values = layer.values[:, :, first:]
        self._mask = self._mask[:, first:]

    def _advance(
        self, rows: list[RunningSequence], logits: torch.Tensor
    ) -> tuple[torch.Tensor, list[int], list[RunningSequence]]:
        """Sample a token for each row, record it, and tell which rows go on and which finished."""
        logits = logits.float()
        params = [s.params for s in rows]
        uniforms = torch.rand(len(rows), generator=self.generator)
        for position, sequence in enumerate(rows):
            if sequence.generator is not None:
                uniforms[position] = torch.rand(1, generator=sequence.generator)[0]
        tokens = _sample(logits, params, uniforms.to(logits.device))
        logprobs = torch.log_softmax(logits, dim=-1)
        chosen = logprobs.gather(-1, tokens[:, None]).squeeze(-1).tolist()
        most = max(p.top_logprobs for p in params)
        top_values, top_ids = logprobs.topk(most, dim=-1) if most else (None, None)
        token_list: list[int] = tokens.tolist()
        keep: list[int] = []
        finished: list[RunningSequence] = []
        for position, sequence in enumerate(rows):
            token, result = token_list[position], sequence.result
            result.token_ids.append(token)
            result.logprobs.append(chosen[position])
            top: list[tuple[int, float]] = []
            wanted = sequence.params.top_logprobs
            if wanted and top_ids is not None and top_values is not None:
                top = list(
                    zip(top_ids[position, :wanted].tolist(), top_values[position, :wanted].tolist(), strict=True)
                )
                result.top_logprobs.append(top)
            finish = self._finish(sequence, token)
            if finish is None:
                keep.append(position)
            else:
                result.finish_reason = finish
                finished.append(sequence)
            if sequence.on_token is not None:
                sequence.on_token(token, chosen[position], top, finish)
        return tokens, keep, finished

    def _finish(self, sequence: RunningSequence, token: int) -> FinishReason | None:
        result, params = sequence.result, sequence.params
        if token in sequence.stop_ids:
            result.stop_reason = token if token in params.stop_token_ids else None
            return "stop"
        if params.stop and self.decode is not None:
            longest = max(len(s) for s in params.stop)
            tail = self.decode(result.token_ids[-(longest + 4) :])
            for stop in params.stop:
                if stop in tail:
                    result.stop_reason = stop
                    return "stop"
        if len(result.token_ids) >= params.max_tokens or sequence.length >= sequence.max_length:
            return "length"
        return None


def _first_used(mask: torch.Tensor) -> int:
    """The first cache column that some row uses (rows are right-aligned: each row's first real token)."""
    used = mask.any(dim=0).nonzero()
    return int(used[0, 0]) if len(used) else int(mask.shape[1])


def _pad_left(tensor: torch.Tensor, count: int, dim: int) -> torch.Tensor:
    if count <= 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = count
    return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)
