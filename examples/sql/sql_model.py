"""The SQL example's small model: a byte-level BPE chat tokenizer, a ~1M-parameter Qwen2, and its deterministic warm
start from generated transcripts of the three agents (`sql_transcripts`).

The shipped ``examples/sql/checkpoint`` is made by one command (deterministic by seed; 350 steps, 19 minutes on one
thread of a busy 2-core machine)::

    python examples/sql/sql_model.py warmstart --out examples/sql/checkpoint

It is a plain ``save_pretrained`` folder: the trainer's backend, plain transformers or vLLM load it. Every call of
the graph is one ChatML user turn and one assistant reply (the agents call no tools), rendered by the tokenizer's
chat template exactly as the backend renders the agents' requests.

The warm start makes the right query a skill the model has but rarely chooses: every writer and rewriter
transcript writes the question's exact query shape with its copied values, but selects the gold column only about a
fifth of the time (otherwise a silent or a loud wrong column, `sql_transcripts`). The path is decided at the first
words of the query and, once taken, completed as trained; RL only has to move that early choice.
`path_exactness` measures both halves (how often the right path is chosen, how often it is then completed).
The checker's transcripts are always consistent (``BAD`` on an error or an empty result).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sql_transcripts import TranscriptConfig, corpus, make_conversations, mistakes, select_list

__all__ = ["WarmStartConfig", "path_exactness", "warm_start"]

logger = logging.getLogger(__name__)


class WarmStartConfig(BaseModel):
    """Settings of the supervised warm start (defaults: the shipped checkpoint).

    One pass of ``steps`` batches over transcripts of ``episodes`` generated episodes of the training databases
    (`sql_transcripts`): every writer and rewriter reply has the question's exact query shape and copied values,
    but selects the right column only ``writer_right`` / ``rewriter_right`` of the time. Many transcripts and
    steps make the shared part (the path once chosen) exact; the mix leaves the early choice to RL.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    episodes: int = Field(default=8000, ge=10)
    steps: int = Field(default=350, ge=1)
    batch_size: int = Field(default=64, ge=1)
    lr: float = Field(default=4e-3, gt=0)
    writer_right: float = Field(default=0.2, ge=0, le=1)
    rewriter_right: float = Field(default=0.25, ge=0, le=1)
    loud_share: float = Field(default=0.5, ge=0, le=1)
    checker_every: int = Field(default=3, ge=1)
    max_batch_tokens: int = Field(default=1536, ge=128)
    vocab_size: int = Field(default=700, ge=300)
    hidden_size: int = Field(default=128, ge=16)
    num_layers: int = Field(default=4, ge=1)
    num_heads: int = Field(default=4, ge=1)
    intermediate_size: int = Field(default=384, ge=16)
    max_positions: int = Field(default=256, ge=64)
    seed: int = 0
    threads: int = Field(default=1, ge=1)


