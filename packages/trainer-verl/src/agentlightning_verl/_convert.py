"""`TrainingBatch` -> verl `DataProto`: the exact tensor layout verl 0.9.1's PPO machinery reads.

Layout (matches ``verl.experimental.agent_loop.AgentLoopManager._postprocess`` and the keys read by
``verl.trainer.ppo.ray_trainer.compute_advantage`` and ``verl.workers.utils.losses.ppo_loss``):

* ``prompts``: prompt ids, LEFT-padded to ``P`` (``pad_token_id`` on the left), shape ``(B, P)``.
* ``responses``: response ids, RIGHT-padded to ``R``, shape ``(B, R)``.
* ``input_ids``: ``cat(prompts, responses)``, shape ``(B, P + R)``.
* ``attention_mask``: 1 on every real token (prompt, generated AND observation tokens), 0 on padding.
  verl derives each response's length from it (``no_padding_2_padding``), so observation tokens must stay 1 here.
* ``position_ids``: ``clip(cumsum(attention_mask) - 1, min=0)`` (verl's ``compute_position_id_with_mask``).
* ``response_mask``: the sample's ``response_mask`` (0 on observation tokens) and 0 on padding: what is trained.
* ``token_level_scores`` / ``token_level_rewards``: float32 ``(B, R)``, zero except the sample's ``credit`` on its
  LAST TRAINED token (last position with ``response_mask == 1``). Outcome estimators (GRPO, RLOO) sum the row, so
  the position only matters for GAE and REINFORCE++; those skip masked-out positions, and a credit sitting on an
  observation token would be dropped by GAE, hence the last trained token rather than the last token.
* ``rollout_log_probs``: behaviour log-probs from the rollout engine (0.0 on padding), when every sample has them.
* ``old_log_probs``: the same values, when ``include_old_log_probs`` (verl's "bypass mode": the rollout policy is the
  PPO anchor). Leave it out to have the actor recompute ``old_log_probs`` (verl's "decoupled mode").
* ``advantages`` / ``returns``: our credit assignment's per-sample values broadcast over ``response_mask``, when
  ``include_advantages`` (verl's ``compute_advantage`` overwrites both if you call it).
* non-tensor ``uid``: the sample's ``group_id`` (verl's GRPO/RLOO group key), plus ``rollout_id``, ``attempt_id``,
  ``step_index`` and ``agent_name`` (object arrays).

Truncation policy (``truncation=``): ``"error"`` (default) raises `SequenceTooLongError` naming the sample; with
``"truncate"`` a prompt keeps its LAST ``max_prompt_length`` tokens (the most recent context) and a response keeps its
FIRST ``max_response_length`` tokens (what the policy generated first; the credit then lands on the last kept trained
token). Counts go to ``meta_info["agentlightning/num_prompts_truncated"]`` and ``".../num_responses_truncated"`` and
a warning is logged. A sample left with no trained token after truncation is an error in both modes.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from agentlightning import TrainingBatch, TrainingSample

if TYPE_CHECKING:
    import torch
    from verl import DataProto

__all__ = ["SequenceTooLongError", "TruncationPolicy", "to_data_proto"]

logger = logging.getLogger(__name__)

TruncationPolicy = Literal["error", "truncate"]

META_PROMPTS_TRUNCATED = "agentlightning/num_prompts_truncated"
META_RESPONSES_TRUNCATED = "agentlightning/num_responses_truncated"


class SequenceTooLongError(ValueError):
    """A sample's prompt or response is longer than the configured maximum and truncation is off."""


def _fit(
    index: int,
    sample: TrainingSample,
    *,
    max_prompt_length: int,
    max_response_length: int,
    truncation: TruncationPolicy,
) -> tuple[list[int], list[int], list[int], list[float] | None, bool, bool]:
    prompt = sample.prompt_token_ids
    response = sample.response_token_ids
    mask = sample.response_mask
    logprobs = sample.response_logprobs
    where = f"sample {index} (rollout {sample.rollout_id!r}, step {sample.step_index})"
    if not prompt:
        raise ValueError(f"{where} has an empty prompt; verl needs at least one prompt token")
    if len(mask) != len(response):
        raise ValueError(f"{where}: response_mask has {len(mask)} entries for {len(response)} response tokens")
    if logprobs is not None and len(logprobs) != len(response):
        raise ValueError(f"{where}: response_logprobs has {len(logprobs)} entries for {len(response)} response tokens")
    if any(m not in (0, 1) for m in mask):
        raise ValueError(f"{where}: response_mask must contain only 0 and 1")
    prompt_cut = len(prompt) > max_prompt_length
    response_cut = len(response) > max_response_length
    if (prompt_cut or response_cut) and truncation == "error":
        raise SequenceTooLongError(
            f"{where}: prompt has {len(prompt)} tokens (max_prompt_length={max_prompt_length}), response has "
            f"{len(response)} tokens (max_response_length={max_response_length}); raise the limits or pass "
            "truncation='truncate'"
        )
    if prompt_cut:
        prompt = prompt[len(prompt) - max_prompt_length :]
    if response_cut:
        response = response[:max_response_length]
        mask = mask[:max_response_length]
        logprobs = None if logprobs is None else logprobs[:max_response_length]
    if 1 not in mask:
        detail = " after truncation" if response_cut else ""
        raise ValueError(f"{where} has no trained token (response_mask is all 0){detail}; drop it before conversion")
    return prompt, response, mask, logprobs, prompt_cut, response_cut


