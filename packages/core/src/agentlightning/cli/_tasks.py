"""``--tasks FILE``: the JSONL task file every ``agl train`` engine and training script reads the same way."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["TaskFileError", "read_task_file"]


class TaskFileError(ValueError):
    """A task file that cannot be used: the message is one line naming the file (and the line)."""


def read_task_file(
    path: Path, flag: str = "--tasks", check: Callable[[dict[str, Any]], str | None] | None = None
) -> list[dict[str, Any]]:
    """Tasks from a JSONL file, one JSON object per line (blank lines skipped).

    Args:
        path: The file.
        flag: The option that named it (for the messages).
        check: Returns what is wrong with one task (``None``: nothing); the message gets the file and line.

    Raises:
        TaskFileError: The file is missing, a line is not a JSON object or fails ``check``, or there is no task.
    """
    if not path.is_file():
        raise TaskFileError(f"{flag} file {str(path)!r} does not exist")
    tasks: list[dict[str, Any]] = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            task = json.loads(line)
        except json.JSONDecodeError as error:
            raise TaskFileError(f"{path}:{number}: not valid JSON ({error.msg} at column {error.colno})") from None
        if not isinstance(task, dict):
            raise TaskFileError(
                f"{path}:{number}: each line must be a JSON object (one task), got {type(task).__name__}"
            )
        problem = None if check is None else check(task)  # pyright: ignore[reportUnknownArgumentType]
        if problem is not None:
            raise TaskFileError(f"{path}:{number}: {problem}")
        tasks.append(task)  # pyright: ignore[reportUnknownArgumentType]
    if not tasks:
        raise TaskFileError(f"{flag} file {str(path)!r} holds no tasks")
    return tasks
