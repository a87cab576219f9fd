"""Calculator episodes run directly on a model (no HTTP, no store): for evaluation and the bare-loop baseline.

The agent of the quickstart does the same through the framework; this module is the reference it is
compared with, and what ``tiny evaluate`` measures a checkpoint with.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from agentlightning_torch._calc import CALCULATOR_TOOL, MALFORMED_REWARD, CalcTask, evaluate_expression, score_answer
from agentlightning_torch._generate import GenerationResult, SamplingParams, generate_batch
from agentlightning_torch._template import CalcChatTemplate

__all__ = ["CalcEpisode", "run_calc_episodes", "summarize_episodes"]


@dataclass
class CalcEpisode:
    """One finished episode as a single trajectory sample.

    Attributes:
        task: The question.
        prompt_ids: The first prompt.
        response_ids: First response, then (after a tool call) the observation and the second response.
        response_mask: 1 on generated tokens, 0 on observation tokens.
        logprobs: Behaviour log-probs (0.0 on observation tokens).
        reward: 1 correct, 0 wrong, -0.1 malformed.
        used_tool: Whether the first response called the calculator.
        final_text: The text scored as the answer.
    """

    task: CalcTask
    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    logprobs: list[float]
    reward: float
    used_tool: bool
    final_text: str


def run_calc_episodes(
    model: PreTrainedModel,
    template: CalcChatTemplate,
    tasks: Sequence[CalcTask],
    params: SamplingParams,
    *,
    generator: torch.Generator | None = None,
) -> list[CalcEpisode]:
    """Run every task for one episode: all first turns in one batch, then all second turns in one batch."""
    tokenizer = template.tokenizer
    tools = [CALCULATOR_TOOL]
    conversations = [[{"role": "user", "content": task.question}] for task in tasks]
    prompts = [template.render(c, tools=tools) for c in conversations]

    def sample(batch: list[list[int]]) -> list[GenerationResult]:
        return generate_batch(
            model,
            batch,
            [params] * len(batch),
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            generator=generator,
        )

    first = sample(prompts)
    episodes: list[CalcEpisode] = []
    second_prompts: list[list[int]] = []
    second_rows: list[int] = []
    for row, (task, prompt, result) in enumerate(zip(tasks, prompts, first, strict=True)):
        parsed = template.parse_response(result.token_ids, tools=tools)
        episode = CalcEpisode(
            task=task,
            prompt_ids=prompt,
            response_ids=list(result.token_ids),
            response_mask=[1] * len(result.token_ids),
            logprobs=list(result.logprobs),
            reward=MALFORMED_REWARD,
            used_tool=bool(parsed.tool_calls),
            final_text=parsed.content or "",
        )
        episodes.append(episode)
        if parsed.tool_calls and result.finish_reason == "stop":
            expression = tokenizer.decode(result.token_ids)[len("CALC(") : -1]
            value = evaluate_expression(expression)
            observation = template.tokenizer.encode(f"R:{'E' if value is None else value}\n")
            episode.response_ids += observation
            episode.response_mask += [0] * len(observation)
            episode.logprobs += [0.0] * len(observation)
            second_prompts.append(prompt + result.token_ids + observation)
            second_rows.append(row)
        elif not parsed.tool_calls:
            episode.reward = score_answer(episode.final_text, task.answer)
    if second_prompts:
        second = sample(second_prompts)
        for row, result in zip(second_rows, second, strict=True):
            episode = episodes[row]
            episode.response_ids += result.token_ids
            episode.response_mask += [1] * len(result.token_ids)
            episode.logprobs += result.logprobs
            episode.final_text = tokenizer.decode(result.token_ids)
            episode.reward = score_answer(episode.final_text, episode.task.answer)
    return episodes


def summarize_episodes(episodes: Sequence[CalcEpisode]) -> dict[str, float]:
    """Mean reward, accuracy (reward 1), tool use and malformed rate of a set of episodes."""
    count = max(len(episodes), 1)
    return {
        "reward": sum(e.reward for e in episodes) / count,
        "accuracy": sum(e.reward == 1.0 for e in episodes) / count,
        "tool_use": sum(e.used_tool for e in episodes) / count,
        "malformed": sum(e.reward == MALFORMED_REWARD for e in episodes) / count,
    }