_Fitted = tuple[list[int], list[int], list[int], list[float] | None, bool, bool]
"""`_fit`'s result: prompt, response, mask, behaviour log-probs (or ``None``), prompt cut, response cut."""


@dataclass
class _Padded:
    """The batch's per-token tensors, ``(B, P)`` for the prompt side and ``(B, R)`` for the response side."""

    prompts: torch.Tensor
    responses: torch.Tensor
    prompt_attn: torch.Tensor
    response_attn: torch.Tensor
    response_mask: torch.Tensor
    scores: torch.Tensor
    logprobs: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor
    prompts_cut: int = 0
    responses_cut: int = 0


def _check_limits(max_prompt_length: int, max_response_length: int, truncation: str) -> None:
    if max_prompt_length < 1 or max_response_length < 1:
        raise ValueError(
            f"max_prompt_length ({max_prompt_length}) and max_response_length ({max_response_length}) must be >= 1"
        )
    if truncation not in ("error", "truncate"):
        raise ValueError(f"truncation must be 'error' or 'truncate', not {truncation!r}")


def _fit_all(
    samples: Sequence[TrainingSample], *, max_prompt_length: int, max_response_length: int, truncation: TruncationPolicy
) -> list[_Fitted]:
    """Every sample checked and fitted to the limits (`_fit`); behaviour log-probs on all samples or on none."""
    fitted = [
        _fit(i, s, max_prompt_length=max_prompt_length, max_response_length=max_response_length, truncation=truncation)
        for i, s in enumerate(samples)
    ]
    with_logprobs = sum(f[3] is not None for f in fitted)
    if 0 < with_logprobs < len(fitted):
        raise ValueError(
            f"{with_logprobs} of {len(fitted)} samples carry response_logprobs; verl needs all or none "
            "(check the proxy recorded logprobs for every call)"
        )
    return fitted


def _pad(
    samples: Sequence[TrainingSample], fitted: Sequence[_Fitted], p_len: int, r_len: int, pad_token_id: int
) -> _Padded:
    """Prompts left-padded to ``p_len``, responses right-padded to ``r_len``; credit on each last trained token."""
    import torch

    size = len(samples)
    out = _Padded(
        prompts=torch.full((size, p_len), pad_token_id, dtype=torch.long),
        responses=torch.full((size, r_len), pad_token_id, dtype=torch.long),
        prompt_attn=torch.zeros((size, p_len), dtype=torch.long),
        response_attn=torch.zeros((size, r_len), dtype=torch.long),
        response_mask=torch.zeros((size, r_len), dtype=torch.long),
        scores=torch.zeros((size, r_len), dtype=torch.float32),
        logprobs=torch.zeros((size, r_len), dtype=torch.float32),
        advantages=torch.zeros((size, r_len), dtype=torch.float32),
        returns=torch.zeros((size, r_len), dtype=torch.float32),
    )
    for row, (sample, (p_ids, r_ids, r_mask, r_logp, p_cut, r_cut)) in enumerate(zip(samples, fitted, strict=True)):
        out.prompts_cut += p_cut
        out.responses_cut += r_cut
        out.prompts[row, p_len - len(p_ids) :] = torch.tensor(p_ids, dtype=torch.long)
        out.prompt_attn[row, p_len - len(p_ids) :] = 1
        n = len(r_ids)
        out.responses[row, :n] = torch.tensor(r_ids, dtype=torch.long)
        out.response_attn[row, :n] = 1
        mask_row = torch.tensor(r_mask, dtype=torch.long)
        out.response_mask[row, :n] = mask_row
        last_trained = max(i for i, m in enumerate(r_mask) if m == 1)
        out.scores[row, last_trained] = sample.credit
        if r_logp is not None:
            out.logprobs[row, :n] = torch.tensor(r_logp, dtype=torch.float32)
        out.advantages[row, :n] = sample.advantage * mask_row.float()
        out.returns[row, :n] = sample.credit * mask_row.float()  # the return a critic learns is the credit
    return out


def _tensors(
    padded: _Padded, *, with_logprobs: bool, include_old_log_probs: bool, include_advantages: bool
) -> dict[str, torch.Tensor]:
    """The `DataProto`'s tensor keys (see the module docstring), derived ones (input ids, positions) included."""
    import torch

    attention_mask = torch.cat([padded.prompt_attn, padded.response_attn], dim=1)
    tensors: dict[str, torch.Tensor] = {
        "prompts": padded.prompts,
        "responses": padded.responses,
        "input_ids": torch.cat([padded.prompts, padded.responses], dim=1),
        "attention_mask": attention_mask,
        "position_ids": torch.clip(torch.cumsum(attention_mask, dim=-1) - 1, min=0),
        "response_mask": padded.response_mask,
        "token_level_scores": padded.scores,
        "token_level_rewards": padded.scores.clone(),
    }
    if with_logprobs:
        tensors["rollout_log_probs"] = padded.logprobs
        if include_old_log_probs:
            tensors["old_log_probs"] = padded.logprobs.clone()
    if include_advantages:
        tensors["advantages"] = padded.advantages
        tensors["returns"] = padded.returns
    return tensors


