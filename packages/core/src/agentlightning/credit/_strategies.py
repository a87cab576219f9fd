"""Credit strategies: spread a rollout's rewards over its transitions.

A strategy gets one rollout's transitions in step order and the rollout's final reward, and returns one
credit per transition. Which to use:

* ``identical`` (default): every call gets the final reward. Right when only the outcome is known and
  every call contributed to it (most agent tasks); pair it with ``grpo``.
* ``discounted``: ``gamma ** (T - 1 - t) * final``; later calls get more of the outcome. Use for long
  episodes where early calls matter less.
* ``per_step``: return-to-go ``sum_{k >= t} gamma ** (k - t) * r_k + gamma ** (T - 1 - t) * final`` using the
  intermediate rewards (``Transition.intermediate_reward``). Use when the agent emits rewards along the way (tests
  passed, sub-goals reached) so they are not ignored.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from agentlightning._training_models import Transition
from agentlightning.credit._config import CreditConfig
from agentlightning.credit._registry import Registry

__all__ = ["CreditStrategy", "credit_strategy_names", "get_credit_strategy", "register_credit_strategy"]

CreditStrategy = Callable[[Sequence[Transition], float, CreditConfig], list[float]]
"""``(transitions of one rollout in step order, final reward, config) -> one credit per transition``."""

_STRATEGIES: Registry[CreditStrategy] = Registry("credit strategy")


def register_credit_strategy(name: str, *, replace: bool = False) -> Callable[[CreditStrategy], CreditStrategy]:
    """Decorator registering a credit strategy under ``name``.

    Example:
        ```python
        @register_credit_strategy("last_only")
        def last_only(transitions, final, config):
            return [0.0] * (len(transitions) - 1) + [final]
        ```

    Args:
        name: Name used in ``build_training_batch(credit=name)``.
        replace: Allow replacing a strategy already registered under ``name``.
    """
    return _STRATEGIES.register(name, replace=replace)


def get_credit_strategy(name: str) -> CreditStrategy:
    """The strategy registered as ``name``; ``ValueError`` naming the registered ones otherwise."""
    return _STRATEGIES.get(name)


def credit_strategy_names() -> list[str]:
    """Names of the registered credit strategies."""
    return _STRATEGIES.names()


@register_credit_strategy("identical")
def identical(transitions: Sequence[Transition], final: float, config: CreditConfig) -> list[float]:
    """The final reward for every transition."""
    return [final] * len(transitions)


@register_credit_strategy("discounted")
def discounted(transitions: Sequence[Transition], final: float, config: CreditConfig) -> list[float]:
    """``gamma ** (T - 1 - t) * final``: the last transition gets the full final reward."""
    n = len(transitions)
    gamma = config.gamma
    if gamma == 1.0:
        return [final] * n
    return [final * gamma ** (n - 1 - t) for t in range(n)]


@register_credit_strategy("per_step")
def per_step(transitions: Sequence[Transition], final: float, config: CreditConfig) -> list[float]:
    """Return-to-go of the intermediate rewards (optionally discounted) plus the (discounted) final reward."""
    gamma = config.gamma
    out = [0.0] * len(transitions)
    running = final  # the final reward arrives with the last step
    for t in range(len(transitions) - 1, -1, -1):
        reward = transitions[t].intermediate_reward
        if reward is not None:
            running += reward
        out[t] = running
        running *= gamma
    return out
