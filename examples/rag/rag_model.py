"""The RAG example's small model: a byte-level BPE tokenizer, a ~0.3M-parameter Qwen2, and its deterministic warm start.

The shipped ``examples/rag/checkpoint`` is made by::

    python examples/rag/rag_model.py warmstart --out examples/rag/checkpoint     # 320 steps, one CPU thread

It is a plain ``save_pretrained`` folder made with `agentlightning_torch`'s warm-start toolkit
(`train_chat_tokenizer`, `build_chat_model`, `fit_examples`, `save_checkpoint`): any transformers user, the
trainer's backend or vLLM load it. Its chat template is hermes-style (ChatML turns, ``<tool_call>{json}</tool_call>``
calls, ``<tool_response>`` results, read back by the ``hermes`` tool-call parser) but lists the tools in one short
line (``Tools: search(query)``) instead of their JSON schemas, because every prompt token costs CPU time here.

The warm-start transcripts are conversations of the agent in `rag_agent` over *other* worlds than the shipped one
(fresh seeds every step, so facts cannot be memorised, only read), rendered exactly as the backend renders the
agent's requests. They teach the format and the reading, not the strategy: only a quarter of them search twice; the
others answer after one search with the name the first document gives (the most common: after one search the warm
start answers more often than it searches again, so its greedy answer to a two-hop question is wrong), search a
wrong name second, or answer without searching. RL has to find that the second search pays. Every name is one
token wherever it appears (the world quotes names, see `rag_task.make_world`), so a search copies one token.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from rag_index import SearchIndex  # noqa: E402
from rag_task import CITIES, COUNTRIES, RagTask, make_world  # noqa: E402

__all__ = [
    "BEHAVIOURS",
    "CHAT_TEMPLATE",
    "INSTRUCTIONS",
    "SEARCH_TOOL",
    "conversation",
    "tokenizer_texts",
    "warm_start",
]

logger = logging.getLogger(__name__)

INSTRUCTIONS = "Answer with a name only. Look up one name per search."
"""The agent's instructions (the system message); `rag_agent.INSTRUCTIONS` is this text."""

SEARCH_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the encyclopedia for a name; returns the best matching entries.",
        "parameters": {
            "properties": {
                "query": {"description": "A name, e.g. a film, a person or a city.", "title": "Query", "type": "string"}
            },
            "required": ["query"],
            "title": "search_args",
            "type": "object",
            "additionalProperties": False,
        },
        "strict": True,
    },
}
"""The tool declaration the Agents SDK sends for `rag_agent.search` (a test keeps the two equal)."""

CHAT_TEMPLATE = (
    "{%- set ns = namespace(system='') -%}"
    "{%- if messages and messages[0].role in ['system', 'developer'] -%}"
    "{%- set ns.system = messages[0].content -%}"
    "{%- set messages = messages[1:] -%}"
    "{%- endif -%}"
    "{%- if ns.system or tools -%}"
    "{{- '<|im_start|>system\\n' + ns.system -}}"
    "{%- if tools -%}"
    "{%- if ns.system -%}{{- '\\n' -}}{%- endif -%}"
    "{{- 'Tools:' -}}"
    "{%- for tool in tools -%}"
    "{%- set tool = tool.function if tool.function is defined else tool -%}"
    "{{- ' ' + tool.name + '(' + ((tool.parameters or {}).properties or {}) | list | join(', ') + ')' -}}"
    "{%- endfor -%}"
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
"""Hermes-style ChatML template whose system turn lists tools as ``Tools: name(arg, ...)`` (prefix-extending)."""

BEHAVIOURS = ("two_hops", "one_hop", "wrong_second", "no_search")
"""What a warm-start transcript does: search both hops; answer after the first; search a distractor second; guess."""

DEFAULT_MIX = (0.25, 0.5, 0.15, 0.1)
"""Share of each of `BEHAVIOURS` in the warm-start transcripts."""

TOP_K = 2
"""Documents per search, as in `rag_agent.TOP_K`."""


class _Transcript:
    """Builds one conversation in the OpenAI message format the Agents SDK sends."""

    def __init__(self, question: str) -> None:
        self.messages: list[dict[str, Any]] = [
            {"role": "system", "content": INSTRUCTIONS},
            {"role": "user", "content": question},
        ]
        self.calls = 0

    def search(self, index: Any, query: str) -> list[tuple[str, str]]:
        call_id = f"call_{self.calls}"
        self.calls += 1
        arguments = json.dumps({"query": query})
        self.messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": call_id, "type": "function", "function": {"name": "search", "arguments": arguments}}
                ],
            }
        )
        found = index(query)
        text = "\n".join(f"{title}: {body}" for title, body in found) or "No match."
        self.messages.append({"role": "tool", "tool_call_id": call_id, "content": text})
        return found

    def answer(self, text: str) -> dict[str, Any]:
        self.messages.append({"role": "assistant", "content": text})
        return {"messages": self.messages, "tools": [SEARCH_TOOL]}


def _last_name(text: str) -> str:
    """The entity a document's sentence ends with (``a film directed by "Ada".`` -> ``Ada``)."""
    sentence = " " + text.rstrip(".")
    for marker in (" directed by ", " born in ", " a city in "):
        if marker in sentence:
            return sentence.split(marker, 1)[1].strip('"')
    return sentence.strip().strip('"')


