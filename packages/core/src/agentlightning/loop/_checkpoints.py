"""The loop's own part of a checkpoint: where it lives and the state file that marks it complete.

The engine writes its files first (`Engine.save_state`); the loop's state file is written last and atomically, so a
checkpoint whose state file is there is whole.
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["BEST_CHECKPOINT", "LOOP_STATE_FILE", "read_loop_state", "write_loop_state"]

LOOP_STATE_FILE = "loop_state.json"
"""The loop's own part of a checkpoint (iteration, model version), next to the engine's files."""

BEST_CHECKPOINT = "best"
"""The folder inside ``checkpoint/`` holding the checkpoint of the best held-out evaluation (an engine's
`Engine.save_state` keeps it when it replaces the last checkpoint)."""


def write_loop_state(directory: Path, iteration: int, model_version: int) -> None:
    """Write the loop's state into ``directory`` atomically: the checkpoint's commit mark."""
    partial = directory / f"{LOOP_STATE_FILE}.partial"
    partial.write_text(json.dumps({"iteration": iteration, "model_version": model_version}), encoding="utf-8")
    partial.replace(directory / LOOP_STATE_FILE)


def read_loop_state(directory: Path) -> tuple[int, int] | None:
    """The iteration and model version of the checkpoint in ``directory``; ``None`` when there is none.

    Raises:
        ValueError: The state file is there but unreadable.
    """
    state_file = directory / LOOP_STATE_FILE
    if not state_file.exists():
        return None
    try:
        state = json.loads(state_file.read_text(encoding="utf-8"))
        return int(state["iteration"]), int(state["model_version"])
    except (ValueError, KeyError, TypeError) as error:
        raise ValueError(f"checkpoint state {state_file} is unreadable: {error!r}") from error
