"""``agl train``: the options every engine shares are defined here, the training is done by an engine plug-in.

``--engine NAME`` (default ``torch``) is read first and its `EnginePlugin` loaded (`load_engine`); the parser is
then built from the shared options (`RunSpec`, `add_train_arguments`) and the plug-in's own (the fields of its
`EnginePlugin.spec`; ``agl train --engine NAME --help`` lists both). The command line becomes the engine's typed
spec, a shared option the engine cannot honour is refused in one line (`EngineCapabilities`), and the plug-in's
``train(spec)`` runs. The engine is loaded only when ``agl train`` runs: ``agl --help`` and the other commands never
import an engine package. An engine that is not installed, or whose package fails to import, is one line naming the
package to install (``agentlightning-NAME``), exit code 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from agentlightning.cli._engines import DEFAULT_ENGINE, EngineNotFoundError, EnginePlugin, engine_names, load_engine
from agentlightning.cli._spec import (
    NETWORK,
    NETWORK_FIELDS,
    RUNNER_FIELDS,
    EngineRefusal,
    RunSpec,
    add_spec_arguments,
    option_flag,
    refuse_unhonoured,
)
from agentlightning.loop import ENGINE_ENTRY_POINTS

__all__ = [
    "DEFAULT_ENGINE",
    "EngineNotFoundError",
    "EnginePlugin",
    "add_network_arguments",
    "add_runner_arguments",
    "add_train_arguments",
    "load_engine",
    "parse_train_spec",
    "register",
    "train_parser",
]

_DESCRIPTION = (
    "Run the agent (module:function decorated with @agl.rollout) on the tasks in runner processes, serve the model "
    "behind the LLM proxy and train it with PPO/GRPO on an engine (--engine); writes the store, metrics.jsonl, a "
    "reward plot and checkpoints into --output. agl train --engine NAME --help lists that engine's own options too."
)


def register(subparsers: Any) -> None:
    """Add ``agl train`` to the ``agl`` parser.

    A stand-in that takes the rest of the command line as it is (``--help`` too), as other packages' commands do:
    the real parser needs the engine's options, so it is built when the command runs (`train_parser`).
    """
    stand_in = subparsers.add_parser(
        "train",
        help="train an @agl.rollout agent on a Hugging Face model (needs an engine package; default: torch)",
        add_help=False,
        prefix_chars="\0",  # no option prefix: every word after ``train``, options and --help included, goes on
    )
    stand_in.add_argument("train_args", nargs=argparse.REMAINDER)
    stand_in.set_defaults(func=_run, serving="agl train")


def _engine_named(words: Sequence[str]) -> str:
    """The ``--engine`` of ``agl train``'s command line (the default when it has none)."""
    first = argparse.ArgumentParser(prog="agl train", add_help=False)
    first.add_argument("--engine", default=DEFAULT_ENGINE)
    known, _ = first.parse_known_args(list(words))
    return str(known.engine)


