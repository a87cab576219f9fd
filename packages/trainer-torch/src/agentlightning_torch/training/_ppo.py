"""The policy update: clipped PPO surrogate (GRPO when advantages are group-normalised) on a `TrainingBatch`.

Every sample is a prompt plus a response; the loss covers response tokens whose mask is 1, weighted by the
sample's advantage. Log-probs are recomputed for the current weights and compared with the behaviour log-probs
the backend recorded (or, if a sample has none, with the weights before the update). With ``is_correction`` (samples
up to k versions old, `LoopConfig.max_staleness`), the ratio is taken against the weights before the update and each
token is weighted by its truncated importance weight from the behaviour policy (`_offpolicy`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from agentlightning import TrainingBatch, TrainingSample
from agentlightning_torch.models._lora import LoRASettings, apply_lora, is_lora
from agentlightning_torch.training._offpolicy import check_behaviour_logprobs, truncated_importance_weights

__all__ = [
    "PPOConfig",
    "activation_bytes_per_token",
    "fit_micro_batches",
    "make_optimizer",
    "plan_micro_batches",
    "ppo_update",
    "prepare_policy",
    "response_logprobs",
]

logger = logging.getLogger(__name__)


class PPOConfig(BaseModel):
    """Settings of `ppo_update` (defaults: the measured CPU recipe).

    Attributes:
        lr: AdamW learning rate (1e-3 broke the tiny model's copying; 3e-4 works).
        betas: AdamW betas.
        weight_decay: AdamW weight decay.
        clip_ratio: PPO clip range epsilon.
        grad_clip: Max global gradient norm.
        kl_coef: Weight of the k3 KL penalty to a reference model (0 disables it; >0 needs ``ref_model``).
        entropy_coef: Weight of an entropy bonus (the loss minus ``entropy_coef`` times the mean token entropy): keeps
            the policy from collapsing onto one answer early (0 disables it; ``entropy`` is reported either way).
        loss_agg: ``token-mean`` over all trained tokens of a mini-batch, or ``seq-mean-token-mean``.
        micro_batch_size: Most samples per forward/backward pass (gradients accumulate across micro-batches).
        micro_batch_tokens: Most padded tokens (rows x longest row) per forward/backward pass; a sample longer than
            this goes alone. Bounds activation memory whatever the mix of short and long samples.
        activation_memory_gib: Activation memory one forward/backward pass may use, estimated from the model's
            config (`activation_bytes_per_token`); lowers ``micro_batch_tokens`` for a large model (a 135M-parameter
            model: ~1.8 MB per token, so ~2,300 tokens at 4 GiB, where 16,384 needed ~30 GB). ``None``: 4 GiB on a
            CPU, a quarter of the GPU's memory on CUDA.
        mini_batch_size: Samples per optimizer step; ``None`` makes one step per epoch over the whole batch.
        epochs: Passes over the batch.
        lora: Train LoRA adapters instead of all weights (applied by `prepare_policy`).
        gradient_checkpointing: Recompute activations in the backward pass (less memory, ~30% more compute;
            applied by `prepare_policy`).
        bf16: Run forward passes under bfloat16 autocast on CUDA (ignored on CPU).
        num_threads: ``torch.set_num_threads`` during the update; ``None`` leaves it alone. On a busy 2-core
            machine two threads were measured 25x slower than one.
        is_correction: Off-policy correction by truncated importance sampling: the PPO ratio is taken against the
            weights before the update (recomputed), and each token's surrogate is weighted by
            ``min(pi_before / pi_behaviour, is_cap)`` from its recorded behaviour log-probs (a sample without them
            is refused). ``None``: the trainer decides (on when its `LoopConfig.max_staleness` is above 0); off:
            the ratio is taken against the behaviour log-probs directly.
        is_cap: Where the importance weight is truncated (``is_correction`` only).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    lr: float = Field(default=3e-4, gt=0)
    betas: tuple[float, float] = (0.9, 0.99)
    weight_decay: float = Field(default=0.0, ge=0)
    clip_ratio: float = Field(default=0.2, gt=0)
    grad_clip: float = Field(default=1.0, gt=0)
    kl_coef: float = Field(default=0.0, ge=0)
    entropy_coef: float = Field(default=0.0, ge=0)
    loss_agg: Literal["token-mean", "seq-mean-token-mean"] = "token-mean"
    micro_batch_size: int = Field(default=64, ge=1)
    micro_batch_tokens: int = Field(default=16384, ge=1)
    activation_memory_gib: float | None = Field(default=None, gt=0)
    mini_batch_size: int | None = Field(default=None, ge=1)
    epochs: int = Field(default=1, ge=1)
    lora: LoRASettings | None = None
    gradient_checkpointing: bool = False
    bf16: bool = True
    num_threads: int | None = Field(default=1, ge=1)
    is_correction: bool | None = None
    is_cap: float = Field(default=2.0, ge=1.0)


def prepare_policy(model: torch.nn.Module, config: PPOConfig) -> torch.nn.Module:
    """The module to train: ``model`` itself, or wrapped with LoRA when ``config.lora`` is set.

    Turns on gradient checkpointing when ``config.gradient_checkpointing`` is set (the non-reentrant kind, which
    also works when only LoRA adapters need gradients).
    """
    if config.gradient_checkpointing:
        enable: Any = getattr(model, "gradient_checkpointing_enable", None)
        if enable is None:
            raise ValueError(f"{type(model).__name__} does not support gradient checkpointing")
        enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model_config: Any = getattr(model, "config", None)
        if model_config is not None and hasattr(model_config, "use_cache"):
            model_config.use_cache = False  # a KV cache is useless (and warned about) while recomputing activations
    return apply_lora(model, config.lora) if config.lora is not None else model


def make_optimizer(model: torch.nn.Module, config: PPOConfig) -> torch.optim.AdamW:
    """AdamW over the trainable parameters of ``model`` with the config's lr, betas and weight decay."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.AdamW(trainable, lr=config.lr, betas=config.betas, weight_decay=config.weight_decay)


def _max_positions(model: torch.nn.Module) -> int:
    config: Any = getattr(model, "config", None)
    return int(getattr(config, "max_position_embeddings", 1 << 30))


def activation_bytes_per_token(model: torch.nn.Module) -> int | None:
    """A rough upper estimate of the activation bytes one token keeps for the backward pass (float32), from the
    model's config (layers, hidden and MLP sizes); ``None`` for a model without those fields."""
    config: Any = getattr(model, "config", None)
    layers, hidden = getattr(config, "num_hidden_layers", None), getattr(config, "hidden_size", None)
    if not isinstance(layers, int) or not isinstance(hidden, int):
        return None
    intermediate = getattr(config, "intermediate_size", None)
    intermediate = intermediate if isinstance(intermediate, int) else 4 * hidden
    # per layer: the residual stream, norms, q/k/v/o and attention outputs (~16 x hidden) and the gated MLP's
    # activations (~4 x intermediate), float32
    return 4 * layers * (16 * hidden + 4 * intermediate)


def fit_micro_batches(model: torch.nn.Module, config: PPOConfig, device: torch.device) -> PPOConfig:
    """``config`` with ``micro_batch_tokens`` lowered so a pass's activations fit ``activation_memory_gib``."""
    per_token = activation_bytes_per_token(model)
    if per_token is None:
        return config
    gib = config.activation_memory_gib
    if gib is None:
        gib = 4.0
        if device.type == "cuda":  # pragma: no cover - needs a GPU (marked for the GPU run)
            gib = torch.cuda.get_device_properties(device).total_memory / 4 / 2**30
    cap = max(1, int(gib * 2**30 // per_token))
    if cap >= config.micro_batch_tokens:
        return config
    return config.model_copy(update={"micro_batch_tokens": cap})


def _validate(samples: Sequence[TrainingSample], vocab: int, max_positions: int) -> None:
    for index, sample in enumerate(samples):
        if not sample.prompt_token_ids:
            raise ValueError(f"sample {index} has no prompt tokens")
        length = len(sample.prompt_token_ids) + len(sample.response_token_ids)
        if length > max_positions:
            raise ValueError(f"sample {index} has {length} tokens; the model's context is {max_positions}")
        bad = [t for t in (*sample.prompt_token_ids, *sample.response_token_ids) if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"sample {index} has token ids {bad[:5]} outside the vocabulary (size {vocab})")
        if sample.response_logprobs is not None and len(sample.response_logprobs) != len(sample.response_token_ids):
            raise ValueError(f"sample {index}: response_logprobs must have one entry per response token")


def plan_micro_batches(lengths: Sequence[int], max_rows: int, max_tokens: int) -> list[list[int]]:
    """Group sample indices into micro-batches of at most ``max_rows`` rows and ``max_tokens`` padded tokens.

    Samples are taken longest first, so rows of similar length share a micro-batch (little padding); a sample
    longer than ``max_tokens`` goes alone. Every index appears exactly once.
    """
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    groups: list[list[int]] = []
    width = 0
    for index in order:
        current = groups[-1] if groups else None
        if current is not None and len(current) < max_rows and (len(current) + 1) * width <= max_tokens:
            current.append(index)
            continue
        groups.append([index])
        width = lengths[index]  # the first (longest) row of a group sets its width
    return groups


def _autocast(device: torch.device, bf16: bool) -> Any:
    return torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=bf16 and device.type == "cuda")


def _forward(
    model: torch.nn.Module,
    samples: Sequence[TrainingSample],
    device: torch.device,
    bf16: bool = True,
    entropy_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token log-probs and entropies of every response token (padded to the longest response) and the pad mask.

    Only the positions from the shortest prompt on get logits (``logits_to_keep``): with a large vocabulary the
    prompt's logits would otherwise be most of the memory.
    """
    width = max(len(s.prompt_token_ids) + len(s.response_token_ids) for s in samples)
    longest = max(len(s.response_token_ids) for s in samples)
    first = min(len(s.prompt_token_ids) for s in samples) - 1  # the logit at position p predicts token p + 1
    input_ids = torch.zeros((len(samples), width), dtype=torch.long)
    attention = torch.zeros((len(samples), width), dtype=torch.long)
    targets = torch.zeros((len(samples), longest), dtype=torch.long)
    index = torch.zeros((len(samples), longest), dtype=torch.long)
    valid = torch.zeros((len(samples), longest), dtype=torch.bool)
    for row, sample in enumerate(samples):
        ids = [*sample.prompt_token_ids, *sample.response_token_ids]
        input_ids[row, : len(ids)] = torch.tensor(ids)
        attention[row, : len(ids)] = 1
        count = len(sample.response_token_ids)
        targets[row, :count] = torch.tensor(sample.response_token_ids)
        start = len(sample.prompt_token_ids) - 1 - first
        index[row, :count] = torch.arange(start, start + count)
        valid[row, :count] = True
    input_ids, attention, targets, index = (t.to(device) for t in (input_ids, attention, targets, index))
    with _autocast(device, bf16):
        try:
            logits = model(input_ids=input_ids, attention_mask=attention, logits_to_keep=width - first).logits
        except TypeError:  # a model class without logits_to_keep: compute all positions, keep the same ones
            logits = model(input_ids=input_ids, attention_mask=attention).logits[:, first:]
    picked = logits.gather(1, index[..., None].expand(-1, -1, logits.shape[-1])).float()
    del logits
    logprobs_all = torch.log_softmax(picked, dim=-1)
    logprobs = logprobs_all.gather(-1, targets[..., None]).squeeze(-1)
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):  # differentiable for an entropy bonus
        entropy = -(logprobs_all.exp() * logprobs_all).sum(-1)
    return logprobs, entropy, valid.to(device)


@torch.no_grad()
def response_logprobs(
    model: torch.nn.Module,
    samples: Sequence[TrainingSample],
    device: str | torch.device = "cpu",
    micro_batch_size: int = 64,
    micro_batch_tokens: int = 16384,
    *,
    bf16: bool = True,
) -> list[list[float]]:
    """Log-prob of every response token of every sample under ``model`` (no gradients), in token-bounded chunks."""
    was_training = model.training
    model.eval()
    out: list[list[float]] = [[] for _ in samples]
    lengths = [len(s.prompt_token_ids) + len(s.response_token_ids) for s in samples]
    try:
        for group in plan_micro_batches(lengths, micro_batch_size, micro_batch_tokens):
            chunk = [samples[i] for i in group]
            logprobs, _, _ = _forward(model, chunk, torch.device(device), bf16)
            for row, i in enumerate(group):
                out[i] = logprobs[row, : len(samples[i].response_token_ids)].tolist()
    finally:
        model.train(was_training)
    return out


def _padded(rows: Sequence[Sequence[float]], device: torch.device) -> torch.Tensor:
    width = max(len(r) for r in rows)
    tensor = torch.zeros((len(rows), width), dtype=torch.float32)
    for i, row in enumerate(rows):
        tensor[i, : len(row)] = torch.tensor(list(row), dtype=torch.float32)
    return tensor.to(device)


def _reference_logprobs(
    model: torch.nn.Module,
    ref_model: torch.nn.Module | None,
    samples: Sequence[TrainingSample],
    device: torch.device,
    config: PPOConfig,
) -> list[list[float]]:
    if ref_model is not None:
        return response_logprobs(
            ref_model, samples, device, config.micro_batch_size, config.micro_batch_tokens, bf16=config.bf16
        )
    # A LoRA policy with its adapters switched off is the base model: no second copy of the weights needed.
    peft_model: Any = model
    with peft_model.disable_adapter():
        return response_logprobs(
            model, samples, device, config.micro_batch_size, config.micro_batch_tokens, bf16=config.bf16
        )


_LOSS_KEYS = ("loss", "pg_loss", "kl", "approx_kl", "clip_fraction", "entropy")


@dataclass
class _Anchors:
    """What each sample's new log-probs are compared with: the old log-probs (behaviour, or the weights before the
    update with ``is_correction``), the reference's, and the truncated importance weights (``is_correction``)."""

    old: list[list[float]]
    ref: list[list[float]] | None
    is_weights: list[list[float]] | None = None
    metrics: dict[str, float] = field(default_factory=dict[str, float])


@dataclass
class _Tally:
    """Sums over one `ppo_update`: the loss terms (summed per optimizer step) and the step counts."""

    totals: dict[str, float] = field(default_factory=lambda: dict.fromkeys(_LOSS_KEYS, 0.0))
    grad_norms: list[float] = field(default_factory=list[float])
    micro_batches: int = 0
    max_micro_tokens: int = 0


def _no_step_metrics(num_samples: int, lr: float) -> dict[str, float]:
    """The metrics of an update that takes no step (nothing to train on)."""
    counts = ("grad_norm", "num_tokens", "optimizer_steps", "micro_batches", "max_micro_batch_tokens")
    return {**dict.fromkeys((*_LOSS_KEYS, *counts), 0.0), "num_samples": float(num_samples), "lr": lr}


def _anchors(
    model: torch.nn.Module,
    ref_model: torch.nn.Module | None,
    samples: Sequence[TrainingSample],
    device: torch.device,
    config: PPOConfig,
) -> _Anchors:
    """The behaviour log-probs (recorded, or recomputed with the weights before the update for a sample without
    them) and, with a KL penalty, the reference policy's log-probs; with ``is_correction``, the log-probs before the
    update as the old ones and the truncated importance weights from the recorded behaviour log-probs."""
    ref_rows = _reference_logprobs(model, ref_model, samples, device, config) if config.kl_coef > 0 else None
    if config.is_correction:
        proximal = response_logprobs(
            model, samples, device, config.micro_batch_size, config.micro_batch_tokens, bf16=config.bf16
        )
        behaviour = [list(s.response_logprobs or ()) for s in samples]  # checked present by `ppo_update`
        weights = truncated_importance_weights(proximal, behaviour, [s.response_mask for s in samples], config.is_cap)
        return _Anchors(proximal, ref_rows, weights.weights, weights.metrics())
    missing = [i for i, s in enumerate(samples) if s.response_logprobs is None]
    old_rows: list[list[float]] = [list(s.response_logprobs or ()) for s in samples]
    if missing:
        chunk = [samples[i] for i in missing]
        recomputed = response_logprobs(
            model, chunk, device, config.micro_batch_size, config.micro_batch_tokens, bf16=config.bf16
        )
        for i, row in zip(missing, recomputed, strict=True):
            old_rows[i] = row
    return _Anchors(old_rows, ref_rows)


@dataclass
class _MiniBatch:
    """One optimizer step's samples: their indices, trained-token count per sample, and the total."""

    indices: list[int]
    counts: dict[int, int]
    tokens: int


def _micro_batch_backward(
    model: torch.nn.Module,
    samples: Sequence[TrainingSample],
    rows: list[int],
    mini: _MiniBatch,
    anchors: _Anchors,
    device: torch.device,
    config: PPOConfig,
    tally: _Tally,
) -> None:
    """Forward and backward of the micro-batch ``rows`` (sample indices); gradients accumulate, terms are tallied."""
    part = [samples[i] for i in rows]
    logprobs, entropy, valid = _forward(model, part, device, config.bf16, config.entropy_coef > 0)
    mask = _padded([s.response_mask for s in part], device) * valid
    # Weights are normalised over the whole mini-batch, so accumulating micro-batches sums to it.
    if config.loss_agg == "token-mean":
        weights = mask / mini.tokens
    else:
        per_sample = torch.tensor([1.0 / (max(mini.counts[i], 1) * len(mini.indices)) for i in rows], device=device)
        weights = mask * per_sample[:, None]
    old = _padded([anchors.old[i] for i in rows], device)
    advantage = torch.tensor([samples[i].advantage for i in rows], device=device)[:, None]
    ratio = torch.exp(logprobs - old)
    unclipped = -advantage * ratio
    clipped = -advantage * ratio.clamp(1 - config.clip_ratio, 1 + config.clip_ratio)
    pg = torch.maximum(unclipped, clipped)
    if anchors.is_weights is not None:  # off-policy: each token's surrogate times its truncated importance weight
        pg = pg * _padded([anchors.is_weights[i] for i in rows], device)
    loss_tokens = pg
    kl = torch.zeros_like(pg)
    if anchors.ref is not None:
        delta = _padded([anchors.ref[i] for i in rows], device) - logprobs
        kl = torch.exp(delta) - delta - 1
        loss_tokens = pg + config.kl_coef * kl
    if config.entropy_coef > 0:  # a bonus for keeping the policy's entropy: against collapse
        loss_tokens = loss_tokens - config.entropy_coef * entropy
    loss = (loss_tokens * weights).sum()
    loss.backward()
    with torch.no_grad():
        share = mask / mini.tokens
        totals = tally.totals
        totals["loss"] += float(loss)
        totals["pg_loss"] += float((pg * weights).sum())
        totals["kl"] += float((kl * share).sum())
        totals["approx_kl"] += float(((old - logprobs) * share).sum())
        totals["clip_fraction"] += float(((clipped > unclipped).float() * share).sum())
        totals["entropy"] += float((entropy.detach() * share).sum())


def _optimizer_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    samples: Sequence[TrainingSample],
    lengths: Sequence[int],
    mini: _MiniBatch,
    anchors: _Anchors,
    device: torch.device,
    config: PPOConfig,
    tally: _Tally,
) -> None:
    """One optimizer step on ``mini``: its micro-batches' gradients accumulated, clipped, applied."""
    optimizer.zero_grad(set_to_none=True)
    plan = plan_micro_batches([lengths[i] for i in mini.indices], config.micro_batch_size, config.micro_batch_tokens)
    for group in plan:
        rows = [mini.indices[g] for g in group]
        tally.micro_batches += 1
        tally.max_micro_tokens = max(tally.max_micro_tokens, len(rows) * max(lengths[i] for i in rows))
        _micro_batch_backward(model, samples, rows, mini, anchors, device, config, tally)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    tally.grad_norms.append(float(torch.nn.utils.clip_grad_norm_(params, config.grad_clip)))
    optimizer.step()


def _mini_batches(samples: Sequence[TrainingSample], size: int) -> list[_MiniBatch]:
    """Consecutive mini-batches of ``size`` samples; those without a trained token are left out (no step)."""
    out: list[_MiniBatch] = []
    for start in range(0, len(samples), size):
        indices = list(range(start, min(start + size, len(samples))))
        counts = {i: sum(1 for m in samples[i].response_mask if m) for i in indices}
        tokens = sum(counts.values())
        if tokens:
            out.append(_MiniBatch(indices, counts, tokens))
    return out


def ppo_update(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: TrainingBatch,
    config: PPOConfig | None = None,
    device: str | torch.device = "cpu",
    *,
    ref_model: torch.nn.Module | None = None,
) -> dict[str, float]:
    """Apply the clipped policy-gradient update of ``batch`` to ``model``.

    Each mini-batch (``mini_batch_size`` samples, or the whole batch) is one optimizer step; its forward/backward
    passes run in micro-batches bounded by ``micro_batch_size`` rows and ``micro_batch_tokens`` padded tokens,
    with gradients accumulated, so the step is the same whatever the micro-batching. Phases: check the samples →
    behaviour and reference log-probs (`_anchors`) → per epoch, one `_optimizer_step` per mini-batch → metrics.

    Args:
        model: The policy (possibly LoRA-wrapped by `prepare_policy`), on ``device``.
        optimizer: Its optimizer (see `make_optimizer`).
        batch: Samples with prompt/response ids, response mask, advantage and (optionally) old log-probs.
        config: Update settings; defaults to `PPOConfig()`.
        device: Where the forward passes run.
        ref_model: Frozen reference policy for the KL penalty. With ``kl_coef > 0`` and a LoRA policy it may be
            left out: the base model (adapters disabled) is the reference.

    Returns:
        Metrics: ``loss``, ``pg_loss``, ``kl``, ``approx_kl``, ``clip_fraction``, ``entropy``, ``grad_norm``,
        ``num_samples``, ``num_tokens``, ``optimizer_steps``, ``micro_batches``, ``max_micro_batch_tokens``,
        ``lr``; with ``is_correction``, ``is_ratio_mean``, ``is_ratio_max`` and ``is_truncated_fraction`` (over the
        trained tokens, before truncation). An empty batch (or one with no trained token) makes no step and reports
        ``optimizer_steps = 0``.

    Raises:
        ValueError: On a sample that does not fit the model or, with ``is_correction``, has no behaviour log-probs
            (checked before anything changes), or ``kl_coef > 0`` without ``ref_model`` for a policy that is not
            LoRA.
    """
    config = config or PPOConfig()
    device = torch.device(device)
    if config.kl_coef > 0 and ref_model is None and not is_lora(model):
        raise ValueError("kl_coef > 0 needs a ref_model to compute the KL penalty against (or a LoRA policy)")
    samples = list(batch.samples)
    lr = float(optimizer.param_groups[0]["lr"]) if optimizer.param_groups else config.lr
    trained_tokens = sum(sum(1 for m in s.response_mask if m) for s in samples)
    if not samples or trained_tokens == 0:
        logger.warning("ppo_update got no trained tokens (%d samples); no step taken", len(samples))
        return _no_step_metrics(len(samples), lr)
    vocab = int(getattr(getattr(model, "config", None), "vocab_size", 1 << 62))
    _validate(samples, vocab, _max_positions(model))
    if config.is_correction:
        check_behaviour_logprobs(samples)
    config = fit_micro_batches(model, config, device)
    if config.num_threads is not None and device.type == "cpu":
        torch.set_num_threads(config.num_threads)
    anchors = _anchors(model, ref_model, samples, device, config)

    was_training = model.training
    model.train()
    tally = _Tally()
    lengths = [len(s.prompt_token_ids) + len(s.response_token_ids) for s in samples]
    minis = _mini_batches(samples, config.mini_batch_size or len(samples))
    try:
        for _epoch in range(config.epochs):
            for mini in minis:
                _optimizer_step(model, optimizer, samples, lengths, mini, anchors, device, config, tally)
    finally:
        model.train(was_training)
    steps = max(len(tally.grad_norms), 1)
    metrics = {key: value / steps for key, value in tally.totals.items()}
    metrics.update(
        grad_norm=sum(tally.grad_norms) / steps,
        num_samples=float(len(samples)),
        num_tokens=float(trained_tokens),
        optimizer_steps=float(len(tally.grad_norms)),
        micro_batches=float(tally.micro_batches),
        max_micro_batch_tokens=float(tally.max_micro_tokens),
        lr=lr,
    )
    metrics.update(anchors.metrics)
    return metrics
