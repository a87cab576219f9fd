"""The math example's small model: a byte-level BPE tokenizer, a compact hermes-style chat template, a ~0.5M-parameter
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
declares it) and leaves RL one early choice to make: calling the calculator, with the right numbers copied into the
expression, is made reliable but rare (the first token picks it ~25% of the time); answering at once, with a wrong
guess, is the habit. See `WarmStartConfig` and the README.
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

from agentlightning_torch import chatml_template

sys.path.insert(0, str(Path(__file__).resolve().parent))

from math_agent import SYSTEM_MESSAGE, calculator
from math_task import MathProblem, evaluate_expression, make_problems, split_problems

__all__ = [
    "MATH_CHAT_TEMPLATE",
    "WarmStartConfig",
    "calculator_tools",
    "transcript",
    "warm_start",
]

logger = logging.getLogger(__name__)

MATH_CHAT_TEMPLATE = chatml_template(
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
    """Settings of the supervised warm start (defaults: the measured recipe; fresh problems every step).

    Each step trains on ``batch_size`` fresh problems: ``tool_fraction`` of them as calculator transcripts (the
    gold expression, copied number by number, then the tool's result copied as the answer), the rest as an
    immediate guess that is wrong (the model cannot do the arithmetic itself). The first assistant token decides
    the path (``<tool_call>`` or ``About``); it is a training target in only part of the calculator transcripts,
    so that the warm model *chooses* the calculator with probability ``tool_choice`` while every calculator
    transcript still teaches the copying. The aim: a model that is right when it calls the calculator but rarely
    does, so its greedy accuracy is near 0 and RL has one early choice to move (the README has what it reached).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    steps: int = Field(default=500, ge=1)
    batch_size: int = Field(default=32, ge=1)
    lr: float = Field(default=5e-3, gt=0)
    warmup_steps: int = Field(default=30, ge=0)
    tool_fraction: float = Field(default=0.8, gt=0, le=1)
    tool_choice: float = Field(default=0.25, ge=0, lt=1)
    distractor_fraction: float = Field(default=0.0, ge=0, le=1)
    vocab_size: int = Field(default=640, ge=300)
    hidden_size: int = Field(default=128, ge=16)
    num_layers: int = Field(default=2, ge=1)
    num_heads: int = Field(default=4, ge=1)
    intermediate_size: int = Field(default=384, ge=16)
    max_positions: int = Field(default=256, ge=64)
    seed: int = 0
    threads: int = Field(default=1, ge=1)

    @property
    def decision_fraction(self) -> float:
        """Share of calculator transcripts whose first token (the path choice) is a target: gives `tool_choice`."""
        if self.tool_choice > self.tool_fraction:
            raise ValueError(f"tool_choice ({self.tool_choice}) cannot exceed tool_fraction ({self.tool_fraction})")
        if self.tool_fraction == 1.0:
            return 1.0
        return self.tool_choice * (1 - self.tool_fraction) / (self.tool_fraction * (1 - self.tool_choice))


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
        # A guess, worded so that its first token is one word: the path choice is then between two tokens
        # (``<tool_call>`` or ``About``), not between the calculator and ten digits (greedy would pick the tool).
        answer, offset = int(problem.answer), rng.randint(1, 20)
        wrong = answer - offset if rng.random() < 0.5 and answer > offset else answer + offset
        messages.append({"role": "assistant", "content": f"About {wrong}."})
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


def _tokenizer_corpus(seed: int) -> list[str]:
    """Text the BPE merges are learned from: questions, the system message, the rendered tool turns."""
    texts = [p.question for p in make_problems(3000, seed=seed + 17)]
    texts += [SYSTEM_MESSAGE, "calculator(expression): Evaluate arithmetic.", "system user assistant"] * 200
    texts += ["<tools>\ncalculator</tools>", "assistant\n<tool_call>", "About 12."] * 1000  # single tokens
    texts += ['{"name": "calculator", "arguments": {"expression": "12*7-15"}}'] * 200
    return texts


def build_model(config: WarmStartConfig) -> tuple[Any, Any]:
    """The untrained model and its tokenizer (BPE merges learned from generated questions), from the seed."""
    from transformers import AutoTokenizer

    from agentlightning_torch import build_chat_model, save_checkpoint, train_chat_tokenizer

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
    return model, tokenizer


def warm_start(config: WarmStartConfig | None = None) -> tuple[Any, Any, dict[str, float]]:
    """Build tokenizer and model from the seed and fine-tune on fresh transcripts every step (deterministic on CPU).

    Returns:
        The model (eval mode), its tokenizer and a summary (loss, seconds, parameters).
    """
    from agentlightning_torch import SFTConfig, count_parameters, fit_examples

    config = config or WarmStartConfig()
    model, tokenizer = build_model(config)
    sft = SFTConfig(
        steps=config.steps,
        batch_size=config.batch_size,
        lr=config.lr,
        warmup_steps=config.warmup_steps,
        seed=config.seed,
        threads=config.threads,
    )
    result = fit_examples(model, training_batches(model, tokenizer, config), sft, pad_token_id=_pad(tokenizer))
    return (
        model,
        tokenizer,
        {"loss": result.final_loss, "seconds": result.seconds, "parameters": float(count_parameters(model))},
    )


def _pad(tokenizer: Any) -> int:
    return int(tokenizer.pad_token_id)


def _stops(model: Any) -> list[int]:
    eos = model.generation_config.eos_token_id
    return [eos] if isinstance(eos, int) else list(eos or [])


def training_batches(model: Any, tokenizer: Any, config: WarmStartConfig) -> Iterator[list[Any]]:
    """Fresh transcripts for every step, tokenised exactly as the backend renders the agent's requests.

    A calculator transcript keeps its first token (the path choice) as a target with probability
    `WarmStartConfig.decision_fraction`; otherwise only the rest of the path is learned.
    """
    from agentlightning_torch import SFTExample, tokenize_conversation

    stops = _stops(model)
    keep_decision = config.decision_fraction
    rng = random.Random(config.seed)
    while True:
        batch: list[Any] = []
        for problem in make_problems(config.batch_size, seed=rng.getrandbits(32)):
            if rng.random() >= config.tool_fraction:
                batch += tokenize_conversation(tokenizer, transcript(problem, "direct", rng), stop_ids=stops)
                continue
            behaviour = "distractor" if rng.random() < config.distractor_fraction else "tool"
            (example,) = tokenize_conversation(tokenizer, transcript(problem, behaviour, rng), stop_ids=stops)
            if rng.random() >= keep_decision:
                mask = list(example.loss_mask)
                mask[mask.index(1)] = 0  # the path choice is not taught by this transcript
                example = SFTExample(example.input_ids, tuple(mask))
            batch.append(example)
        yield batch


def tool_path_figures(model: Any, tokenizer: Any, problems: Sequence[MathProblem]) -> dict[str, float]:
    """How the model does on the calculator path, from one teacher-forced pass over gold calculator transcripts.

    ``tool_choice``: mean probability of choosing the calculator (``<tool_call>`` as the first token).
    ``tool_path_greedy_exact``: share of problems where greedy decoding, once on the calculator path, writes the
    gold call and copies the result exactly (every target token is the argmax). ``tool_path_sampled_exact``: mean
    probability that sampling at temperature 1 does (the product of the target tokens' probabilities).
    ``tool_call_greedy_exact``: the same as greedy exactness, for the calculator call alone.
    """
    import torch

    from agentlightning_torch import tokenize_conversation

    stops = _stops(model)
    rng = random.Random(0)
    choice, greedy, sampled, expression = 0.0, 0.0, 0.0, 0.0
    with torch.no_grad():
        for problem in problems:
            (example,) = tokenize_conversation(tokenizer, transcript(problem, "tool", rng), stop_ids=stops)
            ids = torch.tensor([example.input_ids])
            logprobs = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), dim=-1)
            positions = [i - 1 for i, m in enumerate(example.loss_mask) if m]
            targets = ids[0, [p + 1 for p in positions]]
            picked = logprobs[positions, targets]
            choice += float(picked[0].exp())
            greedy += float(bool((logprobs[positions[1:]].argmax(-1) == targets[1:]).all()))
            sampled += float(picked[1:].sum().exp())
            right = (logprobs[positions].argmax(-1) == targets).tolist()
            call_end = next(i for i in range(1, len(positions)) if positions[i] != positions[i - 1] + 1)
            expression += float(all(right[1:call_end]))  # the call alone (not the copy of the tool's result)
    n = max(len(problems), 1)
    return {
        "tool_choice": choice / n,
        "tool_path_greedy_exact": greedy / n,
        "tool_path_sampled_exact": sampled / n,
        "tool_call_greedy_exact": expression / n,
    }


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

        _, held_out = split_problems(1, args.eval_size, seed=0)
        report.update(tool_path_figures(model, tokenizer, held_out))
        # The real agent against the served model: greedy (what RL starts from), then sampled as in training.
        report.update(evaluate_folder(args.out, size=args.eval_size))
        sampled = evaluate_folder(args.out, size=args.eval_size, temperature=1.0)
        report.update({f"sampled_{key}": value for key, value in sampled.items() if key != "problems"})
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in report.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
