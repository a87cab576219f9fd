"""The quickstart's tiny calculator model: a standard Hugging Face tokenizer + chat template, a ~1M-parameter Llama,
its deterministic warm start, and direct (no HTTP) evaluation.

The shipped ``examples/calc/checkpoint`` is made by::

    python examples/calc/calc_model.py warmstart --out examples/calc/checkpoint    # ~3 min on one idle thread
    python examples/calc/calc_model.py evaluate --model examples/calc/checkpoint

The folder is a plain ``save_pretrained`` folder: ``AutoModelForCausalLM`` / ``AutoTokenizer`` (and so the
trainer's backend, vLLM or any transformers user) load it like any other chat model. The tokenizer maps each
character of the task's alphabet to one token (ids 0, 1, 2 are ``<pad>``, ``<eos>``, ``<bos>``); the chat
template renders a conversation as::

    <bos> user text "\\n"  [ "CALC(" expression ")" <eos>  "R:" tool result "\\n" ]  answer <eos>

and is prefix-extending, so the turns of an episode merge into one training sample. Tool calls are parsed back
by the backend's ``calc`` tool-call parser.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import random
import re
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedModel, PreTrainedTokenizerFast

sys.path.insert(0, str(Path(__file__).resolve().parent))

from calc_task import CALCULATOR_TOOL, MALFORMED_REWARD, CalcTask, evaluate_expression, make_calc_tasks, score_answer

from agentlightning_torch import GenerationResult, SamplingParams, generate_batch

__all__ = [
    "CALC_ALPHABET",
    "CHAT_TEMPLATE",
    "CalcEpisode",
    "WarmStartConfig",
    "build_model",
    "build_tokenizer",
    "render",
    "run_calc_episodes",
    "summarize_episodes",
    "warm_start",
]

logger = logging.getLogger(__name__)

CALC_ALPHABET = "0123456789+-*()=:\nQACLRE"
"""Every character the calculator task uses: digits, operators, brackets, separators and the tag letters."""

SPECIAL_TOKENS = ("<pad>", "<eos>", "<bos>")

CHAT_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{%- if message.content is string -%}{%- set text = message.content -%}"
    "{%- elif message.content -%}{%- set text = message.content | map(attribute='text') | join('') -%}"
    "{%- else -%}{%- set text = '' -%}{%- endif -%}"
    "{%- if message.role in ['system', 'developer', 'user'] -%}{{- text + '\\n' -}}"
    "{%- elif message.role == 'assistant' -%}"
    "{%- if text or not message.tool_calls -%}{{- text + eos_token -}}{%- endif -%}"
    "{%- for call in message.tool_calls or [] -%}"
    "{%- set call = call.function if call.function is defined else call -%}"
    "{%- if call.name != 'calculator' -%}"
    "{{- raise_exception('only the calculator tool can be rendered, got ' + call.name) -}}"
    "{%- endif -%}"
    "{%- if call.arguments is string or call.arguments.expression is not string -%}"
    "{{- raise_exception('calculator arguments must be an object with an expression string') -}}"
    "{%- endif -%}"
    "{{- 'CALC(' + call.arguments.expression + ')' + eos_token -}}"
    "{%- endfor -%}"
    "{%- elif message.role == 'tool' -%}{{- 'R:' + text + '\\n' -}}"
    "{%- else -%}{{- raise_exception('unsupported role ' + message.role) -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
)
"""The Jinja chat template (tool-call ``arguments`` as objects, as Hugging Face templates take them)."""

_CALL = re.compile(r"CALC\((.*)\)", re.DOTALL)


def build_tokenizer() -> PreTrainedTokenizerFast:
    """The character tokenizer as a standard fast tokenizer, with the chat template set."""
    vocab = {token: index for index, token in enumerate([*SPECIAL_TOKENS, *CALC_ALPHABET])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=None))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")  # every character on its own
    backend.decoder = decoders.Fuse()  # join characters back without spaces
    backend.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in SPECIAL_TOKENS])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>", model_max_length=128
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def render(tokenizer: Any, messages: Sequence[Mapping[str, Any]]) -> list[int]:
    """Token ids of ``messages`` through the tokenizer's chat template (what the backend renders too)."""
    text = tokenizer.apply_chat_template(list(messages), tools=[CALCULATOR_TOOL], tokenize=False)
    return list(tokenizer.encode(text, add_special_tokens=False))


