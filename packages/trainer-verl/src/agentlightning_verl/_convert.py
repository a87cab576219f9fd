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
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

from agentlightning import TrainingBatch, TrainingSample

if TYPE_CHECKING:
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

    See the module docstring for every key, its shape and the truncation policy.

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
        import numpy as np
        import torch
        from verl import DataProto
    except ImportError as exc:  # pragma: no cover - exercised only without verl installed
        raise ImportError(
            "to_data_proto needs verl, torch and numpy: pip install 'agentlightning-verl' "
            f"(verl==0.9.1 pulls torch); missing: {exc.name}"
        ) from exc

    if max_prompt_length < 1 or max_response_length < 1:
        raise ValueError(
            f"max_prompt_length ({max_prompt_length}) and max_response_length ({max_response_length}) must be >= 1"
        )
    if truncation not in ("error", "truncate"):
        raise ValueError(f"truncation must be 'error' or 'truncate', not {truncation!r}")
    samples = batch.samples
    if not samples:
        raise ValueError("cannot convert an empty TrainingBatch (no samples)")

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

    size = len(samples)
    p_len = max_prompt_length if pad_to_max else max(len(f[0]) for f in fitted)
    r_len = max_response_length if pad_to_max else max(len(f[1]) for f in fitted)
    prompts = torch.full((size, p_len), pad_token_id, dtype=torch.long)
    responses = torch.full((size, r_len), pad_token_id, dtype=torch.long)
    prompt_attn = torch.zeros((size, p_len), dtype=torch.long)
    response_attn = torch.zeros((size, r_len), dtype=torch.long)
    response_mask = torch.zeros((size, r_len), dtype=torch.long)
    scores = torch.zeros((size, r_len), dtype=torch.float32)
    logprobs = torch.zeros((size, r_len), dtype=torch.float32)
    advantages = torch.zeros((size, r_len), dtype=torch.float32)
    returns = torch.zeros((size, r_len), dtype=torch.float32)

    n_prompt_cut = n_response_cut = 0
    for row, (sample, (p_ids, r_ids, r_mask, r_logp, p_cut, r_cut)) in enumerate(zip(samples, fitted, strict=True)):
        n_prompt_cut += p_cut
        n_response_cut += r_cut
        prompts[row, p_len - len(p_ids) :] = torch.tensor(p_ids, dtype=torch.long)
        prompt_attn[row, p_len - len(p_ids) :] = 1
        n = len(r_ids)
        responses[row, :n] = torch.tensor(r_ids, dtype=torch.long)
        response_attn[row, :n] = 1
        mask_row = torch.tensor(r_mask, dtype=torch.long)
        response_mask[row, :n] = mask_row
        last_trained = max(i for i, m in enumerate(r_mask) if m == 1)
        scores[row, last_trained] = sample.credit
        if r_logp is not None:
            logprobs[row, :n] = torch.tensor(r_logp, dtype=torch.float32)
        advantages[row, :n] = sample.advantage * mask_row.float()
        returns[row, :n] = sample.credit * mask_row.float()  # the return a critic learns is the credit

    attention_mask = torch.cat([prompt_attn, response_attn], dim=1)
    tensors: dict[str, torch.Tensor] = {
        "prompts": prompts,
        "responses": responses,
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention_mask,
        "position_ids": torch.clip(torch.cumsum(attention_mask, dim=-1) - 1, min=0),
        "response_mask": response_mask,
        "token_level_scores": scores,
        "token_level_rewards": scores.clone(),
    }
    if with_logprobs:
        tensors["rollout_log_probs"] = logprobs
        if include_old_log_probs:
            tensors["old_log_probs"] = logprobs.clone()
    if include_advantages:
        tensors["advantages"] = advantages
        tensors["returns"] = returns

    def _objects(values: list[Any]) -> Any:
        out = np.empty(len(values), dtype=object)
        out[:] = values
        return out

    non_tensors = {
        "uid": _objects([s.group_id for s in samples]),
        "rollout_id": _objects([s.rollout_id for s in samples]),
        "attempt_id": _objects([s.attempt_id for s in samples]),
        "step_index": np.array([s.step_index for s in samples], dtype=np.int64),
        "agent_name": _objects([s.agent_name for s in samples]),
    }
    info: dict[str, Any] = {META_PROMPTS_TRUNCATED: n_prompt_cut, META_RESPONSES_TRUNCATED: n_response_cut}
    info.update(meta_info or {})
    if n_prompt_cut or n_response_cut:
        logger.warning(
            "to_data_proto truncated %d prompt(s) to %d tokens and %d response(s) to %d tokens",
            n_prompt_cut,
            max_prompt_length,
            n_response_cut,
            max_response_length,
        )
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors, meta_info=info)
