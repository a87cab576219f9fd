"""Read rollouts from a store and convert them (each rollout's last attempt)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from agentlightning._training_models import Transition
from agentlightning.store import LightningStore, NotFoundError
from agentlightning.transitions._builder import TransitionBuilder
from agentlightning.transitions._config import TransitionConfig, TransitionResult

__all__ = ["results_from_store", "transitions_from_store"]

logger = logging.getLogger(__name__)


async def results_from_store(
    store: LightningStore,
    rollout_ids: Sequence[str],
    config: TransitionConfig | None = None,
    *,
    concurrency: int = 16,
) -> list[TransitionResult]:
    """Convert the last attempt of each rollout, with diagnostics.

    The last attempt is used because it is the one whose outcome the rollout reports: earlier attempts
    failed, timed out or went silent, and their partial traces would train on episodes without a verdict.
    A rollout without attempts (never run) is skipped with a warning.

    Args:
        store: Any `LightningStore`.
        rollout_ids: Rollouts to convert, in the order the results should come back.
        config: Conversion settings.
        concurrency: Rollouts fetched at the same time (matters for a served store).

    Returns:
        One result per rollout that has an attempt, in ``rollout_ids`` order.

    Raises:
        NotFoundError: An id the store does not know.
        MissingTokenIdsError: See `TransitionBuilder.build`.
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    builder = TransitionBuilder(config)
    rollouts = {rollout.rollout_id: rollout for rollout in await store.query_rollouts(rollout_ids=rollout_ids)}
    unknown = [rollout_id for rollout_id in rollout_ids if rollout_id not in rollouts]
    if unknown:
        raise NotFoundError(f"unknown rollout id(s): {', '.join(unknown[:10])}")
    gate = asyncio.Semaphore(concurrency)

    async def one(rollout_id: str) -> TransitionResult | None:
        async with gate:
            attempts = await store.query_attempts(rollout_id)
            if not attempts:
                logger.warning("rollout %s has no attempt yet; no transitions", rollout_id)
                return None
            attempt = max(attempts, key=lambda a: a.sequence)
            spans, calls = await asyncio.gather(
                store.query_spans(rollout_id, attempt.attempt_id),
                store.query_llm_calls(rollout_id, attempt.attempt_id),
            )
        return builder.build(spans, calls, group_id=rollouts[rollout_id].group_id)

    results = await asyncio.gather(*(one(rollout_id) for rollout_id in rollout_ids))
    return [result for result in results if result is not None]


async def transitions_from_store(
    store: LightningStore, rollout_ids: Sequence[str], config: TransitionConfig | None = None
) -> list[Transition]:
    """Transitions of the last attempt of each rollout (see `results_from_store`), rollout by rollout.

    Args:
        store: Any `LightningStore`.
        rollout_ids: Rollouts to convert.
        config: Conversion settings.

    Returns:
        Transitions in rollout order, then step order; ``group_id`` is the rollout's group.
    """
    results = await results_from_store(store, rollout_ids, config)
    return [transition for result in results for transition in result.transitions]
