"""The math example's small model: a byte-level BPE tokenizer, a compact hermes-style chat template, a ~2M-parameter
Qwen2, and its deterministic warm start from generated AutoGen transcripts.

The shipped ``examples/math/checkpoint`` is made by::

    python examples/math/math_model.py warmstart --out examples/math/checkpoint

It is a plain ``save_pretrained`` folder (``AutoModelForCausalLM`` / ``AutoTokenizer``, the trainer's backend or
vLLM load it). Conversations are rendered by `MATH_CHAT_TEMPLATE`: ChatML turns, hermes tool calls
(``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, parsed by the ``hermes`` parser) and tool results in
``<tool_response>`` blocks, but tools listed as one-line signatures (``calculator(expression): Evaluate
arithmetic.``) instead of their JSON schemas: the prompt is then ~70 tokens instead of ~210, and on a CPU the
prompt is most of the cost of every call.

The warm start trains on transcripts of exactly what AutoGen sends (its system message, the tool as AutoGen
declares it) and leaves room for RL: phase 1 teaches calling the calculator with the right numbers (a few
transcripts also add the distractor number); phase 2 makes answering at once, with a wrong number, the habit.
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import logging
import random
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

sys.path.insert(0, str(Path(__file__).resolve().parent))

from math_agent import SYSTEM_MESSAGE, calculator
from math_task import MathProblem, evaluate_expression, make_problems

__all__ = [
    "MATH_CHAT_TEMPLATE",
    "WarmStartConfig",
    "calculator_tools",
    "transcript",
    "warm_start",
]

logger = logging.getLogger(__name__)

MATH_CHAT_TEMPLATE = (
    "{%- set ns = namespace(system='') -%}"
    "{%- if messages and messages[0].role in ['system', 'developer'] -%}"
    "{%- set ns.system = messages[0].content -%}"
    "{%- set messages = messages[1:] -%}"
    "{%- endif -%}"
    "{%- if tools or ns.system -%}"
    "{{- '<|im_start|>system\\n' + ns.system -}}"
    "{%- if tools -%}"
    "{%- if ns.system -%}{{- '\\n' -}}{%- endif -%}"
    "{{- '<tools>' -}}"
    "{%- for tool in tools -%}"
    "{%- set f = tool.function if tool.function is defined else tool -%}"
    "{%- set props = f.parameters.properties if f.parameters is defined and f.parameters.properties is defined "
    "else {} -%}"
    "{{- '\\n' + f.name + '(' + (props | list | join(', ')) + '): ' + (f.description or '') -}}"
    "{%- endfor -%}"
    "{{- '\\n</tools>' -}}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if message.role == 'tool' -%}"
    "{%- if loop.first or loop.previtem.role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' -}}"
    "{%- if loop.last or loop.nextitem.role != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- elif message.role == 'assistant' -%}"
    "{{- '<|im_start|>assistant\\n' + (message.content or '') -}}"
    "{%- for call in message.tool_calls or [] -%}"
    "{%- set call = call.function if call.function is defined else call -%}"
    "{%- if message.content or not loop.first -%}{{- '\\n' -}}{%- endif -%}"
    '{{- \'<tool_call>\\n{"name": "\' + call.name + \'", "arguments": \' -}}'
    "{{- (call.arguments | tojson) + '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)
"""ChatML with hermes tool calls, tools listed as ``name(params): description`` lines (see the module docstring)."""


def calculator_tools() -> list[dict[str, Any]]:
    """The ``tools`` list AutoGen sends for the agent's calculator (built by AutoGen itself from the function)."""
    return copy.deepcopy(_calculator_tools())


@functools.cache
def _calculator_tools() -> list[dict[str, Any]]:
    from autogen_core.tools import FunctionTool

    schema: dict[str, Any] = dict(FunctionTool(calculator, description=calculator.__doc__ or "").schema)
    return [{"type": "function", "function": schema}]


