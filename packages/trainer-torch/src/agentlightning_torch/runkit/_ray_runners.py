"""Runner processes placed by Ray: ``agl train --runners ray[=ADDRESS] --runner-processes N --runner-cpus C``.

Each runner is a Ray actor that starts one ``agl runner`` (the same command as a local runner, pointed at the
trainer's store and proxy) tied to the actor's process (`agentlightning.cli.start_child`): a ``kill -9`` of the
actor ends its runner, and Ray restarts the actor (``max_restarts``), which starts a new runner; the store's retry
policy gives the killed runner's rollouts to another attempt, so nothing is recorded twice. The actors are spread
over the cluster's nodes by a placement group (``spread`` or ``pack``) and killed when training ends. Each actor
keeps its runner's output (`LineBuffer`) for the trainer, which relays it (`RayRunnerPool.output`).

Ray is an optional import: without it, `RayRunnerPool.start` raises `RayNotInstalledError` (one line with the
install command). The project writes no scheduler of its own: Ray places, restarts and stops.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentlightning_torch.runkit._runner_output import LineBuffer

__all__ = [
    "RayNotInstalledError",
    "RayRunnerPool",
    "RayRunnerSettings",
    "RunnerPlace",
    "import_ray",
    "runner_counts",
    "shipped_settings",
]

logger = logging.getLogger(__name__)

INSTALL = "pip install 'ray[default]'"
LOCAL_OBJECT_STORE_BYTES = 128 * 1024 * 1024
"""Object store of a Ray head the trainer starts itself (Ray's default is 30% of the machine's memory)."""


class RayNotInstalledError(ImportError):
    """``ray`` does not import: the message is one line with the install command."""


def import_ray() -> Any:
    """The ``ray`` module, or `RayNotInstalledError` naming the install command."""
    try:
        import ray  # pyright: ignore[reportMissingImports]
    except ImportError as error:
        raise RayNotInstalledError(f"--runners ray needs Ray ({error}); {INSTALL}") from None
    return ray


@dataclass(frozen=True)
class RayRunnerSettings:
    """Where and how many runner actors run.

    Attributes:
        address: The Ray cluster (``ray.init(address=...)``); ``None``: join a running local cluster if there is one,
            else start a head in this process.
        processes: Runner actors (one ``agl runner`` process each).
        cpus: CPUs Ray reserves per runner actor.
        placement: ``spread`` (over the cluster's nodes, the default) or ``pack``.
        max_restarts: How often Ray restarts a runner actor that died (``-1``: always).
        working_dir: Shipped to the nodes as the runtime env's ``working_dir`` (the ``--app-dir``); ``None``: the
            agent is importable on every node already.
        excludes: Paths in ``working_dir`` not shipped (``.gitignore`` patterns, as the runtime env's ``excludes``).
    """

    address: str | None = None
    processes: int = 1
    cpus: float = 1.0
    placement: str = "spread"
    max_restarts: int = -1
    working_dir: Path | None = None
    excludes: tuple[str, ...] = ()


def shipped_settings(settings: RayRunnerSettings, app_dir: Path, output: Path) -> RayRunnerSettings:
    """``settings`` with the agent's folder shipped to the nodes (unless a ``working_dir`` is set already), without the
    run's own output when it lies inside that folder (checkpoints are never shipped)."""
    if settings.working_dir is not None:
        return settings
    app_dir, output = Path(app_dir).resolve(), Path(output).resolve()
    excludes = (f"/{output.relative_to(app_dir).as_posix()}",) if output.is_relative_to(app_dir) else ()
    return dataclasses.replace(settings, working_dir=app_dir, excludes=excludes)


@dataclass(frozen=True)
class RunnerPlace:
    """Where one runner actor's ``agl runner`` process runs (as the actor reported it last).

    Attributes:
        index: The actor's number (0 to ``processes - 1``).
        node_id: The Ray node it runs on.
        hostname: That node's host name.
        pid: The ``agl runner`` process.
        starts: How many runner processes this actor has run so far (restarts + 1) as seen by `RayRunnerPool.places`.
        actor_pid: The Ray actor's own process (the runner's parent).
        cwd: The actor's (and its runner's) working directory: Ray's copy of the shipped ``working_dir``, if any.
    """

    index: int
    node_id: str
    hostname: str
    pid: int
    starts: int
    actor_pid: int = 0
    cwd: str = ""


class _RunnerActor:
    """The body of one Ray actor: starts its ``agl runner`` in ``__init__`` (so a restart starts a new one)."""

    def __init__(self, cmd: Sequence[str], env: Mapping[str, str]) -> None:
        from agentlightning.cli import start_child

        # Runs in the actor's process: the runner's working directory is the shipped working_dir, if any.
        app_dir = os.getcwd()
        full_cmd = [arg if arg != "{app_dir}" else app_dir for arg in cmd]
        # the runner's output goes to the trainer (`output`), not to Ray's log files on this node
        self._process: subprocess.Popen[bytes] = start_child(
            full_cmd, env={**os.environ, **env, "PYTHONUNBUFFERED": "1"}, start_new_session=True,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )  # fmt: skip
        assert self._process.stdout is not None
        self._output = LineBuffer(self._process.stdout)

    def place(self) -> dict[str, Any]:
        import ray  # pyright: ignore[reportMissingImports]

        context: Any = ray.get_runtime_context()
        where = {"node_id": str(context.get_node_id()), "hostname": socket.gethostname(), "pid": self._process.pid}
        return {**where, "actor_pid": os.getpid(), "cwd": os.getcwd()}

    def exit_code(self) -> int | None:
        return self._process.poll()

    def output(self) -> list[str]:
        return self._output.drain()

    def stop(self) -> list[str]:
        """Stop the runner; returns its last output lines."""
        from agentlightning.cli import stop_children

        stop_children([self._process], grace_s=10.0)
        self._output.join(timeout=5.0)
        return self._output.drain()


@dataclass
class RayRunnerPool:
    """The runner actors of one training run: `start`, `places`, `stop` (always, on every way out)."""

    settings: RayRunnerSettings
    actors: list[Any] = field(default_factory=list[Any])
    _group: Any = None
    _started_ray: bool = False
    _seen: dict[int, dict[int, RunnerPlace]] = field(default_factory=dict[int, dict[int, RunnerPlace]])

    def start(self, cmd: Sequence[str], env: Mapping[str, str]) -> None:
        """Connect to (or start) Ray and start the runner actors, each running ``cmd`` (``{app_dir}``: its folder).

        With a ``working_dir`` (shipped when this call connects to Ray: Ray ships a local folder per job only), the
        folder's path in ``cmd`` becomes ``{app_dir}``: each runner imports the agent from its node's copy, so a
        node that does not have the folder runs it too. Blocks until the placement group is ready and every runner
        process has started.
        """
        ray = import_ray()
        settings = self.settings
        if settings.placement not in ("spread", "pack"):
            raise ValueError(f"--ray-placement must be spread or pack, got {settings.placement!r}")
        if not ray.is_initialized():
            runtime_env: dict[str, Any] = {}
            if settings.working_dir is not None:
                runtime_env["working_dir"] = str(settings.working_dir)
                runtime_env["excludes"] = list(settings.excludes)
            address = settings.address or os.environ.get("RAY_ADDRESS") or "local"
            # a head of our own holds no objects (the runners talk to the store over HTTP): a small object store
            small = {"object_store_memory": LOCAL_OBJECT_STORE_BYTES} if address == "local" else {}
            ray.init(
                address=address, runtime_env=runtime_env or None, log_to_driver=True, include_dashboard=False, **small
            )
            self._started_ray = True
            cmd = _shipped(cmd, settings.working_dir)
        elif settings.working_dir is not None:
            logger.warning("Ray was connected before: %s is not shipped, every node needs it", settings.working_dir)
        from ray.util.placement_group import placement_group  # pyright: ignore[reportMissingImports]
        from ray.util.scheduling_strategies import (  # pyright: ignore[reportMissingImports]
            PlacementGroupSchedulingStrategy,
        )

        bundles = [{"CPU": settings.cpus} for _ in range(settings.processes)]
        self._group = placement_group(bundles, strategy=settings.placement.upper())
        ray.get(self._group.ready())
        actor_class: Any = ray.remote(_RunnerActor)
        for index in range(settings.processes):
            strategy = PlacementGroupSchedulingStrategy(self._group, placement_group_bundle_index=index)
            options = {"num_cpus": settings.cpus, "max_restarts": settings.max_restarts, "max_task_retries": -1}
            actor = actor_class.options(scheduling_strategy=strategy, **options).remote(list(cmd), dict(env))
            self.actors.append(actor)
        self.places()  # waits until each actor (and its runner process) has started

    def places(self) -> list[RunnerPlace]:
        """Where each runner runs now (a restarted actor reports its new process); also counts starts per actor."""
        ray = import_ray()
        found: list[dict[str, Any]] = ray.get([actor.place.remote() for actor in self.actors])
        places: list[RunnerPlace] = []
        for index, where in enumerate(found):
            seen = self._seen.setdefault(index, {})
            pid, actor_pid = int(where["pid"]), int(where["actor_pid"])
            starts = len(seen) + (pid not in seen)
            place = RunnerPlace(index, where["node_id"], where["hostname"], pid, starts, actor_pid, where["cwd"])
            seen.setdefault(pid, place)
            places.append(place)
        return places

    def all_places(self) -> list[RunnerPlace]:
        """Every runner process seen so far (a restarted actor's earlier ones too), after asking the actors now."""
        self.places()
        return [place for seen in self._seen.values() for place in seen.values()]

    def output(self) -> list[tuple[int, str]]:
        """The runners' output lines since the last call, as ``(actor index, line)`` (an actor that does not answer
        within 10 s, dead or restarting, is skipped: what its runner wrote last is lost with it)."""
        ray = import_ray()
        lines: list[tuple[int, str]] = []
        for index, ref in enumerate([actor.output.remote() for actor in self.actors]):
            try:
                lines += [(index, line) for line in ray.get(ref, timeout=10)]
            except Exception:  # see the docstring
                continue
        return lines

    def stop(self) -> list[tuple[int, str]]:
        """Stop every runner (SIGTERM, then SIGKILL), kill the actors, free the placement group and Ray if ours.

        Returns:
            The runners' last output lines (as `output`).
        """
        if not self.actors and self._group is None:
            return []
        ray = import_ray()
        last: list[tuple[int, str]] = []
        try:
            found: list[list[str]] = ray.get([actor.stop.remote() for actor in self.actors], timeout=20)
            last = [(index, line) for index, lines in enumerate(found) for line in lines]
        except Exception as error:  # a dead or unreachable actor: killed below all the same
            logger.warning("ray runners did not all stop cleanly: %s", error)
        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        self.actors = []
        if self._group is not None:
            from ray.util.placement_group import remove_placement_group  # pyright: ignore[reportMissingImports]

            remove_placement_group(self._group)
            self._group = None
        if self._started_ray:
            ray.shutdown()
            self._started_ray = False
        return last


def _shipped(cmd: Sequence[str], working_dir: Path | None) -> list[str]:
    """``cmd`` with ``working_dir``'s path as ``{app_dir}`` (the actor's copy of it); unchanged without one."""
    if working_dir is None:
        return list(cmd)
    local = str(Path(working_dir).resolve())
    return ["{app_dir}" if arg == local else arg for arg in cmd]


async def runner_counts(store: Any, places: Sequence[RunnerPlace]) -> dict[int, dict[str, int]]:
    """Per runner actor: attempts ``claimed``, ``finished`` (succeeded) and ``failed`` (any other end), from the store.

    An attempt's worker id is ``host:pid:index`` (``agl runner``): it is matched to the runner process's host and pid
    (`agentlightning.store.runner_totals` of the store's `RunStats.workers`, one request), so a restarted actor's
    earlier processes count only if `RayRunnerPool.places` saw them (`RayRunnerPool.all_places`).
    """
    from agentlightning.store import runner_totals

    totals = runner_totals((await store.run_stats()).workers)
    counts = {place.index: {"claimed": 0, "finished": 0, "failed": 0} for place in places}
    for place in places:
        total = totals.get(f"{place.hostname}:{place.pid}")
        if total is not None:
            for key in ("claimed", "finished", "failed"):
                counts[place.index][key] += total[key]
    return counts