def conversation(search_index: SearchIndex, task: RagTask, behaviour: str, rng: random.Random) -> dict[str, Any]:
    """One warm-start transcript of ``task`` doing ``behaviour`` (one of `BEHAVIOURS`), searching ``search_index``.

    Raises:
        ValueError: An unknown behaviour.
    """

    def index(query: str) -> list[tuple[str, str]]:
        return [(d.title, d.text) for d in search_index.search(query, TOP_K)]

    transcript = _Transcript(task.question)
    if behaviour == "no_search":
        return transcript.answer(rng.choice(CITIES if task.kind == "director_birthplace" else COUNTRIES))
    first = transcript.search(index, task.gold_titles[0])
    if behaviour == "one_hop":
        return transcript.answer(_last_name(first[0][1]))
    if behaviour == "two_hops":
        second = transcript.search(index, _last_name(first[0][1]))
        return transcript.answer(_last_name(second[0][1]))
    if behaviour == "wrong_second":
        distractor = first[1][0] if len(first) > 1 else task.gold_titles[0]
        second = transcript.search(index, distractor)
        return transcript.answer(_last_name(second[0][1]))
    raise ValueError(f"unknown behaviour {behaviour!r}; expected one of {BEHAVIOURS}")


def sample_conversations(
    count: int, rng: random.Random, mix: Sequence[float] = DEFAULT_MIX
) -> Iterator[dict[str, Any]]:
    """``count`` transcripts from a fresh world, behaviours drawn with weights ``mix``."""
    world = make_world(rng.getrandbits(32))
    index = SearchIndex.in_memory(world.documents)
    for _ in range(count):
        task = rng.choice(world.tasks)
        yield conversation(index, task, rng.choices(BEHAVIOURS, weights=mix)[0], rng)


def tokenizer_texts(worlds: int = 8, seed: int = 0) -> list[str]:
    """Text to train the BPE tokenizer on: every document and question of a few worlds, and transcripts."""
    rng = random.Random(seed)
    texts: list[str] = [INSTRUCTIONS, "Tools: search(query)", "No match."]
    for _ in range(worlds):
        world = make_world(rng.getrandbits(32))
        texts += [f"{d.title}: {d.text}" for d in world.documents]
        texts += [t.question for t in world.tasks]
        index = SearchIndex.in_memory(world.documents)
        for task in world.tasks[:40]:
            for behaviour in BEHAVIOURS[:3]:
                for message in conversation(index, task, behaviour, rng)["messages"]:
                    for call in message.get("tool_calls") or []:
                        texts.append('{"name": "search", "arguments": ' + call["function"]["arguments"] + "}")
    return texts


def warm_start(
    *,
    steps: int = 320,
    batch_size: int = 16,
    lr: float = 6e-3,
    seed: int = 0,
    vocab_size: int = 768,
    hidden_size: int = 96,
    num_layers: int = 2,
    threads: int = 1,
    mix: Sequence[float] = DEFAULT_MIX,
) -> tuple[Any, Any, dict[str, float]]:
    """Train the tokenizer, build the model and fine-tune it on fresh transcripts every step (deterministic on CPU).

    Returns:
        The model (eval mode), its tokenizer and a summary of the fine-tuning.
    """
    from agentlightning_torch import (
        SFTConfig,
        build_chat_model,
        fit_examples,
        tokenize_conversation,
        train_chat_tokenizer,
    )

    tokenizer = train_chat_tokenizer(tokenizer_texts(seed=seed), vocab_size=vocab_size, chat_template=CHAT_TEMPLATE)
    model = build_chat_model(
        tokenizer,
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=4,
        intermediate_size=hidden_size * 3,
        max_positions=512,
        seed=seed,
    )
    rng = random.Random(seed)

    def batches() -> Iterator[list[Any]]:
        while True:
            batch = []
            for record in sample_conversations(batch_size, rng, mix):
                batch += tokenize_conversation(tokenizer, record)
            yield batch

    config = SFTConfig(
        steps=steps, batch_size=batch_size, lr=lr, warmup_steps=steps // 10, seed=seed, threads=threads, log_every=20
    )
    pad: Any = tokenizer.pad_token_id
    started = time.perf_counter()
    result = fit_examples(model, batches(), config, pad_token_id=int(pad))
    summary = result.summary()
    summary["seconds"] = time.perf_counter() - started
    summary["parameters"] = float(sum(p.numel() for p in model.parameters()))
    return model, tokenizer, summary


def main(argv: Sequence[str] | None = None) -> int:
    """``warmstart --out DIR``: train and save the warm start (evaluate it with ``train.py eval --model-dir DIR``)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    warm = commands.add_parser("warmstart", help="train the warm start and save it")
    warm.add_argument("--out", required=True, type=Path, help="folder to write the model + tokenizer into")
    warm.add_argument("--steps", type=int, default=320)
    warm.add_argument("--batch-size", type=int, default=16)
    warm.add_argument("--seed", type=int, default=0)
    warm.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    from agentlightning_torch import save_checkpoint

    model, tokenizer, summary = warm_start(
        steps=args.steps, batch_size=args.batch_size, seed=args.seed, threads=args.threads
    )
    save_checkpoint(model, tokenizer, args.out)
    print(json.dumps({k: round(v, 4) for k, v in summary.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
