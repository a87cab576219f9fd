"""Regenerate the calculator tasks shipped in ``data/`` (deterministic; held-out tasks never appear in training).

python examples/calc/make_data.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from calc_task import make_calc_tasks  # noqa: E402


def main() -> None:
    val = make_calc_tasks(256, seed=20261130)
    held_out = {task.expression for task in val}
    train = [task for task in make_calc_tasks(5000, seed=7) if task.expression not in held_out]
    (HERE / "data").mkdir(exist_ok=True)
    for name, tasks in (("train", train), ("val", val)):
        lines = [json.dumps({"question": task.question, "answer": task.answer}) for task in tasks]
        (HERE / "data" / f"{name}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
        print(f"{name}: {len(tasks)} tasks")


if __name__ == "__main__":
    main()
