"""LightningRL credit assignment: rewards -> per-transition credit -> advantages -> `TrainingBatch`."""

from agentlightning.credit._advantages import (
    AdvantageEstimator,
    GroupedValues,
    advantage_estimator_names,
    get_advantage_estimator,
    register_advantage_estimator,
)
from agentlightning.credit._batch import (
    build_batch_from_results,
    build_batch_from_store,
    build_training_batch,
    staleness_metrics,
)
from agentlightning.credit._config import CreditConfig
from agentlightning.credit._strategies import (
    CreditStrategy,
    credit_strategy_names,
    get_credit_strategy,
    register_credit_strategy,
)

__all__ = [
    "AdvantageEstimator",
    "CreditConfig",
    "CreditStrategy",
    "GroupedValues",
    "advantage_estimator_names",
    "build_batch_from_results",
    "build_batch_from_store",
    "build_training_batch",
    "credit_strategy_names",
    "get_advantage_estimator",
    "get_credit_strategy",
    "register_advantage_estimator",
    "register_credit_strategy",
    "staleness_metrics",
]
