"""Supervised fine-tuning of a chat model on OpenAI-format conversations, rendered as the backend renders them.

`supervised_finetune` trains a model (e.g. from `build_chat_model`) on ``{"messages": [...], "tools": [...]}``
records (the OpenAI fine-tuning format). Each conversation is rendered by the tokenizer's own chat template exactly
as `LocalBackend` renders prompts (`HFChatTemplate`), and the loss covers only what the model generates: each
assistant turn's tokens up to and including its eos. So the model learns to write exactly what the backend's
tool-call parser reads back (a hermes ``<tool_call>`` block becomes an OpenAI ``tool_calls`` entry).

`tokenize_conversation` and `fit_examples` are its two halves, for callers that build token ids themselves or
draw fresh training data at every step.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Generator, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import torch
from transformers import PreTrainedModel
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from agentlightning_torch.models._chat import HFChatTemplate, TemplateError
from agentlightning_torch.models._loading import eos_token_ids

__all__ = [
    "SFTConfig",
    "SFTExample",
    "SFTResult",
    "fit_examples",
    "supervised_finetune",
    "tokenize_conversation",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SFTExample:
    """One training sequence: token ids and a loss mask (1 on the tokens the model learns to generate).

    Attributes:
        input_ids: The sequence.
        loss_mask: Same length; 1 where the token is a target (predicted from the tokens before it).
    """

    input_ids: tuple[int, ...]
    loss_mask: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.input_ids) != len(self.loss_mask):
            raise ValueError(
                f"input_ids ({len(self.input_ids)}) and loss_mask ({len(self.loss_mask)}) differ in length"
            )

    @property
    def target_count(self) -> int:
        """How many tokens carry loss (the first token never does: nothing predicts it)."""
        return sum(self.loss_mask[1:])


def _messages_and_tools(conversation: Any, where: str) -> tuple[list[Mapping[str, Any]], list[Mapping[str, Any]]]:
    if isinstance(conversation, Mapping):
        messages: Any = conversation.get("messages")  # pyright: ignore[reportUnknownMemberType]
        tools: Any = conversation.get("tools") or []  # pyright: ignore[reportUnknownMemberType]
    else:
        messages, tools = conversation, []
    if not isinstance(messages, Sequence) or isinstance(messages, str) or not messages:
        raise TemplateError(f"{where}: a conversation needs a non-empty 'messages' list")
    if not all(isinstance(m, Mapping) for m in messages):  # pyright: ignore[reportUnknownVariableType]
        raise TemplateError(f"{where}: every message must be an object with a 'role'")
    return list(messages), list(tools)  # pyright: ignore[reportUnknownArgumentType]


def tokenize_conversation(
    tokenizer: PreTrainedTokenizerBase,
    conversation: Mapping[str, Any] | Sequence[Mapping[str, Any]],
    *,
    stop_ids: Iterable[int] = (),
    template: HFChatTemplate | None = None,
) -> list[SFTExample]:
    """The training sequences of one conversation, rendered by the tokenizer's chat template like the backend does.

    For each assistant turn the prompt is rendered exactly as `LocalBackend` renders a request for the messages
    before it (`HFChatTemplate.render` with the tools and the generation prompt), and the target is the text the
    template writes for that turn, up to and including the first stop token (the eos that ends a turn). While each
    turn's prompt extends the previous sequence, turns share one sequence (prompt and tool results masked out);
    when a template rewrites history (e.g. drops old reasoning), the turn starts a new sequence. An assistant
    message with ``"weight": 0`` (OpenAI fine-tuning format) is context, not a target.

    Args:
        tokenizer: A tokenizer with a chat template.
        conversation: ``{"messages": [...], "tools": [...]}`` or a list of messages. Assistant tool calls are
            OpenAI ``tool_calls`` entries (``arguments`` a JSON string or an object).
        stop_ids: Ids that end a turn besides the tokenizer's eos (e.g. the generation config's eos ids).
        template: The renderer to use (default: ``HFChatTemplate(tokenizer)``).

    Returns:
        One or more sequences; empty when no assistant turn carries weight.

    Raises:
        TemplateError: If the conversation is malformed, an assistant turn comes first, the template does not
            render an assistant turn as a continuation of its generation prompt, or a turn has no stop token.
    """
    renderer = template or HFChatTemplate(tokenizer)
    stops = set(stop_ids) | eos_token_ids(tokenizer, None)
    messages, tools = _messages_and_tools(conversation, "conversation")
    examples: list[SFTExample] = []
    ids: list[int] = []
    mask: list[int] = []
    for index, message in enumerate(messages):
        if message.get("role") != "assistant" or message.get("weight", 1) == 0:
            continue
        where = f"messages[{index}] (assistant)"
        if index == 0:
            raise TemplateError(f"{where}: an assistant turn needs messages before it")
        context = messages[:index]
        prompt_text = renderer.render_text(context, tools=tools or None, add_generation_prompt=True)
        prompt = renderer.encode_text(prompt_text, add_special_tokens=False)
        full_text = renderer.render_text(messages[: index + 1], tools=tools or None, add_generation_prompt=False)
        if not full_text.startswith(prompt_text):
            raise TemplateError(
                f"{where}: the chat template does not render this turn as a continuation of its generation prompt"
            )
        response = renderer.encode_text(full_text[len(prompt_text) :], add_special_tokens=False)
        end = next((i for i, token in enumerate(response) if token in stops), None)
        if end is None:
            raise TemplateError(f"{where}: the chat template ends the turn with none of the stop ids {sorted(stops)}")
        response = response[: end + 1]
        if ids and prompt[: len(ids)] == ids:
            mask += [0] * (len(prompt) - len(ids))
        else:
            if ids:
                examples.append(SFTExample(tuple(ids), tuple(mask)))
            mask = [0] * len(prompt)
        ids = [*prompt, *response]
        mask += [1] * len(response)
    if ids:
        examples.append(SFTExample(tuple(ids), tuple(mask)))
    return examples


@dataclass(frozen=True)
class SFTConfig:
    """Settings of `fit_examples` / `supervised_finetune`.

    Attributes:
        steps: Optimizer steps.
        batch_size: Sequences per optimizer step.
        max_batch_tokens: Padded tokens per forward pass; a larger step is split into micro-batches whose
            gradients accumulate (the loss is the mean over all the step's target tokens either way).
        lr: Peak learning rate (AdamW).
        warmup_steps: Linear warm-up steps.
        schedule: Decay after warm-up: ``cosine`` or ``linear`` to zero, or ``constant``.
        betas: AdamW betas.
        weight_decay: AdamW weight decay.
        max_grad_norm: Gradient clipping norm (``None``: no clipping).
        seed: Seeds the data order (and torch's RNG during training).
        threads: torch CPU threads during training (``None``: leave as set).
        log_every: Log the loss every so many steps (0: never).
    """

    steps: int = 200
    batch_size: int = 16
    max_batch_tokens: int = 16384
    lr: float = 2e-3
    warmup_steps: int = 0
    schedule: Literal["cosine", "linear", "constant"] = "cosine"
    betas: tuple[float, float] = (0.9, 0.99)
    weight_decay: float = 0.0
    max_grad_norm: float | None = 1.0
    seed: int = 0
    threads: int | None = None
    log_every: int = 50

    def __post_init__(self) -> None:
        if self.steps < 1 or self.batch_size < 1 or self.max_batch_tokens < 1:
            raise ValueError("SFTConfig: steps, batch_size and max_batch_tokens must be at least 1")
        if self.lr <= 0 or self.warmup_steps < 0:
            raise ValueError("SFTConfig: lr must be positive and warmup_steps not negative")
        if self.schedule not in ("cosine", "linear", "constant"):
            raise ValueError(f"SFTConfig: unknown schedule {self.schedule!r} (cosine, linear or constant)")

    def learning_rate(self, step: int) -> float:
        """The learning rate of (0-based) ``step``: linear warm-up, then the schedule's decay."""
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        if self.schedule == "constant":
            return self.lr
        progress = (step - self.warmup_steps) / max(self.steps - self.warmup_steps, 1)
        if self.schedule == "linear":
            return self.lr * (1.0 - progress)
        return self.lr * 0.5 * (1.0 + math.cos(math.pi * progress))


@dataclass
class SFTResult:
    """What a fine-tuning run did.

    Attributes:
        losses: The loss of every step (mean cross-entropy over the step's target tokens).
        examples: Distinct training sequences (for `supervised_finetune`; 0 when batches were streamed).
        target_tokens: Target tokens trained on, summed over all steps.
        seconds: Wall time of the training loop.
    """

    losses: list[float] = field(default_factory=lambda: [])
    examples: int = 0
    target_tokens: int = 0
    seconds: float = 0.0

    @property
    def final_loss(self) -> float:
        """The last step's loss (NaN before any step)."""
        return self.losses[-1] if self.losses else float("nan")

    def summary(self) -> dict[str, float]:
        """Flat numbers for logs and JSON lines: first/final loss, steps, examples, target tokens, seconds."""
        data = asdict(self)
        del data["losses"]
        first = self.losses[0] if self.losses else float("nan")
        return {"first_loss": first, "loss": self.final_loss, "steps": float(len(self.losses)), **data}


@contextmanager
def _torch_threads(threads: int | None) -> Generator[None]:
    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _micro_batches(batch: Sequence[SFTExample], max_tokens: int) -> list[list[SFTExample]]:
    """The step's sequences as they are when they fit one pass, else by length into passes under the budget."""
    if len(batch) * max(len(e.input_ids) for e in batch) <= max_tokens:
        return [list(batch)]
    groups: list[list[SFTExample]] = [[]]
    for example in sorted(batch, key=lambda e: len(e.input_ids)):
        group = groups[-1]
        if group and (len(group) + 1) * len(example.input_ids) > max_tokens:
            groups.append(group := [])
        group.append(example)
    return groups


def _step_loss(
    model: PreTrainedModel, group: Sequence[SFTExample], pad_token_id: int, device: torch.device
) -> tuple[torch.Tensor, int]:
    """Mean cross-entropy over the group's target tokens, and how many there are."""
    width = max(len(e.input_ids) for e in group)
    input_ids = torch.full((len(group), width), pad_token_id, dtype=torch.long)
    labels = torch.full((len(group), width), -100, dtype=torch.long)
    attention = torch.zeros((len(group), width), dtype=torch.long)
    for row, example in enumerate(group):
        size = len(example.input_ids)
        input_ids[row, :size] = torch.tensor(example.input_ids)
        attention[row, :size] = 1
        labels[row, :size] = torch.tensor(
            [t if m else -100 for t, m in zip(example.input_ids, example.loss_mask, strict=True)]
        )
    logits = model(input_ids=input_ids.to(device), attention_mask=attention.to(device)).logits[:, :-1].float()
    targets = labels[:, 1:].to(device)
    loss = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100
    )
    return loss, int((targets != -100).sum())


def fit_examples(
    model: PreTrainedModel,
    batches: Iterable[Sequence[SFTExample]],
    config: SFTConfig,
    *,
    pad_token_id: int = 0,
) -> SFTResult:
    """Train ``model`` on token-id batches with a masked next-token loss; the lower half of `supervised_finetune`.

    One optimizer step per batch (up to ``config.steps``), micro-batched by ``config.max_batch_tokens`` with
    gradient accumulation, AdamW with the config's schedule and clipping. The model is left in eval mode.

    Args:
        model: A causal LM (on any device; batches follow it).
        batches: The sequences of each step (e.g. freshly generated data every step).
        config: Optimizer, schedule and batching settings (``batch_size`` and ``seed`` are the caller's).
        pad_token_id: Fills padding (masked out of attention and loss).

    Returns:
        Per-step losses and counts.

    Raises:
        ValueError: If a batch is empty or has no target token, or there are no batches.
    """
    device = next(model.parameters()).device
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=config.lr, betas=config.betas, weight_decay=config.weight_decay
    )
    result = SFTResult()
    started = time.perf_counter()
    model.train()
    try:
        with _torch_threads(config.threads), torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.seed)
            for step, batch in zip(range(config.steps), batches, strict=False):
                total = sum(e.target_count for e in batch)
                if total == 0:
                    raise ValueError(f"step {step}: the batch has no target tokens (nothing to learn from)")
                for group in optimizer.param_groups:
                    group["lr"] = config.learning_rate(step)
                optimizer.zero_grad(set_to_none=True)
                step_loss = 0.0
                for group in _micro_batches(batch, config.max_batch_tokens):
                    if not any(e.target_count for e in group):
                        continue
                    loss, count = _step_loss(model, group, pad_token_id, device)
                    share = loss * (count / total)
                    share.backward()  # pyright: ignore[reportUnknownMemberType]
                    step_loss += float(share.detach())
                if config.max_grad_norm is not None:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
                optimizer.step()
                result.losses.append(step_loss)
                result.target_tokens += total
                if config.log_every and (step % config.log_every == 0 or step == config.steps - 1):
                    logger.info("fine-tuning step %d/%d loss %.4f", step + 1, config.steps, step_loss)
    finally:
        model.eval()
    if not result.losses:
        raise ValueError("fit_examples: no batches to train on")
    result.seconds = time.perf_counter() - started
    return result


