"""The SQL example's small model: a byte-level BPE chat tokenizer, a ~1M-parameter Qwen2, and its deterministic warm
start from generated transcripts of the three agents (`sql_transcripts`).

The shipped ``examples/sql/checkpoint`` is made by one command (deterministic by seed, a few minutes on one thread)::

    python examples/sql/sql_model.py warmstart --out examples/sql/checkpoint

It is a plain ``save_pretrained`` folder: the trainer's backend, plain transformers or vLLM load it. Every call of
the graph is one ChatML user turn and one assistant reply (the agents call no tools), rendered by the tokenizer's
chat template exactly as the backend renders the agents' requests.

The warm start teaches the format and the schemas, and leaves room for RL: the writer and rewriter transcripts
reply with the gold query only some of the time (`TranscriptConfig`), otherwise with a typical mistake, so the
warm model samples the right query now and then but greedily mostly writes a mistake. The checker's transcripts
are always consistent (``BAD`` on an error or an empty result).
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

from sql_transcripts import TranscriptConfig, corpus, make_conversations

__all__ = ["WarmStartConfig", "warm_start"]

logger = logging.getLogger(__name__)


class WarmStartConfig(BaseModel):
    """Settings of the supervised warm start (defaults: the shipped checkpoint).

    Two phases on generated episodes of the training databases: ``format_steps`` on transcripts whose writer
    and rewriter are always right (the model learns the schemas, the query shapes and to copy the question's
    values), then ``policy_steps`` at a lower learning rate on transcripts where they are right only
    ``writer_right`` / ``rewriter_right`` of the time (the habits RL starts from).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    episodes: int = Field(default=3000, ge=10)
    format_steps: int = Field(default=250, ge=1)
    policy_steps: int = Field(default=120, ge=0)
    batch_size: int = Field(default=32, ge=1)
    lr: float = Field(default=3e-3, gt=0)
    policy_lr: float = Field(default=1e-3, gt=0)
    writer_right: float = Field(default=0.3, ge=0, le=1)
    rewriter_right: float = Field(default=0.3, ge=0, le=1)
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
        The model (eval mode), its tokenizer and a summary (losses, seconds, parameters).
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
    perfect = make_conversations(
        config.episodes, seed=config.seed, config=TranscriptConfig(writer_right=1.0, rewriter_right=1.0)
    )
    habits = make_conversations(
        config.episodes,
        seed=config.seed + 1,
        config=TranscriptConfig(writer_right=config.writer_right, rewriter_right=config.rewriter_right),
    )
    tokenizer = train_chat_tokenizer(
        corpus(perfect + habits),
        vocab_size=config.vocab_size,
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
    # Train on the tokenizer exactly as users (and the backend) load it back from the folder.
    with tempfile.TemporaryDirectory() as folder:
        save_checkpoint(model, tokenizer, folder)
        tokenizer = AutoTokenizer.from_pretrained(folder)
    common: dict[str, Any] = {"batch_size": config.batch_size, "seed": config.seed, "threads": config.threads}
    first = supervised_finetune(model, tokenizer, perfect, steps=config.format_steps, lr=config.lr, **common)
    summary = {"format_loss": first.final_loss, "format_seconds": first.seconds}
    if config.policy_steps:
        second = supervised_finetune(
            model, tokenizer, habits, steps=config.policy_steps, lr=config.policy_lr, schedule="constant", **common
        )
        summary.update({"policy_loss": second.final_loss, "policy_seconds": second.seconds})
    summary["parameters"] = float(count_parameters(model))
    return model, tokenizer, summary


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
        from sql_eval import evaluate_folder

        for mode in ("greedy", "sampled"):
            scores = evaluate_folder(args.out, size=args.eval_size, temperature=0.0 if mode == "greedy" else 1.0)
            report.update({f"{mode}_{key}": value for key, value in scores.items() if isinstance(value, float)})
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in report.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
