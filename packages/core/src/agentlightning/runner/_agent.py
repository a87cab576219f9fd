"""``@agl.rollout``: marks the user's agent function and adapts its calling convention for the runner."""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable, Mapping
from typing import Any

from agentlightning._models import Resources

__all__ = ["RolloutAgent", "as_agent", "reward_from_result", "rollout"]


def _is_async(fn: Callable[..., Any]) -> bool:
    if inspect.iscoroutinefunction(fn):
        return True
    call = getattr(fn, "__call__", None)  # noqa: B004 - callable objects with an async __call__
    return call is not None and inspect.iscoroutinefunction(call)


def _takes_resources(fn: Callable[..., Any]) -> bool:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return True  # builtins without a signature: pass both and let Python complain clearly
    params = list(sig.parameters.values())
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params):
        return True
    positional = [
        p for p in params if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    required_kw = [p for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY and p.default is p.empty]
    name = getattr(fn, "__qualname__", repr(fn))
    if not positional:
        raise TypeError(f"agent {name} must take the task as its first positional argument: fn(task[, resources])")
    required = [p for p in positional if p.default is p.empty]
    if len(required) > 2 or required_kw:
        raise TypeError(f"agent {name} must have the signature fn(task) or fn(task, resources)")
    return len(positional) >= 2


class RolloutAgent:
    """The user's agent function, as the runner calls it.

    Calling the object calls the function unchanged, so decorated functions keep working outside a runner.

    Attributes:
        fn: The wrapped function.
        is_async: Whether it is a coroutine function.
        takes_resources: Whether it accepts ``(task, resources)`` rather than ``(task)``.
        name: The function's name.
    """

    def __init__(self, fn: Callable[..., Any]) -> None:
        if not callable(fn):
            raise TypeError(f"@rollout needs a function, got {type(fn).__name__}")
        self.fn = fn
        self.is_async = _is_async(fn)
        self.takes_resources = _takes_resources(fn)
        self.name: str = getattr(fn, "__name__", type(fn).__name__)
        functools.update_wrapper(self, fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def invoke(self, task: Any, resources: Resources | None) -> Any:
        """Call the function the way it wants to be called (a coroutine for async agents)."""
        if self.takes_resources:
            return self.fn(task, resources)
        return self.fn(task)

    def __reduce__(self) -> str | tuple[Any, ...]:
        # A module-level decorated function pickles by name (as plain functions do), so worker processes
        # import it instead of receiving a copy; anything else pickles its function.
        qualname = getattr(self, "__qualname__", "")
        if qualname and "<locals>" not in qualname:
            return qualname
        return (RolloutAgent, (self.fn,))

    def __repr__(self) -> str:
        kind = "async" if self.is_async else "sync"
        return f"<RolloutAgent {self.name} ({kind})>"


def rollout(fn: Callable[..., Any]) -> RolloutAgent:
    """Decorate the agent function the runner calls for each rollout.

    The function takes ``(task)`` or ``(task, resources)``, may be sync or async, and returns the episode's
    reward: a number, ``None`` (no final reward, e.g. when rewards were emitted with ``emit_reward``), or a
    dict with a ``"reward"`` key.

    Example:
        >>> @rollout
        ... def agent(task, resources):
        ...     return 1.0 if task["x"] == 1 else 0.0
        >>> agent({"x": 1}, None)
        1.0
    """
    return RolloutAgent(fn)


def as_agent(agent: Callable[..., Any]) -> RolloutAgent:
    """The agent as a `RolloutAgent` (decorating plain functions on the fly)."""
    return agent if isinstance(agent, RolloutAgent) else RolloutAgent(agent)


def reward_from_result(result: Any) -> float | None:
    """The final reward an agent's return value stands for (``x`` or ``{"reward": x}``: the rollout's final reward).

    Raises:
        TypeError: For a value that is neither a number, ``None``, nor a dict with a ``"reward"`` key.
        ValueError: For NaN or infinite rewards.
    """
    if isinstance(result, Mapping):
        if "reward" not in result:
            raise TypeError(f"the agent returned a dict without a 'reward' key: keys {sorted(map(str, result))}")
        result = result["reward"]
    if result is None:
        return None
    if isinstance(result, bool) or not isinstance(result, int | float):
        raise TypeError(
            f"the agent must return a number, None or a dict with 'reward'; got {type(result).__name__}: {result!r}"
        )
    if not math.isfinite(result):
        raise ValueError(f"the agent returned a non-finite reward: {result!r}")
    return float(result)
