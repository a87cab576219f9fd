"""The engines ``agl train`` trains with: the `EnginePlugin` contract and how the core finds one by name.

The core names no engine package: ``--engine NAME`` is looked up in the `agentlightning.loop.ENGINE_ENTRY_POINTS`
entry-point group, which engine packages register in their ``pyproject.toml`` (``mine =
"my_package.cli:MyEngine"``); the entry point is loaded (and its package imported) only when
``agl train`` runs. An engine that is not installed, whose package fails to import, or whose entry point is not a
plug-in is one line naming the package to install (``agentlightning-NAME``).
"""

from __future__ import annotations

from importlib.metadata import EntryPoint, entry_points
from typing import Any, Protocol, runtime_checkable

from agentlightning.cli._spec import DEFAULT_ENGINE, EngineCapabilities, RunSpec
from agentlightning.loop import ENGINE_ENTRY_POINTS

__all__ = ["DEFAULT_ENGINE", "EngineNotFoundError", "EnginePlugin", "load_engine"]


@runtime_checkable
class EnginePlugin(Protocol):
    """What an engine package registers for ``agl train --engine NAME``: its options and capabilities, and the run.

    The core's `RunSpec` defines the options every engine shares (the agent, tasks, budgets, runners, store and
    network, policies, the loop's hyperparameters: ``agl train --help`` without an engine installed lists them);
    the plug-in's ``spec`` subclasses it with the options only it understands (a serving backend, devices, a
    cluster's size; each field is one option, its description the help), and its ``capabilities`` name the shared
    options it honours: any other one set to a non-default value is refused in one line before the plug-in runs.
    The entry point names a plug-in object or a class built without arguments.

    Attributes:
        summary: One line saying what the engine is, shown above its options in ``agl train --help``.
        spec: The engine's run specification: `RunSpec` and the engine's own options (it may not redefine a shared
            one).
        capabilities: The shared options the engine honours, and why it refuses the others.
    """

    summary: str
    spec: type[RunSpec]
    capabilities: EngineCapabilities

    def train(self, spec: Any) -> int:
        """Run ``agl train`` with ``spec`` (an instance of ``self.spec``, checked against the capabilities).

        Bad input is refused in one line with exit code 2, as the core's own commands do.
        """
        ...


class EngineNotFoundError(Exception):
    """No usable engine of that name: the message is one line that names the package to install."""


def _engine_entry_points() -> list[EntryPoint]:
    return sorted(entry_points(group=ENGINE_ENTRY_POINTS), key=lambda ep: ep.name)


def engine_names() -> list[str]:
    """The names of the installed engines (`ENGINE_ENTRY_POINTS`), sorted."""
    return [ep.name for ep in _engine_entry_points()]


def load_engine(name: str) -> EnginePlugin:
    """The `EnginePlugin` that the engine package registered as ``name`` (a class is instantiated).

    Raises:
        EngineNotFoundError: No entry point ``name`` in the group, its package does not import, or it names
            something that is not a plug-in (a ``train(args)`` function, or a plug-in of the argparse contract).
    """
    install = f"pip install agentlightning-{name}"
    found = _engine_entry_points()
    matches = [ep for ep in found if ep.name == name]
    if not matches:
        others = f" (installed: {', '.join(ep.name for ep in found)})" if found else ""
        raise EngineNotFoundError(f"agl train --engine {name}: no such engine is installed{others}; {install}")
    entry = matches[0]
    try:
        target: Any = entry.load()
    except (ImportError, AttributeError) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise EngineNotFoundError(
            f"agl train --engine {name}: its entry point {entry.value} does not load ({reason}); {install}"
        ) from None
    plugin: Any = target() if isinstance(target, type) else target
    if not isinstance(plugin, EnginePlugin):
        raise EngineNotFoundError(
            f"agl train --engine {name}: its entry point {entry.value} is not an engine plug-in (an object with "
            f"summary, spec, capabilities and train(spec)); upgrade it: {install} --upgrade"
        )
    return plugin
