"""Batched sampling with a KV cache: many prompts of different lengths generated together in one forward loop.

Prompts are left-padded; the attention mask hides the padding and position ids restart at 0 for each row, so a
row's tokens and log-probs do not depend on what else is in the batch (up to floating-point noise). Rows that
finish are dropped from the batch and the cache, so short answers do not pay for long ones.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch
from transformers import DynamicCache, PreTrainedModel

__all__ = ["FinishReason", "GenerationResult", "SamplingParams", "StepCallback", "generate_batch"]

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class SamplingParams:
    """How one request is sampled.

    Attributes:
        temperature: 0 means greedy.
        top_p: Nucleus sampling mass (1.0 keeps every token).
        max_tokens: Most tokens to generate.
        seed: Per-request seed (reproducible samples); ``None`` draws from the backend's generator.
        top_logprobs: How many most likely alternatives to report per position (0 for none).
        stop: Strings that end the response once generated (the local backend; `generate_batch` ignores them).
        stop_token_ids: Token ids that end the response besides the eos ids.
        ignore_eos: Keep generating past eos ids (benchmarks; ``stop_token_ids`` still apply).
    """

    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 32
    seed: int | None = None
    top_logprobs: int = 0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if not 0 <= self.top_logprobs <= 20:
            raise ValueError(f"top_logprobs must be between 0 and 20, got {self.top_logprobs}")
        if any(not s for s in self.stop):
            raise ValueError("stop strings must not be empty")


@dataclass
class GenerationResult:
    """The tokens one prompt produced.

    Attributes:
        token_ids: Generated ids (the eos included when the row stopped on it).
        logprobs: Log-probability of each generated token under the model (temperature 1, no top-p), which is
            what the trainer recomputes; the sampling distribution itself may differ.
        top_logprobs: Per position, the ``top_logprobs`` most likely ``(token_id, logprob)`` pairs.
        finish_reason: ``stop`` on eos (or a stop string / stop token), ``length`` at ``max_tokens`` or the context.
        stop_reason: The stop string or stop token id that ended it (``None`` for eos or length).
        model_version: Version of the weights that generated every token of it (set by `LocalBackend`; ``None``
            elsewhere).
    """

    token_ids: list[int] = field(default_factory=lambda: [])
    logprobs: list[float] = field(default_factory=lambda: [])
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=lambda: [])
    finish_reason: FinishReason = "length"
    stop_reason: str | int | None = None
    model_version: int | None = None


StepCallback = Callable[[int, int, float, list[tuple[int, float]], FinishReason | None], None]
"""Called as ``(row, token_id, logprob, top_logprobs, finish_reason_or_None)`` for every generated token."""


def _sample(logits: torch.Tensor, params: Sequence[SamplingParams], uniforms: torch.Tensor) -> torch.Tensor:
    """One token per row by inverse-CDF sampling from temperature/top-p processed probabilities."""
    temperatures = torch.tensor([max(p.temperature, 1e-6) for p in params], dtype=logits.dtype, device=logits.device)
    probs = torch.softmax(logits / temperatures[:, None], dim=-1)
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    cumulative = sorted_probs.cumsum(dim=-1)
    top_p = torch.tensor([p.top_p for p in params], dtype=logits.dtype, device=logits.device)
    # keep a token while the mass before it is below top_p (the first token is always kept)
    sorted_probs = sorted_probs.masked_fill(cumulative - sorted_probs >= top_p[:, None], 0.0)
    cumulative = sorted_probs.cumsum(dim=-1)
    threshold = uniforms.to(logits.dtype)[:, None] * cumulative[:, -1:]
    index = torch.searchsorted(cumulative, threshold).clamp(max=logits.shape[-1] - 1)
    sampled = order.gather(-1, index).squeeze(-1)
    greedy = torch.tensor([p.temperature == 0 for p in params], device=logits.device)
    return torch.where(greedy, logits.argmax(dim=-1), sampled)


@torch.no_grad()
def generate_batch(
    model: PreTrainedModel,
    prompts: Sequence[Sequence[int]],
    params: Sequence[SamplingParams],
    *,
    eos_token_id: int,
    pad_token_id: int,
    generator: torch.Generator | None = None,
    on_step: StepCallback | None = None,
) -> list[GenerationResult]:
    """Generate a continuation of every prompt, all rows in one batched KV-cache loop.

    Args:
        model: A causal LM (eval mode).
        prompts: Prompt token ids, one list per row (each non-empty).
        params: Sampling parameters, one per row.
        eos_token_id: Stops a row.
        pad_token_id: Used for left padding.
        generator: Source of randomness for rows without their own seed.
        on_step: Called for every token as it is generated (for streaming).

    Raises:
        ValueError: If the lists differ in length, a prompt is empty, or prompt plus ``max_tokens`` exceeds the
            model's context length.
    """
    if len(prompts) != len(params):
        raise ValueError(f"{len(prompts)} prompts but {len(params)} sampling parameter sets")
    if not prompts:
        return []
    device = next(model.parameters()).device
    _check_prompts(prompts, params, int(getattr(model.config, "max_position_embeddings", 1 << 30)))
    input_ids, attention = _left_padded(prompts, pad_token_id, device)
    step_positions = (attention.cumsum(-1) - 1).clamp(min=0)
    row_generators = [torch.Generator().manual_seed(p.seed) if p.seed is not None else None for p in params]
    results = [GenerationResult() for _ in prompts]
    active = list(range(len(prompts)))  # original row index of each batch position
    cache = DynamicCache()
    step_input = input_ids
    while active:
        output = model(
            input_ids=step_input,
            attention_mask=attention,
            position_ids=step_positions,
            past_key_values=cache,
            use_cache=True,
        )
        logits = output.logits[:, -1, :].float()
        uniforms = _uniforms(active, row_generators, generator)
        tokens = _sample(logits, [params[r] for r in active], uniforms.to(device))
        keep = _record_step(torch.log_softmax(logits, dim=-1), tokens, active, params, results, eos_token_id, on_step)
        if not keep:
            break
        if len(keep) < len(active):
            index = torch.tensor(keep, dtype=torch.long, device=device)
            cache.batch_select_indices(index)
            tokens, attention, step_positions = tokens[index], attention[index], step_positions[index]
            active = [active[p] for p in keep]
        attention = torch.cat([attention, attention.new_ones((len(active), 1))], dim=-1)
        step_positions = step_positions[:, -1:] + 1
        step_input = tokens[:, None]
    return results


def _check_prompts(prompts: Sequence[Sequence[int]], params: Sequence[SamplingParams], max_positions: int) -> None:
    for row, (prompt, param) in enumerate(zip(prompts, params, strict=True)):
        if not prompt:
            raise ValueError(f"prompt {row} is empty")
        if len(prompt) + param.max_tokens > max_positions:
            raise ValueError(
                f"prompt {row} has {len(prompt)} tokens; with max_tokens={param.max_tokens} it exceeds the "
                f"model's context of {max_positions} tokens"
            )


def _left_padded(
    prompts: Sequence[Sequence[int]], pad_token_id: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Input ids and attention mask of the prompts, left-padded to the longest."""
    rows, width = len(prompts), max(len(p) for p in prompts)
    input_ids = torch.full((rows, width), pad_token_id, dtype=torch.long)
    attention = torch.zeros((rows, width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        input_ids[row, width - len(prompt) :] = torch.tensor(list(prompt), dtype=torch.long)
        attention[row, width - len(prompt) :] = 1
    return input_ids.to(device), attention.to(device)


def _uniforms(
    active: list[int], row_generators: list[torch.Generator | None], generator: torch.Generator | None
) -> torch.Tensor:
    """One uniform draw per active row: from the row's own seeded generator when it has one (same order as before)."""
    uniforms = torch.rand(len(active), generator=generator)
    for position, row in enumerate(active):
        row_generator = row_generators[row]
        if row_generator is not None:
            uniforms[position] = torch.rand(1, generator=row_generator)[0]
    return uniforms


def _record_step(
    logprobs: torch.Tensor,
    tokens: torch.Tensor,
    active: list[int],
    params: Sequence[SamplingParams],
    results: list[GenerationResult],
    eos_token_id: int,
    on_step: StepCallback | None,
) -> list[int]:
    """Append this step's token (log-prob, top log-probs) to every active row; returns the positions still going."""
    chosen = logprobs.gather(-1, tokens[:, None]).squeeze(-1)
    most = max(params[r].top_logprobs for r in active)
    top_values, top_ids = logprobs.topk(most, dim=-1) if most else (None, None)
    token_list, chosen_list = tokens.tolist(), chosen.tolist()
    keep: list[int] = []
    for position, row in enumerate(active):
        result, token = results[row], token_list[position]
        result.token_ids.append(token)
        result.logprobs.append(chosen_list[position])
        top: list[tuple[int, float]] = []
        wanted = params[row].top_logprobs
        if wanted and top_ids is not None and top_values is not None:
            top = list(zip(top_ids[position, :wanted].tolist(), top_values[position, :wanted].tolist(), strict=True))
            result.top_logprobs.append(top)
        finish: FinishReason | None = None
        if token == eos_token_id:
            finish = "stop"
        elif len(result.token_ids) >= params[row].max_tokens:
            finish = "length"
        if finish is not None:
            result.finish_reason = finish
        else:
            keep.append(position)
        if on_step is not None:
            on_step(row, token, chosen_list[position], top, finish)
    return keep
