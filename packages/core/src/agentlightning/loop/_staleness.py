"""Staleness admission at training time: which samples of a batch may be trained with a bound of k versions.

The loop's admission control (never enqueueing rollouts more than ``max_staleness`` iterations ahead) keeps every
sample within the bound by construction; this is the check at training time that makes the bound a guarantee: a
sample older than the bound (or whose age cannot be told, or that cannot be importance-corrected) is dropped and
counted, never trained silently.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping

from agentlightning._fast import fast_model
from agentlightning._training_models import TrainingBatch, TrainingSample

__all__ = ["admit_samples", "version_lag_histogram"]

logger = logging.getLogger(__name__)


def _current(sample: TrainingSample, current_version: int, policy_versions: Mapping[str, int] | None) -> int:
    """The version ``sample``'s weights have now: its policy's own (a policy's weights change only when it trains),
    else the loop's ``current_version``."""
    if sample.policy is not None and policy_versions and sample.policy in policy_versions:
        return policy_versions[sample.policy]
    return current_version


def version_lag_histogram(
    samples: list[TrainingSample], current_version: int, policy_versions: Mapping[str, int] | None = None
) -> dict[str, float]:
    """``version_lag_<n>``: how many of ``samples`` were generated ``n`` versions before their weights' current
    version (`admit_samples`; samples of unknown version are not counted)."""
    lags = Counter(
        _current(s, current_version, policy_versions) - s.model_version for s in samples if s.model_version is not None
    )
    return {f"version_lag_{lag}": float(count) for lag, count in sorted(lags.items())}


def _refusal(sample: TrainingSample, current_version: int, max_staleness: int) -> str | None:  # current: _current's
    """Why ``sample`` may not be trained at ``current_version`` with bound ``max_staleness`` (``None``: it may)."""
    if sample.model_version is None:
        # synchronous training has no lag to check; off-policy, an unknown version could be any age
        return None if max_staleness == 0 else "no_version"
    if current_version - sample.model_version > max_staleness:
        return "stale"
    if max_staleness > 0 and sample.response_logprobs is None:
        # the importance weight is pi_before_update / pi_behaviour: without the behaviour's log-probs there is none
        return "no_logprobs"
    return None


_METRIC = {
    "stale": "samples_dropped_stale",
    "no_version": "samples_refused_no_version",
    "no_logprobs": "samples_refused_no_logprobs",
}
_WHY = {
    "stale": "generated more than max_staleness versions ago",
    "no_version": "of unknown model version (its age cannot be checked)",
    "no_logprobs": "without behaviour log-probs (the importance correction needs the generating weights' log-probs; "
    "does the backend return logprobs?)",
}


def admit_samples(
    batch: TrainingBatch,
    current_version: int,
    max_staleness: int,
    policy_versions: Mapping[str, int] | None = None,
) -> TrainingBatch:
    """The samples of ``batch`` that may train the update from ``current_version`` with a bound of
    ``max_staleness`` versions, with the counts of those left out added to its metrics.

    A sample is left out when it is more than ``max_staleness`` versions old (``samples_dropped_stale``) and, when
    ``max_staleness > 0`` (off-policy samples, importance-corrected), when its version is unknown
    (``samples_refused_no_version``) or it has no behaviour log-probs (``samples_refused_no_logprobs``). Each kind
    left out is logged once as a warning with the reason. The metrics also get the version-lag histogram of every
    sample of the batch (`version_lag_histogram`).

    Args:
        batch: Credit-assigned samples (`TrainingSample.model_version` set by the proxy's records).
        current_version: The model version the update starts from.
        max_staleness: The bound k (`LoopConfig.max_staleness`).
        policy_versions: With several policies, each policy's current version (the loop's version when it last
            trained): a policy that had no samples keeps its weights, so its calls are not older for that.

    Returns:
        A new batch (``batch`` itself is not changed).
    """
    kept: list[TrainingSample] = []
    refused: Counter[str] = Counter()
    for sample in batch.samples:
        why = _refusal(sample, _current(sample, current_version, policy_versions), max_staleness)
        if why is None:
            kept.append(sample)
        else:
            refused[why] += 1
    metrics = {**batch.metrics, **version_lag_histogram(batch.samples, current_version, policy_versions)}
    metrics.update({name: float(refused[why]) for why, name in _METRIC.items()})
    for why, count in refused.items():
        logger.warning(
            "%d of %d sample(s) not trained at version %d (max_staleness=%d): %s",
            count,
            len(batch.samples),
            current_version,
            max_staleness,
            _WHY[why],
        )
    return fast_model(TrainingBatch, {"samples": kept, "metrics": metrics})
