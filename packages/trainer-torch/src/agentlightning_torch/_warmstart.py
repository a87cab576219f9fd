"""Deterministic supervised warm start of the tiny model on synthetic calculator transcripts.

The transcripts teach the format, not arithmetic: a quarter call the calculator and copy its result, the rest
answer directly and are right only 30% of the time. The warm model therefore uses the tool about 20% of the
time and is almost never right when it answers directly, which leaves RL a clear signal to amplify.
"""

from __future__ import annotations

import logging
import math
import random
import time

import torch
from pydantic import BaseModel, ConfigDict, Field
from transformers import LlamaForCausalLM

from agentlightning_torch._calc import CalcTask, make_calc_tasks
from agentlightning_torch._model import build_tiny_model
from agentlightning_torch._template import CalcChatTemplate
from agentlightning_torch._tokenizer import CharTokenizer

__all__ = ["WarmStartConfig", "make_transcript", "warm_start"]

logger = logging.getLogger(__name__)


class WarmStartConfig(BaseModel):
    """Settings of the warm start (defaults: the measured recipe, about 3 minutes on one CPU thread).

    Attributes:
        steps: Optimizer steps.
        batch_size: Transcripts per step.
        lr: Peak AdamW learning rate.
        warmup_steps: Linear warm-up steps before cosine decay to 0.
        tool_fraction: Share of transcripts that call the calculator.
        direct_accuracy: Share of direct answers that are right.
        seed: Seeds the weights and the transcripts.
        num_threads: ``torch.set_num_threads`` value while training.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    steps: int = Field(default=400, ge=1)
    batch_size: int = Field(default=128, ge=1)
    lr: float = Field(default=2e-3, gt=0)
    warmup_steps: int = Field(default=50, ge=0)
    tool_fraction: float = Field(default=0.25, ge=0, le=1)
    direct_accuracy: float = Field(default=0.3, ge=0, le=1)
    seed: int = 0
    num_threads: int = Field(default=1, ge=1)


def make_transcript(
    template: CalcChatTemplate, task: CalcTask, rng: random.Random, config: WarmStartConfig
) -> tuple[list[int], list[int]]:
    """Token ids of one synthetic episode and its loss mask (1 on the policy's tokens only)."""
    tokenizer = template.tokenizer
    eos = tokenizer.eos_token_id
    prompt = template.render([{"role": "user", "content": task.question}])
    if rng.random() < config.tool_fraction:
        call = [*tokenizer.encode(f"CALC({task.expression})"), eos]
        observation = tokenizer.encode(f"R:{task.answer}\n")
        answer = [*tokenizer.encode(f"A:{task.answer}"), eos]
        ids = prompt + call + observation + answer
        mask = [0] * len(prompt) + [1] * len(call) + [0] * len(observation) + [1] * len(answer)
        return ids, mask
    value = task.answer
    if rng.random() >= config.direct_accuracy:
        spread = max(10, abs(task.answer) // 5)
        value = task.answer + rng.choice((-1, 1)) * rng.randint(1, spread)
    answer = [*tokenizer.encode(f"A:{value}"), eos]
    return prompt + answer, [0] * len(prompt) + [1] * len(answer)


def _learning_rate(step: int, config: WarmStartConfig) -> float:
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(config.steps - config.warmup_steps, 1)
    return config.lr * 0.5 * (1.0 + math.cos(math.pi * progress))


def warm_start(
    config: WarmStartConfig | None = None, tokenizer: CharTokenizer | None = None
) -> tuple[LlamaForCausalLM, CharTokenizer, dict[str, float]]:
    """Build the tiny model from the seed and train it on synthetic transcripts.

    Returns:
        The trained model (eval mode), its tokenizer, and metrics (final loss, seconds, steps).
    """
    config = config or WarmStartConfig()
    tokenizer = tokenizer or CharTokenizer()
    template = CalcChatTemplate(tokenizer)
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(config.num_threads)
    try:
        model = build_tiny_model(tokenizer, seed=config.seed)
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, betas=(0.9, 0.99), weight_decay=0.0)
        rng = random.Random(config.seed)
        started = time.perf_counter()
        loss_value = float("nan")
        for step in range(config.steps):
            tasks = make_calc_tasks(config.batch_size, seed=rng.getrandbits(32))
            pairs = [make_transcript(template, task, rng, config) for task in tasks]
            width = max(len(ids) for ids, _ in pairs)
            input_ids = torch.full((len(pairs), width), tokenizer.pad_token_id, dtype=torch.long)
            labels = torch.full((len(pairs), width), -100, dtype=torch.long)
            attention = torch.zeros((len(pairs), width), dtype=torch.long)
            for row, (ids, mask) in enumerate(pairs):
                input_ids[row, : len(ids)] = torch.tensor(ids)
                attention[row, : len(ids)] = 1
                labels[row, : len(ids)] = torch.tensor([t if m else -100 for t, m in zip(ids, mask, strict=True)])
            for group in optimizer.param_groups:
                group["lr"] = _learning_rate(step, config)
            logits = model(input_ids=input_ids, attention_mask=attention).logits[:, :-1].float()
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100
            )
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            loss_value = float(loss.item())
            if step % 50 == 0 or step == config.steps - 1:
                logger.info("warm start step %d/%d loss %.4f", step + 1, config.steps, loss_value)
        model.eval()
        metrics = {"loss": loss_value, "seconds": time.perf_counter() - started, "steps": float(config.steps)}
        return model, tokenizer, metrics
    finally:
        torch.set_num_threads(previous_threads)
