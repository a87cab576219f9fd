"""What a training script shows: the curve (training figures per iteration, held-out points), the before / best /
last table, the final JSON line, and one-line errors with their exit codes."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import logging
import os
import sys
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, NoReturn

from agentlightning import IterationReport
from agentlightning.cli import RunnerDied
from agentlightning_torch.runkit._run import RunResult
from agentlightning_torch.runkit._setup import UsageError

__all__ = ["Curve", "plot_run", "print_table", "run_main"]

logger = logging.getLogger(__name__)

Curve = tuple[str, Callable[[IterationReport], float]]
"""A training curve of the plot: its label and the figure of each iteration's report."""


def plot_run(
    result: RunResult,
    path: Path,
    *,
    title: str = "",
    curves: Sequence[Curve] = (("mean sampled reward", lambda r: r.reward_mean),),
    ylim: tuple[float, float] | None = None,
    held_out_label: str = "held-out (greedy)",
) -> bool:
    """Plot ``curves`` per RL iteration and every held-out evaluation (the best one ringed) into ``path``.

    Returns:
        ``False`` (with a warning saying what to install) when matplotlib is missing.
    """
    try:
        import matplotlib
    except ImportError:
        logger.warning("no plot: pip install 'agentlightning-torch[plot]' (matplotlib)")
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    iterations = [r.iteration for r in result.history]
    for index, (label, figure) in enumerate(curves):
        ax.plot(iterations, [figure(r) for r in result.history], label=label, linestyle="-" if index == 0 else "--")
    points = [(r.iteration, result.score(r)) for r in result.evaluations if r.metrics.get("greedy")]
    if points:
        ax.plot([i for i, _ in points], [s for _, s in points], "ko-", label=f"{held_out_label}: {result.metric}")
    if result.best is not None:
        ax.plot(
            [result.best.iteration], [result.score(result.best)], "o", ms=12, mfc="none", mec="tab:red", label="best"
        )
    ax.set(xlabel="RL iteration", title=title)
    if ylim is not None:
        ax.set_ylim(*ylim)
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def print_table(title: str, rows: Sequence[tuple[str, float | None, float | None, float | None]]) -> None:
    """A ``rich`` table on stderr: one row per figure, with its value before RL, at the best checkpoint and last."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for column in ("measure", "before", "best", "last"):
        table.add_column(column, justify="left" if column == "measure" else "right")
    for label, *values in rows:
        table.add_row(label, *("" if v is None else f"{v:.2f}" for v in values))
    Console(stderr=True).print(table)


def run_main(
    work: Callable[[], Coroutine[Any, Any, dict[str, Any]]], show: Callable[[dict[str, Any]], None] | None = None
) -> int:
    """Run a script's training: ``work()`` (checks first, then trains) under the event loop; ``show`` the summary on
    stderr and print it as one JSON line on stdout. Returns the exit code: 2 for a `UsageError` or a runner that
    died (one line, no traceback), 130 for Ctrl-C, 143 for SIGTERM."""
    from agentlightning import run_async  # uvloop when installed

    try:
        summary = run_async(work())
    except (UsageError, RunnerDied) as error:
        print(f"error: {serving_death() or error}", file=sys.stderr)
        return 2
    except Exception:
        death = serving_death()
        if death is None:
            raise
        print(f"error: {death}", file=sys.stderr)  # the cause; the connection errors that followed are noise
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except asyncio.CancelledError:  # SIGTERM (cancel_on_sigterm)
        print("terminated", file=sys.stderr)
        return 143
    if show is not None:
        show(summary)
    print(json.dumps(summary))
    return 0


def serving_death() -> str | None:
    """The first death of a model server this process ran (one line: what died, its status, its log), if any."""
    from agentlightning_torch.vllm._server import serving_deaths

    deaths = serving_deaths()
    return deaths[0] if deaths else None


def exit_process(code: int) -> NoReturn:
    """End a training script with ``code`` without the interpreter's teardown (``sys.exit(main())`` otherwise).

    What a normal exit does that matters runs first (the ``atexit`` handlers: span flushes, logging's, weakref
    finalizers; then stdout and stderr are flushed); what is skipped is freeing every object one by one (torch,
    transformers, the model): measured at ~1.5 s of CPU at the end of each CPU quickstart run, a tenth of its
    trainer's own CPU in a short run. For a script's ``if __name__ == "__main__":`` only, never from library code
    (it ends the process at once).
    """
    try:
        getattr(atexit, "_run_exitfuncs")()  # noqa: B009 - what Py_Finalize runs first (not public API)
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):  # closed, or its reader went away: nothing to lose
                stream.flush()
        os._exit(code)
