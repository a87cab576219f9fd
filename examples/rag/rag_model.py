"""The RAG example's small model: a byte-level BPE tokenizer, a 0.34M-parameter Qwen2 and its deterministic warm start.

The shipped ``examples/rag/checkpoint`` is made by::

    python examples/rag/rag_model.py warmstart --out examples/rag/checkpoint     # 4-7 min on one CPU thread
    python examples/rag/rag_model.py evaluate --model examples/rag/checkpoint    # what the warm start does

It is a plain ``save_pretrained`` folder made with `agentlightning_torch`'s warm-start toolkit
(`train_chat_tokenizer`, `build_chat_model`, `fit_examples`, `save_checkpoint`): any transformers user, the
trainer's backend or vLLM load it. Its chat template is hermes-style (ChatML turns, ``<tool_call>{json}</tool_call>``
calls, ``<tool_response>`` results, read back by the ``hermes`` tool-call parser) but lists the tools in one short
line (``Tools: search(query)``) instead of their JSON schemas, because every prompt token costs CPU time here.

How the warm start is built (the quickstart's recipe: make the right path exact, but rarely chosen). The
transcripts are conversations of the agent in `rag_agent` over *other* worlds than the shipped one (a fresh world
every step, so facts cannot be memorised, only read), rendered exactly as the backend renders the agent's requests.
Two kinds only:

* ``two_hops``: search the name in the question, search the name the first result gives, answer with the name the
  second result gives: every copy exact. Most of each batch (``WarmStartConfig.search_share``) is these, so the
  three copy steps get thousands of examples.
* ``no_search``: answer at once with the name the question asks about (always wrong).

Whether to search is decided by the first token of the first answer (``<tool_call>`` or a name). The loss on that
one token is kept for only part of the ``two_hops`` transcripts, so the model *chooses* to search in about
``search_choice`` (a quarter) of its first turns while it learns the search path from all of them. The guess is one
name (the question's), so greedy decoding guesses (F1 0) while sampling searches a quarter of the time, and when it
searches it is right: RL only has to move one early choice, and every group of samples holds both outcomes.

Two settings make the copying learnable in minutes: every name is one token wherever it appears (the world quotes
names, see `rag_task.make_world`), so a search copies one token; and the initial weights are 4x Qwen2's default
(``init_scale``; at the default the model had not started to copy after 600 steps) with a shared random part per
name category (``name_init``, see `mark_names`). The log reports the share of names copied right on held-out
transcripts every 50 steps.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import re
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from rag_index import SearchIndex  # noqa: E402
from rag_task import CITIES, COUNTRIES, FILMS, PEOPLE, RagTask, make_world  # noqa: E402

from agentlightning_torch import chatml_template  # noqa: E402

__all__ = [
    "BEHAVIOURS",
    "CHAT_TEMPLATE",
    "INSTRUCTIONS",
    "SEARCH_TOOL",
    "TranscriptEncoder",
    "WarmStartConfig",
    "conversation",
    "new_conversation",
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

CHAT_TEMPLATE = chatml_template(
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
)
"""Hermes-style ChatML template whose system turn lists tools as ``Tools: name(arg, ...)`` (prefix-extending)."""

BEHAVIOURS = ("two_hops", "no_search", "one_hop", "wrong_second")
"""What a transcript does: search both hops; guess at once; answer after the first search; search a distractor
second. The warm start uses the first two (the others are kept for experiments with weaker starts)."""

TOP_K = 2
"""Documents per search, as in `rag_agent.TOP_K`."""

MAX_TURNS = 4
"""Model calls per question, as in `rag_agent.MAX_TURNS`."""


def new_conversation(question: str) -> list[dict[str, Any]]:
    """The first messages the Agents SDK sends for ``question``: the instructions, then the question."""
    return [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": question}]


class _Transcript:
    """Builds one conversation in the OpenAI message format the Agents SDK sends."""

    def __init__(self, question: str) -> None:
        self.messages = new_conversation(question)
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
    if behaviour == "no_search":  # answer at once with the name asked about: always wrong
        return transcript.answer(task.gold_titles[0])
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


_SPECIAL = re.compile(r"<\|im_start\|>|<\|im_end\|>|</?tool_call>|</?tool_response>")
_NAMES = re.compile(r"\b(" + "|".join(sorted({*FILMS, *PEOPLE, *CITIES, *COUNTRIES}, key=len, reverse=True)) + r")\b")


def tokenizer_texts(worlds: int = 8, seed: int = 0) -> list[str]:
    """Text to train the BPE tokenizer on: every document and question of a few worlds, and rendered transcripts
    (their fixed words, ``assistant``, the instructions, the call's JSON, become few tokens: shorter sequences)."""
    from jinja2 import Template

    template = Template(CHAT_TEMPLATE)
    rng = random.Random(seed)
    texts: list[str] = [INSTRUCTIONS, "Tools: search(query)", "No match."]
    texts += [f'"{name}"' for name in (*FILMS, *PEOPLE, *CITIES, *COUNTRIES)] * 20  # every name one token
    for _ in range(worlds):
        world = make_world(rng.getrandbits(32))
        texts += [f"{d.title}: {d.text}" for d in world.documents]
        texts += [t.question for t in world.tasks]
        index = SearchIndex.in_memory(world.documents)
        for task in world.tasks[:40]:
            for behaviour in BEHAVIOURS[:2]:
                record = conversation(index, task, behaviour, rng)
                messages = [dict(m) for m in record["messages"]]
                for message in messages:
                    for call in message.get("tool_calls") or []:
                        call["function"] = {**call["function"], "arguments": json.loads(call["function"]["arguments"])}
                text = template.render(messages=messages, tools=record["tools"], add_generation_prompt=False)
                texts.append(_SPECIAL.sub("\n", text))
    return texts


class TranscriptEncoder:
    """Token ids of transcripts, as `agentlightning_torch.tokenize_conversation` makes them, but fast.

    Transcripts differ only in their names, and every name is a single token: each *shape* (the transcript with
    its names replaced by slots) is rendered by the chat template once; later transcripts of that shape put their
    names' ids into its slots (a test checks the ids equal the template's for many transcripts).

    Raises:
        ValueError: A name of the vocabularies is not a single token of ``tokenizer``.
    """

    def __init__(self, tokenizer: Any) -> None:
        from agentlightning_torch import HFChatTemplate

        self.tokenizer = tokenizer
        self.template = HFChatTemplate(tokenizer)
        self.name_ids: dict[str, int] = {}
        for name in {*FILMS, *PEOPLE, *CITIES, *COUNTRIES}:
            ids = tokenizer.encode(name, add_special_tokens=False)
            if len(ids) != 1:
                raise ValueError(f"the name {name!r} is {len(ids)} tokens, not one; retrain the tokenizer")
            self.name_ids[name] = ids[0]
        self._names = {token: name for name, token in self.name_ids.items()}
        self._shapes: dict[str, tuple[tuple[int, ...], tuple[int, ...], list[tuple[int, int]]]] = {}

    def encode(self, record: dict[str, Any]) -> Any:
        """The one training sequence (`agentlightning_torch.SFTExample`) of a transcript."""
        from agentlightning_torch import SFTExample, tokenize_conversation

        roles: dict[str, int] = {}

        def slot(match: re.Match[str]) -> str:
            return f"\x00{roles.setdefault(match.group(0), len(roles))}\x00"

        texts = [
            f"{m['role']}\x01{m.get('content')}\x01"
            + "".join(c["function"]["arguments"] for c in m.get("tool_calls") or [])
            for m in record["messages"]
        ]
        key = _NAMES.sub(slot, "\x02".join(texts))
        shape = self._shapes.get(key)
        if shape is None:
            (example,) = tokenize_conversation(self.tokenizer, record, template=self.template)
            slots = [(i, roles[self._names[t]]) for i, t in enumerate(example.input_ids) if t in self._names]
            if len(slots) != key.count("\x00") // 2:
                raise ValueError(f"transcript names and name tokens differ: {self.tokenizer.decode(example.input_ids)}")
            shape = self._shapes[key] = (example.input_ids, example.loss_mask, slots)
        ids = list(shape[0])
        by_role = list(roles)
        for position, role in shape[2]:
            ids[position] = self.name_ids[by_role[role]]
        return SFTExample(tuple(ids), shape[1])


@dataclass(frozen=True)
class WarmStartConfig:
    """Settings of the warm start (defaults: the shipped checkpoint's, ~7 minutes on one CPU thread).

    Attributes:
        steps: Optimizer steps (a fresh world and ``batch_size`` fresh transcripts each).
        batch_size: Transcripts per step.
        lr: Peak learning rate (AdamW, a tenth of the steps warm-up, cosine decay).
        search_share: Share of ``two_hops`` transcripts in a batch (the rest ``no_search``).
        search_choice: How often the model should choose to search: the first-token loss is kept on just enough
            ``two_hops`` transcripts for this share of the first-token targets to be ``<tool_call>``.
        hidden_size: Model width (4 heads, MLP 3x as wide).
        num_layers: Transformer layers.
        vocab_size: BPE vocabulary size.
        result_loss: Also train on the search results' tokens of ``two_hops`` transcripts (the model never writes
            them, but predicting them is copying at short range: a result starts with the name just searched and
            repeats names read before: more copy practice; off in the shipped recipe, which copies without it).
        init_scale: Factor on the initial weight matrices (Qwen2's init, std 0.02, is so small that this model
            did not start to copy in 600 steps; at 4x it copies the question's name within ~150 steps).
        name_init: Size of the shared part of each name category's embeddings at init (films, people, cities,
            countries), relative to the random part: see `mark_names` (0 turns it off).
        seed: Seeds the tokenizer text, the model, the worlds and the data order.
        threads: torch CPU threads.
    """

    steps: int = 750
    batch_size: int = 16
    lr: float = 3e-3
    search_share: float = 0.6
    search_choice: float = 0.25
    hidden_size: int = 96
    num_layers: int = 2
    vocab_size: int = 1024
    result_loss: bool = False
    init_scale: float = 4.0
    name_init: float = 1.0
    seed: int = 0
    threads: int = 1

    def __post_init__(self) -> None:
        if not 0 < self.search_share <= 1 or not 0 <= self.search_choice < 1:
            raise ValueError("search_share must be in (0, 1] and search_choice in [0, 1)")

    @property
    def decision_keep(self) -> float:
        """Probability that a ``two_hops`` transcript keeps the loss on its first (decision) token."""
        odds = self.search_choice / (1 - self.search_choice)
        return min(1.0, odds * (1 - self.search_share) / self.search_share)


def warm_batches(tokenizer: Any, config: WarmStartConfig, rng: random.Random) -> Iterator[list[Any]]:
    """The warm start's training sequences, a fresh world per step (see the module docstring)."""
    from agentlightning_torch import SFTExample

    encoder = TranscriptEncoder(tokenizer)
    while True:
        world = make_world(rng.getrandbits(32))
        index = SearchIndex.in_memory(world.documents)
        batch: list[Any] = []
        for _ in range(config.batch_size):
            task = rng.choice(world.tasks)
            if rng.random() >= config.search_share:
                batch.append(encoder.encode(conversation(index, task, "no_search", rng)))
                continue
            example = encoder.encode(conversation(index, task, "two_hops", rng))
            mask = list(example.loss_mask)
            first = mask.index(1)
            if config.result_loss:
                mask[first:] = [1] * (len(mask) - first)
            if rng.random() >= config.decision_keep:  # learn the search path, not the choice to search
                mask[first] = 0
            batch.append(SFTExample(example.input_ids, tuple(mask)))
        index.close()
        yield batch


def copy_accuracy(model: Any, examples: Sequence[Any], name_ids: set[int]) -> float:
    """Share of the names the model writes in ``examples`` (``two_hops`` sequences) that its argmax predicts
    (teacher-forced: the two queries and the answer of each)."""
    import torch

    right = total = 0
    with torch.no_grad():
        for example in examples:
            ids = torch.tensor([example.input_ids])
            predicted = model(input_ids=ids).logits[0, :-1].argmax(-1).tolist()
            for position, (token, target) in enumerate(zip(example.input_ids, example.loss_mask, strict=True)):
                if target and token in name_ids and position > 0:
                    right += predicted[position - 1] == token
                    total += 1
    return right / max(total, 1)


def mark_names(model: Any, tokenizer: Any, scale: float, seed: int) -> None:
    """Give the embeddings of each name category (films, people, cities, countries) a shared random part at init.

    A search copies a name from the conversation, and which name is told by its category (the first query is the
    question's film or person, the second the person or city the first result gives, the answer a city or a
    country): a shared part per category lets attention find "the city in the last result" from the start,
    instead of first discovering, name by name, what the names have in common (a long plateau on which the
    plain model spent its whole budget without copying anything).
    """
    import torch

    weight = model.get_input_embeddings().weight
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        size = float(weight.std()) * scale
        for names in (FILMS, PEOPLE, CITIES, COUNTRIES):
            shared = torch.randn(weight.shape[1], generator=generator) * size
            for name in names:
                (token,) = tokenizer.encode(name, add_special_tokens=False)
                weight[token] += shared


def warm_start(config: WarmStartConfig | None = None) -> tuple[Any, Any, dict[str, float]]:
    """Train the tokenizer, build the model and fine-tune it on fresh transcripts every step (deterministic on CPU).

    Returns:
        The model (eval mode), its tokenizer and a summary of the fine-tuning.
    """
    import torch

    from agentlightning_torch import SFTConfig, build_chat_model, fit_examples, train_chat_tokenizer

    config = config or WarmStartConfig()
    tokenizer = train_chat_tokenizer(
        tokenizer_texts(seed=config.seed), vocab_size=config.vocab_size, chat_template=CHAT_TEMPLATE
    )
    model = build_chat_model(
        tokenizer,
        hidden_size=config.hidden_size,
        num_layers=config.num_layers,
        num_heads=4,
        intermediate_size=config.hidden_size * 3,
        max_positions=512,
        seed=config.seed,
    )
    with torch.no_grad():
        for weight in model.parameters():
            if weight.dim() == 2:  # embeddings and projections (tied output head included), not the norms
                weight.mul_(config.init_scale)
    mark_names(model, tokenizer, config.name_init, config.seed)
    sft = SFTConfig(
        steps=config.steps,
        batch_size=config.batch_size,
        max_batch_tokens=4096,  # sorts a step's sequences by length into passes: short guesses are not padded
        lr=config.lr,
        warmup_steps=config.steps // 10,
        seed=config.seed,
        threads=config.threads,
        log_every=25,
    )
    encoder = TranscriptEncoder(tokenizer)
    probe_world = make_world(config.seed + 7_000_000)  # a world the training worlds are drawn apart from
    probe_index = SearchIndex.in_memory(probe_world.documents)
    probe_rng = random.Random(config.seed)
    probe = [encoder.encode(conversation(probe_index, t, "two_hops", probe_rng)) for t in probe_world.tasks[:24]]
    names = set(encoder.name_ids.values())

    def logged(batches: Iterator[list[Any]]) -> Iterator[list[Any]]:
        for step, batch in enumerate(batches):
            if step and step % 50 == 0:
                logger.info("step %d: names copied right %.3f", step, copy_accuracy(model, probe, names))
            yield batch

    pad: Any = tokenizer.pad_token_id
    started = time.perf_counter()
    batches = logged(warm_batches(tokenizer, config, random.Random(config.seed)))
    result = fit_examples(model, batches, sft, pad_token_id=int(pad))
    summary = result.summary()
    summary["seconds"] = time.perf_counter() - started
    summary["parameters"] = float(sum(p.numel() for p in model.parameters()))
    return model, tokenizer, summary


def main(argv: Sequence[str] | None = None) -> int:
    """``warmstart --out DIR``: train, save and evaluate the warm start; ``evaluate --model DIR``: measure a folder."""
    defaults = WarmStartConfig()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    warm = commands.add_parser("warmstart", help="train the warm start, save it and evaluate it")
    warm.add_argument("--out", required=True, type=Path, help="folder to write the model + tokenizer into")
    warm.add_argument("--steps", type=int, default=defaults.steps)
    warm.add_argument("--batch-size", type=int, default=defaults.batch_size)
    warm.add_argument("--lr", type=float, default=defaults.lr)
    warm.add_argument("--search-share", type=float, default=defaults.search_share)
    warm.add_argument("--search-choice", type=float, default=defaults.search_choice)
    warm.add_argument("--hidden-size", type=int, default=defaults.hidden_size)
    warm.add_argument("--num-layers", type=int, default=defaults.num_layers)
    warm.add_argument("--name-init", type=float, default=defaults.name_init)
    warm.add_argument("--result-loss", action="store_true", help="also train on the search results' tokens")
    warm.add_argument("--init-scale", type=float, default=defaults.init_scale)
    warm.add_argument("--seed", type=int, default=defaults.seed)
    warm.add_argument("--threads", type=int, default=defaults.threads)
    check = commands.add_parser("evaluate", help="measure a saved model folder")
    check.add_argument("--model", required=True, type=Path)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    import torch

    torch.set_num_threads(getattr(args, "threads", 1))
    if args.command == "warmstart":
        from agentlightning_torch import save_checkpoint

        config = WarmStartConfig(
            steps=args.steps,
            batch_size=args.batch_size,
            lr=args.lr,
            search_share=args.search_share,
            search_choice=args.search_choice,
            hidden_size=args.hidden_size,
            num_layers=args.num_layers,
            name_init=args.name_init,
            result_loss=args.result_loss,
            init_scale=args.init_scale,
            seed=args.seed,
            threads=args.threads,
        )
        model, tokenizer, report = warm_start(config)
        save_checkpoint(model, tokenizer, args.out)
        report = {**{k: float(v) for k, v in asdict(config).items()}, **report}
    else:
        from agentlightning_torch import load_model

        loaded = load_model(args.model)
        model, tokenizer, report = loaded.model, loaded.tokenizer, {}
    from rag_eval import evaluate

    report.update(evaluate(model.eval(), tokenizer))
    print(json.dumps({k: round(v, 4) for k, v in report.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
