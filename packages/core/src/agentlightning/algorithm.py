"""The Algorithm contract every trainer package implements (trainer-torch, trainer-verl)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

from agentlightning._training_models import TrainingBatch
from agentlightning.store._base import LightningStore

__all__ = ["Algorithm"]


class Algorithm(ABC):
    """Turns rollouts collected in a store into model updates.

    A trainer enqueues tasks in ``store`` (``group_id`` = task id, ``n`` rollouts per task for group
    estimators), waits for runners to finish them, builds a `TrainingBatch` with
    ``agentlightning.build_training_batch`` (transitions + LightningRL credit + advantages), calls `update`,
    then publishes the new model version as `Resources` in the store.
    """

    @abstractmethod
    async def run(
        self, store: LightningStore, train_tasks: Sequence[Any], val_tasks: Sequence[Any] | None = None
    ) -> None:
        """Train until the algorithm's own stopping rule (iterations, time budget...) says stop."""

    @abstractmethod
    def update(self, batch: TrainingBatch) -> dict[str, float]:
        """Apply one policy update from ``batch``; returns metrics (loss, kl, clip fraction...)."""
