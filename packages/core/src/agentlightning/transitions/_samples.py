"""Trained calls as samples, and samples as `Transition`s: one per call, or merged into trajectories.

A sample is a dict that becomes a Transition's ``__dict__`` (the builder wraps it with `agentlightning._fast`,
without validation): every value is produced here in the form the model requires, so the rules of `Transition` hold
(one mask entry and one finite log-prob per response token, finite rewards); ``test_fast.py`` checks the
result against validated construction.
"""

from __future__ import annotations

import math
import sys
from typing import Any

from agentlightning._models import LLMCall, Span
from agentlightning.semconv import RESPONSE_LOGPROBS
from agentlightning.transitions._config import TransitionDiagnostics

__all__ = [
    "describe",
    "merge_trajectories",
    "no_ids_reason",
    "proxy_sample",
    "reward_overflow",
    "span_logprobs",
]

_LARGEST = sys.float_info.max


def no_ids_reason(call: LLMCall) -> str:
    """Why a proxy record trains nothing: it has no prompt or no response token ids (and why the call failed)."""
    prompt, response = call.prompt_token_ids, call.response_token_ids
    reason = f"proxy record {call.call_id} has no token ids ({len(prompt)} prompt, {len(response)} response ids)"
    return reason + f"; the call failed: {call.error}" if call.error else reason


def proxy_sample(
    rollout_id: str,
    attempt_id: str,
    group_id: str | None,
    agent: str | None,
    step_index: int,
    call: LLMCall,
    span_id: str | None,
    final_reward: float | None,
) -> dict[str, Any]:
    """The ``__dict__`` of a per-call transition made from a proxy record."""
    return {
        "rollout_id": rollout_id,
        "attempt_id": attempt_id,
        "group_id": group_id,
        "agent_name": agent,
        "step_index": step_index,
        "prompt_ids": call.prompt_token_ids,
        "response_ids": call.response_token_ids,
        "response_mask": [1] * len(call.response_token_ids),
        "logprobs": call.response_logprobs,
        "reward": None,
        "final_reward": final_reward,
        "call_ids": [call.call_id],
        "model_version": call.model_version,
        "policy": call.policy,
        "metadata": {"span_ids": [] if span_id is None else [span_id]},
    }


def span_logprobs(span: Span, response: list[int], problems: list[str]) -> list[float] | None:
    """The log-probs an LLM span carries as an attribute, if they are one finite float per response token.

    Anything else is reported in ``problems`` and dropped (``None``): the sample then trains without them.
    """
    value = span.attributes.get(RESPONSE_LOGPROBS)
    if value is None:
        return None
    if (
        isinstance(value, list)
        and len(value) == len(response)
        and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in value)
    ):
        # finite only (NaN and infinities fail the comparison), as a Transition's log-probs must be
        made = [float(x) for x in value if abs(x) <= _LARGEST]  # type: ignore[arg-type]  # checked just above
        if len(made) == len(value):
            return made
    problems.append(f"LLM span {span.span_id} has logprobs that do not match its response tokens; dropped")
    return None


def describe(sample: dict[str, Any]) -> str:
    """The LLM span (or, without one, the proxy record) a sample starts with, for problem messages."""
    span_ids: list[str] = sample["metadata"]["span_ids"]
    return f"LLM span {span_ids[0]}" if span_ids else f"proxy record {sample['call_ids'][0]}"


def reward_overflow(subject: str, diag: TransitionDiagnostics, problems: list[str]) -> None:
    """An intermediate reward that would make its step's sum infinite (a `Transition` holds finite rewards only)."""
    diag.invalid_rewards += 1
    problems.append(f"{subject}: the step's intermediate rewards overflow to a non-finite sum; not credited")


def _oldest(a: int | None, b: int | None) -> int | None:
    """The older of two model versions; unknown (``None``) if either is unknown."""
    return None if a is None or b is None else min(a, b)


def merge_trajectories(
    calls: list[dict[str, Any]], diag: TransitionDiagnostics, problems: list[str]
) -> list[dict[str, Any]]:
    """Merge each agent's successive calls while its prompts extend the previous prompt + response."""
    samples: list[dict[str, Any]] = []
    open_by_agent: dict[str | None, dict[str, Any]] = {}
    for call in calls:
        agent = call["agent_name"]
        prompt: list[int] = call["prompt_ids"]
        response: list[int] = call["response_ids"]
        current = open_by_agent.get(agent)
        if current is not None:
            head: list[int] = current["prompt_ids"]
            tail: list[int] = current["response_ids"]
            n, m = len(head), len(tail)
            same_policy = current["policy"] == call["policy"]  # one sample trains one policy's weights
            if same_policy and len(prompt) >= n + m and prompt[:n] == head and prompt[n : n + m] == tail:
                observation = prompt[n + m :]
                tail += observation
                tail += response
                mask: list[int] = current["response_mask"]
                mask += [0] * len(observation)
                mask += call["response_mask"]
                logprobs: list[float] | None = current["logprobs"]
                if logprobs is not None and call["logprobs"] is not None:
                    logprobs += [0.0] * len(observation)
                    logprobs += call["logprobs"]
                else:
                    current["logprobs"] = None
                if call["reward"] is not None:
                    total = call["reward"] + (current["reward"] or 0.0)
                    if math.isfinite(total):
                        current["reward"] = total
                    else:
                        reward_overflow(f"rewards of {describe(call)}", diag, problems)
                current["call_ids"] += call["call_ids"]
                current["model_version"] = _oldest(current["model_version"], call["model_version"])
                current["metadata"]["span_ids"] += call["metadata"]["span_ids"]
                diag.merged_calls += 1
                continue
            diag.trajectory_breaks += 1
            problems.append(
                f"{describe(call)} (agent {agent!r}): its prompt does not extend the agent's previous prompt + "
                "response (non-append history); started a new sample"
            )
        # copies: the lists grow when later calls are appended, and the proxy records must stay untouched
        call["response_ids"] = list(response)
        if call["logprobs"] is not None:
            call["logprobs"] = list(call["logprobs"])
        call["step_index"] = len(samples)
        samples.append(call)
        open_by_agent[agent] = call
    return samples
