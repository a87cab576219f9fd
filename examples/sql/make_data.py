"""Regenerate the task files shipped in ``data/`` (deterministic; held-out questions are about other databases).

    python examples/sql/make_data.py

Training questions ask about databases 0-11 of each schema, held-out questions about databases 100-115 (rows never
seen in training). The SQLite files themselves are built on first use into ``data/db/`` (`sql_data.database_path`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from sql_data import make_tasks  # noqa: E402

TRAIN_DATABASES = tuple(range(12))
"""Database seeds of the training questions (and of the warm start's transcripts)."""

HELD_OUT_DATABASES = tuple(range(100, 116))
"""Database seeds of the held-out questions."""


def main() -> None:
    splits = {
        "train": make_tasks(2000, seed=7, databases=TRAIN_DATABASES),
        "val": make_tasks(250, seed=20261201, databases=HELD_OUT_DATABASES),
    }
    (HERE / "data").mkdir(exist_ok=True)
    for name, tasks in splits.items():
        lines = [json.dumps(task.to_dict()) for task in tasks]
        (HERE / "data" / f"{name}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
        print(f"{name}: {len(tasks)} tasks")


if __name__ == "__main__":
    main()