def _epochs(examples: Sequence[SFTExample], batch_size: int, rng: random.Random) -> Iterator[list[SFTExample]]:
    """Batches of a reshuffled pass over the examples, forever (a batch never repeats a sequence)."""
    size = min(batch_size, len(examples))
    pending: list[SFTExample] = []
    while True:
        order = list(examples)
        rng.shuffle(order)
        pending += order
        while len(pending) >= size:
            yield pending[:size]
            pending = pending[size:]


def supervised_finetune(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    conversations: Iterable[Mapping[str, Any] | Sequence[Mapping[str, Any]]],
    *,
    steps: int = 200,
    batch_size: int = 16,
    lr: float = 2e-3,
    warmup_steps: int | None = None,
    schedule: Literal["cosine", "linear", "constant"] = "cosine",
    max_batch_tokens: int = 16384,
    weight_decay: float = 0.0,
    max_grad_norm: float | None = 1.0,
    seed: int = 0,
    threads: int | None = None,
) -> SFTResult:
    """Fine-tune ``model`` on chat conversations, with loss only on the tokens it generates as the assistant.

    Each conversation is turned into sequences by `tokenize_conversation` (the backend's own rendering, tools
    included; stop ids from the model's generation config), then trained on in seeded shuffled passes. The same
    arguments give the same model on CPU.

    Args:
        model: A causal LM (e.g. from `build_chat_model`); trained in place and left in eval mode.
        tokenizer: Its tokenizer, with the chat template the model will be served with.
        conversations: OpenAI fine-tuning records ``{"messages": [...], "tools": [...]}`` (or message lists).
        steps: Optimizer steps.
        batch_size: Sequences per step (capped at the number of sequences).
        lr: Peak learning rate.
        warmup_steps: Linear warm-up; ``None`` means a tenth of ``steps``.
        schedule: ``cosine``, ``linear`` or ``constant`` after warm-up.
        max_batch_tokens: Padded tokens per forward pass (gradient accumulation beyond it).
        weight_decay: AdamW weight decay.
        max_grad_norm: Gradient clipping (``None``: off).
        seed: Data order and torch RNG seed.
        threads: torch CPU threads during training.

    Returns:
        Losses and counts (`SFTResult.summary` for a flat dict).

    Raises:
        ValueError: If there are no conversations or none has an assistant turn to learn; `TemplateError` (a
            ``ValueError``) names the conversation and message a template cannot render.
    """
    template = HFChatTemplate(tokenizer)
    stops = eos_token_ids(tokenizer, model.generation_config)
    examples: list[SFTExample] = []
    count = 0
    for index, conversation in enumerate(conversations):
        count += 1
        try:
            examples += tokenize_conversation(tokenizer, conversation, stop_ids=stops, template=template)
        except TemplateError as error:
            raise TemplateError(f"conversations[{index}]: {error}") from error
    if not examples:
        raise ValueError(
            "supervised_finetune: no training data: "
            + ("no conversations given" if not count else f"none of {count} conversations has an assistant turn")
        )
    config = SFTConfig(
        steps=steps,
        batch_size=batch_size,
        max_batch_tokens=max_batch_tokens,
        lr=lr,
        warmup_steps=steps // 10 if warmup_steps is None else warmup_steps,
        schedule=schedule,
        weight_decay=weight_decay,
        max_grad_norm=max_grad_norm,
        seed=seed,
        threads=threads,
    )
    pad: Any = tokenizer.pad_token_id
    batches = _epochs(examples, batch_size, random.Random(seed))
    result = fit_examples(model, batches, config, pad_token_id=pad if isinstance(pad, int) else 0)
    result.examples = len(examples)
    return result
