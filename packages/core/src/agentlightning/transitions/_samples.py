"""Trained calls as samples, and samples merged into trajectories (the builder's last phase).

A sample is a `TransitionFields` dict that becomes a Transition's ``__dict__`` (`agentlightning._fast.new_transition`,
without validation): every value is produced in the form the model requires, so the rules of `Transition` hold
(one mask entry and one finite log-prob per response token, finite rewards); ``test_fast.py`` checks the
result against validated construction.
"""

from __future__ import annotations

import math
import sys

from agentlightning._models import LLMCall, Span
from agentlightning._training_models import TransitionFields
from agentlightning.semconv import RESPONSE_LOGPROBS
from agentlightning.transitions._config import TransitionDiagnostics

__all__ = [
    "describe",
    "merge_trajectories",
    "no_ids_reason",
    "reward_overflow",
    "span_logprobs",
]

_LARGEST = sys.float_info.max


def no_ids_reason(call: LLMCall) -> str:
    """Why a proxy record trains nothing: it has no prompt or no response token ids (and why the call failed)."""
    prompt, response = call.prompt_token_ids, call.response_token_ids
    reason = f"proxy record {call.call_id} has no token ids ({len(prompt)} prompt, {len(response)} response ids)"
    return reason + f"; the call failed: {call.error}" if call.error else reason


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


def describe(sample: TransitionFields) -> str:
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
    calls: list[TransitionFields], diag: TransitionDiagnostics, problems: list[str]
) -> list[TransitionFields]:
    """Merge each agent's successive calls while its prompts extend the previous prompt + response."""
    samples: list[TransitionFields] = []
    open_by_agent: dict[str | None, TransitionFields] = {}
    for call in calls:
        agent = call["agent_name"]
        prompt: list[int] = call["prompt_token_ids"]
        response: list[int] = call["response_token_ids"]
        current = open_by_agent.get(agent)
        if current is not None:
            head: list[int] = current["prompt_token_ids"]
            tail: list[int] = current["response_token_ids"]
            n, m = len(head), len(tail)
            same_policy = current["policy"] == call["policy"]  # one sample trains one policy's weights
            if same_policy and len(prompt) >= n + m and prompt[:n] == head and prompt[n : n + m] == tail:
                observation = prompt[n + m :]
                tail += observation
                tail += response
                mask: list[int] = current["response_mask"]
                mask += [0] * len(observation)
                mask += call["response_mask"]
                logprobs: list[float] | None = current["response_logprobs"]
                if logprobs is not None and call["response_logprobs"] is not None:
                    logprobs += [0.0] * len(observation)
                    logprobs += call["response_logprobs"]
                else:
                    current["response_logprobs"] = None
                if call["intermediate_reward"] is not None:
                    total = call["intermediate_reward"] + (current["intermediate_reward"] or 0.0)
                    if math.isfinite(total):
                        current["intermediate_reward"] = total
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
        call["response_token_ids"] = list(response)
        if call["response_logprobs"] is not None:
            call["response_logprobs"] = list(call["response_logprobs"])
        call["step_index"] = len(samples)
        samples.append(call)
        open_by_agent[agent] = call
    return samples