def build_model(
    tokenizer: Any,
    *,
    seed: int = 0,
    hidden_size: int = 128,
    num_layers: int = 4,
    num_heads: int = 4,
    intermediate_size: int = 512,
    max_positions: int = 128,
) -> LlamaForCausalLM:
    """A deterministic randomly initialised Llama causal LM sized for ``tokenizer`` (defaults: ~1.05M parameters)."""
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model = LlamaForCausalLM(config)
    finally:
        torch.random.set_rng_state(state)
    model.eval()
    return model


# ----- warm start ------------------------------------------------------------------------------------------------


class WarmStartConfig(BaseModel):
    """Settings of the supervised warm start (defaults: the measured recipe, ~3 minutes on one CPU thread).

    The transcripts teach the format, not arithmetic: a quarter call the calculator and copy its result, the rest
    answer directly and are right only 30% of the time, so the warm model uses the tool ~20% of the time and RL
    has a clear signal to amplify.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    steps: int = Field(default=400, ge=1)
    batch_size: int = Field(default=128, ge=1)
    lr: float = Field(default=2e-3, gt=0)
    warmup_steps: int = Field(default=50, ge=0)
    tool_fraction: float = Field(default=0.25, ge=0, le=1)
    direct_accuracy: float = Field(default=0.3, ge=0, le=1)
    seed: int = 0


def _encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def make_transcript(
    tokenizer: Any, task: CalcTask, rng: random.Random, config: WarmStartConfig
) -> tuple[list[int], list[int]]:
    """Token ids of one synthetic episode and its loss mask (1 on the policy's tokens only)."""
    eos = tokenizer.eos_token_id
    prompt = render(tokenizer, [{"role": "user", "content": task.question}])
    if rng.random() < config.tool_fraction:
        call = [*_encode(tokenizer, f"CALC({task.expression})"), eos]
        observation = _encode(tokenizer, f"R:{task.answer}\n")
        answer = [*_encode(tokenizer, f"A:{task.answer}"), eos]
        mask = [0] * len(prompt) + [1] * len(call) + [0] * len(observation) + [1] * len(answer)
        return prompt + call + observation + answer, mask
    value = task.answer
    if rng.random() >= config.direct_accuracy:
        spread = max(10, abs(task.answer) // 5)
        value = task.answer + rng.choice((-1, 1)) * rng.randint(1, spread)
    answer = [*_encode(tokenizer, f"A:{value}"), eos]
    return prompt + answer, [0] * len(prompt) + [1] * len(answer)


def _learning_rate(step: int, config: WarmStartConfig) -> float:
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(config.steps - config.warmup_steps, 1)
    return config.lr * 0.5 * (1.0 + math.cos(math.pi * progress))


def warm_start(
    config: WarmStartConfig | None = None,
) -> tuple[LlamaForCausalLM, PreTrainedTokenizerFast, dict[str, float]]:
    """Build the tiny model from the seed and train it on synthetic transcripts (deterministic on CPU)."""
    config = config or WarmStartConfig()
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, seed=config.seed)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, betas=(0.9, 0.99), weight_decay=0.0)
    rng = random.Random(config.seed)
    started = time.perf_counter()
    loss_value = float("nan")
    for step in range(config.steps):
        tasks = make_calc_tasks(config.batch_size, seed=rng.getrandbits(32))
        pairs = [make_transcript(tokenizer, task, rng, config) for task in tasks]
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
    return (
        model,
        tokenizer,
        {"loss": loss_value, "seconds": time.perf_counter() - started, "steps": float(config.steps)},
    )


def save(model: PreTrainedModel, tokenizer: Any, directory: Path) -> None:
    """A plain ``save_pretrained`` folder: config, weights, generation config, tokenizer with its chat template."""
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    # Name the class every transformers version (and vLLM) knows; transformers 5 writes its new alias.
    config_file = directory / "tokenizer_config.json"
    tokenizer_config = json.loads(config_file.read_text(encoding="utf-8"))
    tokenizer_config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_file.write_text(json.dumps(tokenizer_config, indent=2) + "\n", encoding="utf-8")


# ----- direct evaluation (no HTTP, no store) -----------------------------------------------------------------------