def _non_tensors(samples: Sequence[TrainingSample]) -> dict[str, Any]:
    """Per-sample ids as numpy arrays: ``uid`` (the group, verl's GRPO/RLOO key), rollout, attempt, step, agent."""
    import numpy as np

    def _objects(values: list[Any]) -> Any:
        out = np.empty(len(values), dtype=object)
        out[:] = values
        return out

    return {
        "uid": _objects([s.group_id for s in samples]),
        "rollout_id": _objects([s.rollout_id for s in samples]),
        "attempt_id": _objects([s.attempt_id for s in samples]),
        "step_index": np.array([s.step_index for s in samples], dtype=np.int64),
        "agent_name": _objects([s.agent_name for s in samples]),
    }


def to_data_proto(
    batch: TrainingBatch,
    *,
    max_prompt_length: int,
    max_response_length: int,
    pad_token_id: int,
    truncation: TruncationPolicy = "error",
    pad_to_max: bool = True,
    include_old_log_probs: bool = True,
    include_advantages: bool = True,
    meta_info: Mapping[str, Any] | None = None,
) -> DataProto:
    """Convert a `TrainingBatch` into the `verl.DataProto` verl's PPO/GRPO code consumes.

    See the module docstring for every key, its shape and the truncation policy. Phases: check the limits → fit
    every sample (`_fit_all`) → pad into tensors (`_pad`) → the tensor and non-tensor keys → `DataProto`.

    Args:
        batch: Samples from credit assignment (``agentlightning.build_training_batch``).
        max_prompt_length: Longest prompt kept (``data.max_prompt_length`` in verl's config).
        max_response_length: Longest response kept (``data.max_response_length``).
        pad_token_id: Id written on padding positions (the tokenizer's pad id, or its eos id).
        truncation: ``"error"`` to refuse over-long samples, ``"truncate"`` to cut them (counted in ``meta_info``).
        pad_to_max: Pad to exactly ``max_prompt_length`` / ``max_response_length`` (fixed shapes, as verl does);
            ``False`` pads only to the longest prompt/response in the batch.
        include_old_log_probs: Also write the behaviour log-probs as ``old_log_probs`` (PPO anchor = rollout policy).
        include_advantages: Write our ``advantage`` / ``returns`` broadcast over trained tokens.
        meta_info: Extra ``meta_info`` entries (e.g. ``{"temperature": 1.0}``).

    Returns:
        A `DataProto` with ``len == len(batch.samples)``.

    Raises:
        ValueError: Empty batch, bad lengths or limits, a sample without trained tokens.
        SequenceTooLongError: A sample exceeds a limit and ``truncation == "error"``.
        ImportError: verl (or torch/numpy) is not installed, with the install command.
    """
    try:
        import numpy
        import torch
        from verl import DataProto
    except ImportError as exc:  # pragma: no cover - exercised only without verl installed
        raise ImportError(
            "to_data_proto needs verl, torch and numpy: pip install 'agentlightning-verl' "
            f"(verl==0.9.1 pulls torch); missing: {exc.name}"
        ) from exc
    del numpy, torch  # the phases import them again; a missing one is reported here, before any work

    _check_limits(max_prompt_length, max_response_length, truncation)
    samples = batch.samples
    if not samples:
        raise ValueError("cannot convert an empty TrainingBatch (no samples)")
    fitted = _fit_all(
        samples, max_prompt_length=max_prompt_length, max_response_length=max_response_length, truncation=truncation
    )
    p_len = max_prompt_length if pad_to_max else max(len(f[0]) for f in fitted)
    r_len = max_response_length if pad_to_max else max(len(f[1]) for f in fitted)
    padded = _pad(samples, fitted, p_len, r_len, pad_token_id)
    tensors = _tensors(
        padded,
        with_logprobs=fitted[0][3] is not None,  # all or none (`_fit_all`)
        include_old_log_probs=include_old_log_probs,
        include_advantages=include_advantages,
    )
    info: dict[str, Any] = {META_PROMPTS_TRUNCATED: padded.prompts_cut, META_RESPONSES_TRUNCATED: padded.responses_cut}
    info.update(meta_info or {})
    if padded.prompts_cut or padded.responses_cut:
        logger.warning(
            "to_data_proto truncated %d prompt(s) to %d tokens and %d response(s) to %d tokens",
            padded.prompts_cut,
            max_prompt_length,
            padded.responses_cut,
            max_response_length,
        )
    return DataProto.from_dict(tensors=tensors, non_tensors=_non_tensors(samples), meta_info=info)
