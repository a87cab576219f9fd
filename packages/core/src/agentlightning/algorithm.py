"""Deprecated: the old ``Algorithm`` base class. Implement an `agentlightning.Engine` and train it with
`agentlightning.RLLoop` instead; nothing in Agent Lightning subclasses ``Algorithm`` any more."""

from __future__ import annotations

import warnings
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

from agentlightning._training_models import TrainingBatch
from agentlightning.store._base import LightningStore

__all__ = ["Algorithm"]


class Algorithm(ABC):
    """Deprecated (removed in 0.3.0): a trainer with its own ``run`` and ``update``.

    The one training contract is now an `agentlightning.Engine` (the model, its optimizer and inference servers:
    ``update``, ``sync_weights``, state) driven by `agentlightning.RLLoop` (the RL step); subclassing this class
    warns with a `DeprecationWarning`.
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        warnings.warn(
            f"{cls.__name__} subclasses agentlightning.Algorithm, which is deprecated: implement agentlightning.Engine "
            "(update, sync_weights, start_servers) and train it with agentlightning.RLLoop(config, engine); "
            "Algorithm is removed in 0.3.0",
            DeprecationWarning,
            stacklevel=2,
        )

    @abstractmethod
    async def run(
        self, store: LightningStore, train_tasks: Sequence[Any], val_tasks: Sequence[Any] | None = None
    ) -> None:
        """Train until the algorithm's own stopping rule (iterations, time budget...) says stop."""

    @abstractmethod
    def update(self, batch: TrainingBatch) -> dict[str, float]:
        """Apply one policy update from ``batch``; returns metrics (loss, kl, clip fraction...)."""