def train_parser(engine: str = DEFAULT_ENGINE, plugin: EnginePlugin | None = None) -> argparse.ArgumentParser:
    """``agl train``'s parser: the shared options, and ``plugin``'s own (none without a plug-in).

    What ``agl train --engine NAME`` parses with: an engine package's tests build it with their plug-in.

    Raises:
        EngineNotFoundError: ``plugin``'s spec redefines a shared option (one line naming it).
    """
    parser = argparse.ArgumentParser(prog="agl train", description=_DESCRIPTION)
    add_train_arguments(parser)
    parser.set_defaults(engine=engine)  # the spec names the engine it was parsed for, --engine given or not
    if plugin is None:
        return parser
    own = plugin.spec.model_fields
    clashes = [name for name, field in RunSpec.model_fields.items() if repr(own.get(name)) != repr(field)]
    if clashes:  # one definition of each shared option: an engine adds options, it does not redefine one
        raise EngineNotFoundError(
            f"agl train --engine {engine}: its spec redefines the shared option {option_flag(clashes[0])}; an "
            "engine adds options of its own and lists the shared ones it honours in its capabilities"
        )
    group = parser.add_argument_group(f"--engine {engine}", plugin.summary)
    add_spec_arguments(parser, plugin.spec, plugin.spec.engine_fields(), into=group)
    return parser


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``agl train`` that every engine shares: one per `RunSpec` field (an engine adds its own)."""
    add_spec_arguments(parser)
    engine = next(action for action in parser._actions if action.dest == "engine")  # pyright: ignore[reportPrivateUsage]
    # the installed engines are known only when the parser is built, not when the model is defined
    engine.help = (
        f"the engine that trains, as registered in the {ENGINE_ENTRY_POINTS} entry points (default: "
        f"{DEFAULT_ENGINE}; installed: {', '.join(engine_names()) or 'none'}; pip install agentlightning-NAME)"
    )


def add_runner_arguments(parser: argparse.ArgumentParser, default: int = 1) -> None:
    """``--runners N|ray[=ADDRESS]``, ``--runner-processes``, ``--runner-cpus``, ``--ray-placement`` (`RunSpec`).

    ``--runners ray[=ADDRESS]`` sets ``runners`` to 0 (no local runner), ``runners_ray`` to true and ``ray_address``
    (``None`` without ``=ADDRESS``); ``--runners N`` sets ``runners`` to N and ``runners_ray`` to false.

    Args:
        parser: The parser (``agl train``'s, a training script's).
        default: Local runner processes without ``--runners``.
    """
    add_spec_arguments(parser, names=RUNNER_FIELDS, defaults={"runners": default})


def add_network_arguments(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:  # pyright: ignore[reportPrivateUsage]
    """Options of a trainer whose runners may be on other machines (``agl train`` and the examples' trainers).

    ``--store DSN|URL`` / ``--store-servers N`` / ``--serve-store HOST:PORT`` / ``--store-url URL`` +
    ``--store-token`` (`agentlightning.StoreServing`), ``--proxy-host`` / ``--proxy-port`` / ``--advertise-url`` /
    ``--proxy-token`` (`agentlightning.ProxySettings`) and ``--heartbeat-timeout``, as `RunSpec` defines them.
    Tokens default to ``$AGL_STORE_TOKEN`` / ``$AGL_PROXY_TOKEN``.

    Returns:
        The argument group, for a caller's own options of the same kind.
    """
    return add_spec_arguments(parser, names=NETWORK_FIELDS)[NETWORK]


def parse_train_spec(words: Sequence[str], engine: str = DEFAULT_ENGINE, plugin: EnginePlugin | None = None) -> Any:
    """``agl train``'s command line as the engine's typed spec (its `EnginePlugin.spec`), its capabilities checked.

    What ``agl train`` hands its engine, before anything loads; an engine package's tests use it too. Without a
    plug-in: the shared options as a `RunSpec`.

    Raises:
        EngineRefusal: A shared option set to a value the engine cannot honour (one line).
        EngineNotFoundError: The plug-in's spec redefines a shared option.
        SystemExit: argparse's own refusal (its usage line, exit code 2).
    """
    parsed = train_parser(engine, plugin).parse_args(list(words))
    if plugin is None:
        return RunSpec.from_namespace(parsed)
    try:
        spec = plugin.spec.from_namespace(parsed)
    except ValidationError as error:  # argparse parsed it with the same types: an engine's own validator refused
        first = error.errors()[0]
        where = option_flag(str(first["loc"][0])) if first["loc"] else "options"
        raise EngineRefusal(f"agl train --engine {engine}: {where}: {first['msg']}") from None
    refuse_unhonoured(spec, engine, plugin.capabilities)
    return spec


def _run(args: argparse.Namespace) -> int:
    from agentlightning._eventloop import sigint_taken
    from agentlightning._gc import defer_full_gc

    words: list[str] = list(args.train_args)
    engine = _engine_named(words)
    # Ctrl-C stops agl train however it was started, a script's background job (SIGINT ignored) too: from here on,
    # while the engine loads, not only once its event loop runs (`agentlightning.run_async`)
    with sigint_taken(), defer_full_gc():  # the engine imports torch next: no full collections until its loop starts
        try:
            plugin = load_engine(engine)
            spec = parse_train_spec(words, engine, plugin)
        except (EngineNotFoundError, EngineRefusal) as error:
            if "-h" in words or "--help" in words:  # still list the shared options, and say why the engine's are not
                train_parser().print_help()
            print(f"error: {error}", file=sys.stderr)
            return 2
        return int(plugin.train(spec))