def warm_start(config: WarmStartConfig | None = None) -> tuple[Any, Any, dict[str, float]]:
    """Build tokenizer and model from the seed and fine-tune them on generated transcripts (deterministic on CPU).

    Returns:
        The model (eval mode), its tokenizer and a summary (loss, seconds, parameters, transcripts).
    """
    from transformers import AutoTokenizer

    from agentlightning_torch import (
        build_chat_model,
        count_parameters,
        save_checkpoint,
        supervised_finetune,
        train_chat_tokenizer,
    )

    config = config or WarmStartConfig()
    transcripts = TranscriptConfig(
        writer_right=config.writer_right, rewriter_right=config.rewriter_right, loud_share=config.loud_share
    )
    episodes = make_conversations(config.episodes, seed=config.seed, config=transcripts)
    # The checker's reply is one word read off the result (ERR / EMPTY or rows): a third of its turns teach it, and
    # the compute goes to the writer's and rewriter's queries.
    checker_turns = [c for c in episodes if c[0]["content"].endswith("OK or BAD?")][:: config.checker_every]
    conversations = [c for c in episodes if not c[0]["content"].endswith("OK or BAD?")] + checker_turns
    tokenizer = train_chat_tokenizer(
        corpus(conversations),
        vocab_size=config.vocab_size,
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
    # Train on the tokenizer exactly as users (and the backend) load it back from the folder.
    with tempfile.TemporaryDirectory() as folder:
        save_checkpoint(model, tokenizer, folder)
        tokenizer = AutoTokenizer.from_pretrained(folder)
    result = supervised_finetune(
        model,
        tokenizer,
        conversations,
        steps=config.steps,
        batch_size=config.batch_size,
        lr=config.lr,
        max_batch_tokens=config.max_batch_tokens,
        seed=config.seed,
        threads=config.threads,
    )
    return (
        model,
        tokenizer,
        {
            "loss": result.final_loss,
            "seconds": result.seconds,
            "transcripts": float(len(conversations)),
            "parameters": float(count_parameters(model)),
        },
    )


def path_exactness(
    model: Any, tokenizer: Any, *, size: int = 100, samples: int = 8, seed: int = 0, max_tokens: int = 40
) -> dict[str, float]:
    """How the writer and the rewriter choose and complete paths on held-out questions, sampled at temperature 1.

    For each agent: ``<agent>_right_choice`` (the reply selects what the gold query selects: the right path taken),
    ``<agent>_exact_given_right`` (of those, the share whose rows match the gold rows: the path completed) and
    ``<agent>_accuracy``. The rewriter is asked to fix each question's loud mistake (as the graph would show it).
    """
    import torch
    from sql_agent import extract_sql, rewriter_prompt, writer_prompt
    from sql_data import SQLTask, database_path, execute, execution_match, load_tasks, result_feedback

    from agentlightning_torch import SamplingParams, generate_batch

    tasks = [
        SQLTask(**{k: t[k] for k in ("db_id", "schema", "question", "gold", "shape")})
        for t in load_tasks(Path(__file__).resolve().parent / "data" / "val.jsonl")[:size]
    ]
    prompts: dict[str, list[str]] = {"writer": [], "rewriter": []}
    for task in tasks:
        loud = mistakes(task)[1]
        feedback = result_feedback(execute(database_path(task.db_id), loud))
        prompts["writer"].append(writer_prompt(task.schema, task.question))
        prompts["rewriter"].append(rewriter_prompt(task.schema, task.question, loud, feedback))
    generator = torch.Generator().manual_seed(seed)
    report: dict[str, float] = {}
    for agent, texts in prompts.items():
        rendered = [
            tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True, tokenize=False)
            for t in texts
        ]
        ids = [list(tokenizer.encode(text, add_special_tokens=False)) for text in rendered]
        rows = [(task, prompt) for task, prompt in zip(tasks, ids, strict=True) for _ in range(samples)]
        params = [SamplingParams(temperature=1.0, max_tokens=max_tokens)] * len(rows)
        with torch.no_grad():
            results = generate_batch(
                model,
                [prompt for _, prompt in rows],
                params,
                eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id,
                generator=generator,
            )
        right = exact = correct = 0
        for (task, _), result in zip(rows, results, strict=True):
            sql = extract_sql(tokenizer.decode(result.token_ids, skip_special_tokens=True))
            db = database_path(task.db_id)
            match = execution_match(execute(db, sql), execute(db, task.gold))
            correct += match
            if select_list(sql) == select_list(task.gold):
                right += 1
                exact += match
        report.update(
            {
                f"{agent}_right_choice": right / len(rows),
                f"{agent}_exact_given_right": exact / max(right, 1),
                f"{agent}_accuracy": correct / len(rows),
            }
        )
    return report


def main(argv: Sequence[str] | None = None) -> int:
    """``warmstart --out DIR`` trains and saves the warm start, then scores it on held-out questions."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    warm = commands.add_parser("warmstart", help="train the warm start and save it")
    warm.add_argument("--out", required=True, type=Path, help="folder to write the model + tokenizer into")
    warm.add_argument("--seed", type=int, default=WarmStartConfig().seed)
    warm.add_argument("--eval-size", type=int, default=100, help="held-out questions to score it on (0: skip)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    from agentlightning_torch import save_checkpoint

    model, tokenizer, report = warm_start(WarmStartConfig(seed=args.seed))
    save_checkpoint(model, tokenizer, args.out)
    if args.eval_size:
        report.update(path_exactness(model, tokenizer, size=args.eval_size, seed=args.seed))
        from sql_eval import evaluate_folder

        for mode in ("greedy", "sampled"):
            scores = evaluate_folder(args.out, size=args.eval_size, temperature=0.0 if mode == "greedy" else 1.0)
            report.update({f"{mode}_{key}": value for key, value in scores.items() if isinstance(value, float)})
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in report.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
