"""LightningRL credit assignment: rewards -> per-transition credit -> advantages -> `TrainingBatch`."""

from agentlightning.credit._advantages import (
    ESTIMATOR_ALIASES,
    AdvantageEstimator,
    GroupedValues,
    advantage_estimator_names,
    canonical_estimator_name,
    get_advantage_estimator,
    is_group_estimator,
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
    "ESTIMATOR_ALIASES",
    "AdvantageEstimator",
    "CreditConfig",
    "CreditStrategy",
    "GroupedValues",
    "advantage_estimator_names",
    "build_batch_from_results",
    "build_batch_from_store",
    "build_training_batch",
    "canonical_estimator_name",
    "credit_strategy_names",
    "get_advantage_estimator",
    "get_credit_strategy",
    "is_group_estimator",
    "register_advantage_estimator",
    "register_credit_strategy",
    "staleness_metrics",
]
