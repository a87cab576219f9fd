"""What user code calls inside an agent: rewards, annotations and the model endpoint of the rollout."""

from __future__ import annotations

import math
import time
import warnings
from typing import Any

from agentlightning import semconv
from agentlightning.tracing._context import current_rollout

__all__ = ["emit_annotation", "emit_reward", "llm_base_url"]

_SCALARS = (str, bool, int, float)


def _check_number(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{what} must be a number (int or float), got {type(value).__name__}: {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{what} must be a finite number, got {value!r}")
    return float(value)


def _emit_point_span(name: str, attributes: dict[str, Any]) -> None:
    # Imported here: the provider module pulls in the OpenTelemetry SDK.
    from agentlightning.tracing._provider import light_tracer

    at = time.time_ns()
    span = light_tracer("agentlightning").start_span(name, attributes=attributes, start_time=at)
    span.end(end_time=at)


def emit_reward(value: float, name: str | None = None, final: bool = False) -> None:
    """Record a reward in the current rollout (a zero-duration span of kind ``reward``).

    Args:
        value: The reward; any finite int or float.
        name: Optional label (e.g. ``"format"``, ``"correctness"``).
        final: Whether this is the episode's final reward (the agent's return value is emitted as final).

    Raises:
        TypeError: If ``value`` is not a number or ``name`` is not a string.
        ValueError: If ``value`` is NaN or infinite.
    """
    reward = _check_number(value, "reward value")
    if name is not None and not isinstance(name, str):  # pyright: ignore[reportUnnecessaryIsInstance]
        raise TypeError(f"reward name must be a string or None, got {type(name).__name__}")
    if current_rollout() is None:
        warnings.warn("emit_reward() called outside a rollout; the reward is not recorded", stacklevel=2)
        return
    attributes: dict[str, Any] = {
        semconv.SPAN_KIND: semconv.KIND_REWARD,
        semconv.REWARD_VALUE: reward,
        semconv.REWARD_FINAL: bool(final),
    }
    if name is not None:
        attributes[semconv.REWARD_NAME] = name
    _emit_point_span("agentlightning.reward", attributes)


def _check_attribute(key: str, value: object) -> Any:
    if isinstance(value, _SCALARS):
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"annotation {key!r} must be a finite number, got {value!r}")
        return value
    if isinstance(value, list | tuple):
        items: list[Any] = list(value)  # pyright: ignore[reportUnknownArgumentType]
        kinds = {type(item) for item in items}
        if len(kinds) > 1 or (kinds and not kinds <= {str, bool, int, float}):
            raise TypeError(f"annotation {key!r} must be a list of one scalar type (str, bool, int or float)")
        for item in items:
            if isinstance(item, float) and not math.isfinite(item):
                raise ValueError(f"annotation {key!r} must hold finite numbers, got {item!r}")
        return items
    raise TypeError(
        f"annotation {key!r} must be a str, bool, int, float or a list of one of them, got {type(value).__name__}"
    )


def emit_annotation(**attributes: Any) -> None:
    """Record free-form facts in the current rollout (a span of kind ``annotation``).

    Each keyword becomes the attribute ``agentlightning.annotation.<key>``.

    Raises:
        ValueError: If no attribute is given or a number is NaN/infinite.
        TypeError: If a value is not an OpenTelemetry attribute value (scalar or list of one scalar type).
    """
    if not attributes:
        raise ValueError("emit_annotation() needs at least one keyword attribute")
    checked = {semconv.ANNOTATION_PREFIX + key: _check_attribute(key, value) for key, value in attributes.items()}
    if current_rollout() is None:
        warnings.warn("emit_annotation() called outside a rollout; the annotation is not recorded", stacklevel=2)
        return
    checked[semconv.SPAN_KIND] = semconv.KIND_ANNOTATION
    _emit_point_span("agentlightning.annotation", checked)


def llm_base_url() -> str:
    """The OpenAI-compatible base URL the agent must use in this rollout (the LLM proxy, tagged with its ids).

    Under a runner it is the stable URL of the runner's worker slot (``{proxy}/slot/{key}/v1``): the same from one
    rollout to the next, so a framework that caches HTTP clients per base URL reuses them, while the proxy still
    records each call under the attempt the slot runs. Otherwise (when the LLM resource carries no runner token, see
    `agentlightning.proxy.LLMProxy.llm_resource`, or the proxy does not know slots) it is the per-rollout URL
    ``{proxy}/rollout/{rollout_id}/attempt/{attempt_id}/v1``. Either way, a call made after the attempt ended is
    refused (409) when the runner could tell the proxy of the end.

    It ends in ``/v1``, as OpenAI's SDKs want it. Anthropic's SDKs add ``/v1`` themselves: give them
    ``agl.llm_base_url().removesuffix("/v1")`` (the proxy serves their ``/v1/messages`` under the same prefix).

    Raises:
        RuntimeError: Outside a rollout, or when the rollout's resources hold no LLM resource.
    """
    ctx = current_rollout()
    if ctx is None:
        raise RuntimeError("llm_base_url() was called outside a rollout; run the agent through agl.Runner")
    if ctx.llm_base_url is not None:
        return ctx.llm_base_url
    llm = ctx.resources.llm if ctx.resources is not None else None
    if llm is None:
        raise RuntimeError(
            f"rollout {ctx.rollout_id} has no LLM resource; add one with "
            "store.add_resources(Resources(resources_id=..., items={'llm': proxy.llm_resource(model=...)}))"
        )
    return llm.base_url(ctx.rollout_id, ctx.attempt_id)