@dataclass
class CalcEpisode:
    """One finished episode as a single trajectory sample (observation tokens masked out)."""

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
    tokenizer: Any,
    tasks: Sequence[CalcTask],
    params: SamplingParams,
    *,
    generator: torch.Generator | None = None,
) -> list[CalcEpisode]:
    """Run every task for one episode: all first turns in one batch, then all second turns in one batch."""

    def sample(batch: list[list[int]]) -> list[GenerationResult]:
        return generate_batch(
            model,
            batch,
            [params] * len(batch),
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            generator=generator,
        )

    prompts = [render(tokenizer, [{"role": "user", "content": task.question}]) for task in tasks]
    episodes: list[CalcEpisode] = []
    second_prompts: list[list[int]] = []
    second_rows: list[int] = []
    for row, (task, prompt, result) in enumerate(zip(tasks, prompts, sample(prompts), strict=True)):
        text = tokenizer.decode(result.token_ids, skip_special_tokens=True)
        call = _CALL.fullmatch(text)
        episode = CalcEpisode(
            task=task,
            prompt_ids=prompt,
            response_ids=list(result.token_ids),
            response_mask=[1] * len(result.token_ids),
            logprobs=list(result.logprobs),
            reward=MALFORMED_REWARD,
            used_tool=call is not None,
            final_text="" if call else text,
        )
        episodes.append(episode)
        if call is not None and result.finish_reason == "stop":
            value = evaluate_expression(call.group(1))
            observation = _encode(tokenizer, f"R:{'E' if value is None else value}\n")
            episode.response_ids += observation
            episode.response_mask += [0] * len(observation)
            episode.logprobs += [0.0] * len(observation)
            second_prompts.append(prompt + list(result.token_ids) + observation)
            second_rows.append(row)
        elif call is None:
            episode.reward = score_answer(text, task.answer)
    if second_prompts:
        for row, result in zip(second_rows, sample(second_prompts), strict=True):
            episode = episodes[row]
            episode.response_ids += result.token_ids
            episode.response_mask += [1] * len(result.token_ids)
            episode.logprobs += result.logprobs
            episode.final_text = tokenizer.decode(result.token_ids, skip_special_tokens=True)
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


EVAL_SEED = 1_000_003
"""Seed of the held-out evaluation tasks (training tasks are drawn from other seeds)."""


def evaluate(model: PreTrainedModel, tokenizer: Any, *, tasks: int = 256, seed: int = EVAL_SEED) -> dict[str, float]:
    """Sampled (temperature 1) and greedy figures of ``model`` on ``tasks`` held-out questions."""
    held_out = make_calc_tasks(tasks, seed=seed)
    generator = torch.Generator().manual_seed(seed)
    sampled = summarize_episodes(
        run_calc_episodes(
            model, tokenizer, held_out, SamplingParams(temperature=1.0, max_tokens=24), generator=generator
        )
    )
    greedy = summarize_episodes(
        run_calc_episodes(model, tokenizer, held_out, SamplingParams(temperature=0.0, max_tokens=24))
    )
    return {
        "sampled_reward": sampled["reward"],
        "sampled_tool_use": sampled["tool_use"],
        "sampled_accuracy": sampled["accuracy"],
        "greedy_accuracy": greedy["accuracy"],
        "greedy_tool_use": greedy["tool_use"],
    }


def main(argv: Sequence[str] | None = None) -> int:
    """``warmstart --out DIR`` trains and saves the warm start; ``evaluate --model DIR`` measures a folder."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    warm = commands.add_parser("warmstart", help="train the warm start and save it")
    warm.add_argument("--out", required=True, type=Path, help="folder to write the model + tokenizer into")
    warm.add_argument("--steps", type=int, default=WarmStartConfig().steps)
    warm.add_argument("--seed", type=int, default=WarmStartConfig().seed)
    warm.add_argument("--batch-size", type=int, default=WarmStartConfig().batch_size)
    warm.add_argument("--eval-tasks", type=int, default=256, help="held-out tasks to evaluate on (0 to skip)")
    check = commands.add_parser("evaluate", help="measure a saved model folder")
    check.add_argument("--model", required=True, type=Path)
    check.add_argument("--tasks", type=int, default=256)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    torch.set_num_threads(1)
    if args.command == "warmstart":
        config = WarmStartConfig(steps=args.steps, seed=args.seed, batch_size=args.batch_size)
        model, tokenizer, metrics = warm_start(config)
        save(model, tokenizer, args.out)
        report = {"parameters": float(sum(p.numel() for p in model.parameters())), **metrics}
        if args.eval_tasks:
            report.update(evaluate(model, tokenizer, tasks=args.eval_tasks))
    else:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model = AutoModelForCausalLM.from_pretrained(args.model)
        report = evaluate(model.eval(), AutoTokenizer.from_pretrained(args.model), tasks=args.tasks)
    print(json.dumps({k: round(v, 4) for k, v in report.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
