"""Write the RAG example's data: the generated corpus and its train / held-out questions (deterministic).

    python examples/rag/make_data.py                                   # data/ from the seeded world
    python examples/rag/make_data.py --musique musique_ans_v1.0_dev.jsonl --out data/musique   # from MuSiQue

Writes ``corpus.jsonl`` (one ``{"title", "text"}`` document a line), ``train.jsonl`` and ``val.jsonl`` (tasks;
held-out questions never appear in training). Point the trainer at another folder with ``--data``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from rag_task import DataError, load_musique, make_world, split_tasks, write_jsonl  # noqa: E402

WORLD_SEED = 20261201
"""Seed of the shipped world (warm-start transcripts are drawn from other seeds)."""

HELD_OUT = 0.3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=HERE / "data", help="folder to write")
    parser.add_argument("--seed", type=int, default=WORLD_SEED, help="world seed")
    parser.add_argument("--musique", type=Path, help="build from a local MuSiQue JSONL file instead")
    args = parser.parse_args(argv)
    try:
        if args.musique is not None:
            tasks, documents = load_musique(args.musique)
        else:
            world = make_world(args.seed)
            tasks, documents = world.tasks, world.documents
        train, val = split_tasks(tasks, HELD_OUT, seed=args.seed)
    except (DataError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    write_jsonl(args.out / "corpus.jsonl", (d.to_dict() for d in documents))
    for name, part in (("train", train), ("val", val)):
        write_jsonl(args.out / f"{name}.jsonl", (t.to_dict() for t in part))
    print(f"{args.out}: {len(documents)} documents, {len(train)} training and {len(val)} held-out questions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
