"""The runners' progress in the trainer's output: per-runner attempt counts each iteration, Ray runners' output.

Counts come from the store (`agentlightning.store.RunStats.workers`, grouped per runner process by
`agentlightning.store.runner_totals`), so local runners, runners started by hand on other machines and runners
placed by Ray are counted alike; the dashboard's Runs page shows the same table. A Ray runner's output (its
``agl runner``'s stdout and stderr, which Ray would otherwise keep in its own log files on that node) is relayed
line by line as ``ray runner I | ...`` and kept in ``<output>/runners/ray-runner-I.log``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from agentlightning.store import runner_totals

__all__ = ["RunnerReport"]

logger = logging.getLogger(__name__)


class RunnerReport:
    """Relays the runners' progress to ``console`` while a run trains (`watch`), until `close`.

    Args:
        console: The run's ``rich`` console.
        store: The run's store.
        output: The run folder (Ray runners' logs go to ``runners/`` in it).
        pool: The run's `RayRunnerPool` (``None``: no Ray runners).
        counts: Print every runner's counts after each iteration (runners the trainer does not start itself).
    """

    def __init__(self, console: Any, store: Any, output: Path, pool: Any = None, counts: bool = True) -> None:
        self.console = console
        self.store = store
        self.folder = output / "runners"
        self.pool = pool
        self.counts = counts
        self._files: dict[int, IO[str]] = {}
        self._failed = False
        self._counting: list[asyncio.Task[None]] = []

    def iteration_done(self, iteration: int) -> None:
        """Called (in the event loop) as each training iteration ends: its counts line is printed now, not at the next
        poll (two iterations can end between polls on a fast run or a busy machine: each gets its line)."""
        if self.counts:
            self._counting.append(asyncio.get_running_loop().create_task(self._guarded(self.print_counts(iteration))))

    async def watch(self, trainer: Any, every_s: float = 1.0) -> None:
        """Relay the Ray runners' output every ``every_s``."""
        while True:
            await asyncio.sleep(every_s)
            await self.catch_up(trainer)

    async def catch_up(self, trainer: Any) -> None:
        """Relay the Ray runners' output so far, after every counts line asked for so far is printed."""
        counting, self._counting = self._counting, []
        await asyncio.gather(*counting)
        if self.pool is not None and self.pool.actors:
            await self._guarded(self._relay())

    async def _relay(self) -> None:
        assert self.pool is not None
        self.write(await asyncio.to_thread(self.pool.output))

    async def _guarded(self, work: Any) -> None:
        try:
            await work
        except Exception as error:  # a report must never stop the run: say it once and go on
            if not self._failed:
                self._failed = True
                self.console.print(f"runner report: {error}".splitlines()[0], markup=False)

    def write(self, lines: Sequence[tuple[int, str]]) -> None:
        """Print Ray runners' output lines (``(actor index, line)``) and append them to their log files."""
        for index, line in lines:
            self.console.print(f"ray runner {index} | {line}", markup=False, highlight=False)
            file = self._files.get(index)
            if file is None:
                self.folder.mkdir(parents=True, exist_ok=True)
                file = self._files[index] = (self.folder / f"ray-runner-{index}.log").open("a", encoding="utf-8")
            file.write(line + "\n")
        for file in self._files.values():
            file.flush()

    async def print_counts(self, iteration: int) -> None:
        """One line: each runner process's attempts so far (claimed, finished, failed, running)."""
        totals = runner_totals((await self.store.run_stats()).workers)
        names: dict[str, int] = {}
        if self.pool is not None:
            places = await asyncio.to_thread(self.pool.all_places)
            names = {f"{place.hostname}:{place.pid}": place.index for place in places}
        parts: list[str] = []
        for runner, total in totals.items():
            index = names.get(runner)
            label = runner if index is None else f"ray runner {index} ({runner})"
            counts = f"claimed {total['claimed']} finished {total['finished']} failed {total['failed']}"
            parts.append(f"{label} {counts}" + (f" running {total['running']}" if total["running"] else ""))
        self.console.print(f"it {iteration:3d} runners: " + ("; ".join(parts) or "none yet"), markup=False)

    def close(self) -> None:
        """Close the log files (idempotent)."""
        for file in self._files.values():
            file.close()
        self._files.clear()