class WarmStartConfig(BaseModel):
    """Settings of the supervised warm start (two phases, fresh problems every step).

    Phase 1 (``steps``) teaches the format and how to copy the problem's numbers into a calculator call: every
    transcript calls the calculator, and ``distractor_fraction`` of them also add the distractor number to the
    expression (e.g. ``12*7-15+9``). Phase 2 (``policy_steps``, a lower learning rate) sets the habits RL starts
    from: only ``tool_fraction`` of its transcripts call the calculator, the rest answer at once with a wrong
    number. The warm policy therefore rarely gets a problem right greedily, but its sampled calculator calls often
    do: RL has to find that calling the calculator pays (and that the distractor does not belong in it).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    steps: int = Field(default=450, ge=1)
    policy_steps: int = Field(default=50, ge=0)
    batch_size: int = Field(default=12, ge=1)
    lr: float = Field(default=2e-3, gt=0)
    policy_lr: float = Field(default=1e-3, gt=0)
    warmup_steps: int = Field(default=40, ge=0)
    tool_fraction: float = Field(default=0.3, ge=0, le=1)
    distractor_fraction: float = Field(default=0.1, ge=0, le=1)
    vocab_size: int = Field(default=640, ge=300)
    hidden_size: int = Field(default=192, ge=16)
    num_layers: int = Field(default=4, ge=1)
    num_heads: int = Field(default=4, ge=1)
    intermediate_size: int = Field(default=512, ge=16)
    max_positions: int = Field(default=256, ge=64)
    seed: int = 0
    threads: int = Field(default=1, ge=1)


def transcript(problem: MathProblem, behaviour: str, rng: random.Random) -> dict[str, Any]:
    """One OpenAI-format conversation (``{"messages", "tools"}``) of the agent on ``problem``.

    Args:
        problem: A generated problem (with its gold expression and distractor).
        behaviour: ``tool`` (the gold expression), ``distractor`` (gold + distractor) or ``direct`` (a wrong
            number, no tool).
        rng: Draws the wrong direct answer.
    """
    assert problem.expression is not None and problem.distractor is not None, "generated problems only"
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_MESSAGE},
        {"role": "user", "content": problem.question},
    ]
    if behaviour == "direct":
        wrong = int(problem.answer) + rng.choice((-1, 1)) * rng.randint(1, 20)
        messages.append({"role": "assistant", "content": str(wrong)})
    else:
        expression = problem.expression if behaviour == "tool" else f"{problem.expression}+{problem.distractor}"
        value = evaluate_expression(expression)
        result = "error" if value is None else str(value)  # what the agent's calculator answers
        arguments = json.dumps({"expression": expression})
        call = {"id": "call_0", "type": "function", "function": {"name": "calculator", "arguments": arguments}}
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "content": result, "tool_call_id": "call_0"},
            {"role": "assistant", "content": result},
        ]
    return {"messages": messages, "tools": calculator_tools()}


def _behaviour(rng: random.Random, tool_fraction: float, distractor_fraction: float) -> str:
    if rng.random() >= tool_fraction:
        return "direct"
    return "distractor" if rng.random() < distractor_fraction else "tool"


def _tokenizer_corpus(seed: int) -> list[str]:
    """Text the BPE merges are learned from: questions, the system message, the rendered tool turns."""
    texts = [p.question for p in make_problems(3000, seed=seed + 17)]
    texts += [SYSTEM_MESSAGE, "calculator(expression): Evaluate arithmetic.", "system user assistant"] * 200
    texts += ['{"name": "calculator", "arguments": {"expression": "12*7-15"}}'] * 200
    return texts


def warm_start(config: WarmStartConfig | None = None) -> tuple[Any, Any, dict[str, float]]:
    """Build tokenizer and model from the seed and fine-tune on fresh transcripts every step (deterministic on CPU).

    Returns:
        The model (eval mode), its tokenizer and a summary (losses, seconds, parameters).
    """
    from transformers import AutoTokenizer

    from agentlightning_torch import (
        build_chat_model,
        count_parameters,
        fit_examples,
        save_checkpoint,
        train_chat_tokenizer,
    )

    config = config or WarmStartConfig()
    tokenizer = train_chat_tokenizer(
        _tokenizer_corpus(config.seed),
        vocab_size=config.vocab_size,
        chat_template=MATH_CHAT_TEMPLATE,
        include_template_text=False,
        model_max_length=config.max_positions,
    )
    model = build_chat_model(
        tokenizer,
        hidden_size=config.hidden_size,
        num_layers=config.num_layers,
        num_heads=config.num_heads,
        intermediate_size=config.intermediate_size,
        max_positions=config.max_positions,
        seed=config.seed,
    )
    # Reload the tokenizer as users (and the backend) will: next to a Qwen2 config.json, AutoTokenizer applies
    # Qwen2's own pre-tokenizer (one token per digit), whatever the trained tokenizer.json says.
    with tempfile.TemporaryDirectory() as folder:
        save_checkpoint(model, tokenizer, folder)
        tokenizer = AutoTokenizer.from_pretrained(folder)
    result = fit_examples(
        model,
        _batches(model, tokenizer, config, 1.0, config.seed),
        _sft(config, "format"),
        pad_token_id=_pad(tokenizer),
    )
    summary = {"format_loss": result.final_loss, "format_seconds": result.seconds}
    if config.policy_steps:
        summary.update(tune_policy(model, tokenizer, config))
    summary["parameters"] = float(count_parameters(model))
    return model, tokenizer, summary


def tune_policy(model: Any, tokenizer: Any, config: WarmStartConfig) -> dict[str, float]:
    """Phase 2 of `warm_start` on its own (its own random stream: the same whether or not phase 1 ran just before)."""
    from agentlightning_torch import fit_examples

    batches = _batches(model, tokenizer, config, config.tool_fraction, config.seed + 1)
    result = fit_examples(model, batches, _sft(config, "policy"), pad_token_id=_pad(tokenizer))
    return {"policy_loss": result.final_loss, "policy_seconds": result.seconds}


def _pad(tokenizer: Any) -> int:
    return int(tokenizer.pad_token_id)


def _sft(config: WarmStartConfig, phase: str) -> Any:
    from agentlightning_torch import SFTConfig

    common: dict[str, Any] = {"batch_size": config.batch_size, "seed": config.seed, "threads": config.threads}
    if phase == "format":
        return SFTConfig(steps=config.steps, lr=config.lr, warmup_steps=config.warmup_steps, **common)
    return SFTConfig(steps=config.policy_steps, lr=config.policy_lr, schedule="constant", **common)


def _batches(
    model: Any, tokenizer: Any, config: WarmStartConfig, tool_fraction: float, seed: int
) -> Iterator[list[Any]]:
    """Fresh transcripts for every step, tokenised exactly as the backend renders the agent's requests."""
    from agentlightning_torch import tokenize_conversation

    stops = list(model.generation_config.eos_token_id or [])
    rng = random.Random(seed)
    while True:
        batch: list[Any] = []
        for problem in make_problems(config.batch_size, seed=rng.getrandbits(32)):
            behaviour = _behaviour(rng, tool_fraction, config.distractor_fraction)
            batch += tokenize_conversation(tokenizer, transcript(problem, behaviour, rng), stop_ids=stops)
        yield batch


def main(argv: Sequence[str] | None = None) -> int:
    """``warmstart --out DIR`` trains and saves the warm start, then scores it on held-out problems."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    warm = commands.add_parser("warmstart", help="train the warm start and save it")
    warm.add_argument("--out", required=True, type=Path, help="folder to write the model + tokenizer into")
    warm.add_argument("--steps", type=int, default=WarmStartConfig().steps)
    warm.add_argument("--seed", type=int, default=WarmStartConfig().seed)
    warm.add_argument("--eval-size", type=int, default=128, help="held-out problems to score it on (0: skip)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(message)s")
    logging.getLogger("agentlightning_torch").setLevel(logging.INFO)  # fine-tuning progress, not AutoGen's events
    from agentlightning_torch import save_checkpoint

    model, tokenizer, report = warm_start(WarmStartConfig(steps=args.steps, seed=args.seed))
    save_checkpoint(model, tokenizer, args.out)
    if args.eval_size:
        from math_eval import evaluate_folder

        report.update(evaluate_folder(args.out, size=args.eval_size))
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in report.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
