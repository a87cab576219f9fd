"""``agl train``: the options every engine shares are defined here, the training is done by an engine plug-in.

``--engine NAME`` (default ``torch``) is read first and its `EnginePlugin` loaded (`load_engine`); the parser is
then built from the shared options (`add_train_arguments`) and the plug-in's own (``agl train --engine NAME --help``
lists both), and the plug-in's ``train(args)`` runs. The engine is loaded only when ``agl train`` runs: ``agl
--help`` and the other commands never import an engine package. An engine that is not installed, or whose package
fails to import, is one line naming the package to install (``agentlightning-NAME``), exit code 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

from agentlightning.cli._engines import DEFAULT_ENGINE, EngineNotFoundError, EnginePlugin, engine_names, load_engine
from agentlightning.cli._judge import add_judge_arguments
from agentlightning.cli._options import add_agent_command_arguments, add_log_level_argument
from agentlightning.loop import ENGINE_ENTRY_POINTS

__all__ = [
    "DEFAULT_ENGINE",
    "EngineNotFoundError",
    "EnginePlugin",
    "add_network_arguments",
    "add_runner_arguments",
    "add_train_arguments",
    "load_engine",
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


def _non_negative_int(value: str) -> int:
    """An option's whole number of 0 or more (``--max-staleness``); argparse names the option on refusal."""
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
    if number < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative (use 0 or more)")
    return number


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
        EngineNotFoundError: ``plugin`` adds an option the core already defines (one line naming it).
    """
    parser = argparse.ArgumentParser(prog="agl train", description=_DESCRIPTION)
    add_train_arguments(parser)
    if plugin is None:
        return parser
    try:
        plugin.add_arguments(parser)
    except argparse.ArgumentError as error:  # a clash with a shared option: the plug-in must rename its own
        raise EngineNotFoundError(f"agl train --engine {engine}: {error}") from None
    return parser


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``agl train`` that every engine shares (an `EnginePlugin` adds its own)."""
    parser.add_argument(
        "--engine",
        default=DEFAULT_ENGINE,
        help=f"the engine that trains, as registered in the {ENGINE_ENTRY_POINTS} entry points (default: "
        f"{DEFAULT_ENGINE}; installed: {', '.join(engine_names()) or 'none'}; pip install agentlightning-NAME)",
    )
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--agent", help="the @agl.rollout function as module:function")
    add_agent_command_arguments(which, parser)
    parser.add_argument("--model", required=True, help="a Hugging Face model folder or hub id")
    parser.add_argument("--tasks", required=True, help="JSONL training tasks, one task dict per line")
    parser.add_argument("--val-tasks", default=None, help="JSONL held-out tasks, evaluated before and after")
    parser.add_argument("--minutes", type=float, default=10.0, help="RL time budget (default: 10)")
    parser.add_argument("--iterations", type=int, default=100_000, help="most RL iterations (either budget ends it)")
    parser.add_argument(
        "--eval-every",
        type=int,
        default=0,
        help="with --val-tasks: evaluate greedily every N iterations, keep the best in checkpoint/best (default: 0, "
        "only before and after)",
    )
    add_runner_arguments(parser)
    parser.add_argument("--workers", type=int, default=32, help="concurrent rollouts per runner (default: 32)")
    parser.add_argument("--output", default="runs/agl-train", help="run folder (default: runs/agl-train)")
    parser.add_argument(
        "--app-dir", default=".", help="folder put first on sys.path to import --agent, or --agent-command's folder"
    )
    parser.add_argument("--tasks-per-iteration", type=int, default=16)
    parser.add_argument("--samples-per-task", type=int, default=8, help="rollouts per task (one GRPO group)")
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        help="most tokens per LLM call (default: 256, or a quarter of the model's context when that is less)",
    )
    parser.add_argument(
        "--rollout-timeout",
        type=float,
        default=600.0,
        help="seconds an iteration waits for rollouts",
    )
    parser.add_argument(
        "--max-staleness",
        type=_non_negative_int,
        default=0,
        metavar="K",
        help="0: synchronous (default); K > 0: rollouts keep running during the update, samples up to K versions "
        "old are trained, importance-corrected",
    )
    parser.add_argument("--lr", type=float, default=1e-5, help="learning rate (default: 1e-5)")
    parser.add_argument("--kl-coef", type=float, default=0.0, help="KL penalty to the starting model (default: 0)")
    parser.add_argument("--entropy-coef", type=float, default=0.0, help="entropy bonus of the loss (default: 0)")
    parser.add_argument("--ppo-epochs", type=int, default=1, help="PPO passes over each batch (default: 1)")
    _add_policy_arguments(parser)
    parser.add_argument("--dashboard-port", type=int, default=4747, help="port of the served store (dashboard)")
    parser.add_argument("--seed", type=int, default=0)
    add_network_arguments(parser)
    add_judge_arguments(parser)
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    add_log_level_argument(parser)


def _add_policy_arguments(parser: argparse.ArgumentParser) -> None:
    """One policy per agent: the map (``--policy``, ``--policies``) and each policy's settings."""
    parser.add_argument(
        "--policy",
        action="append",
        default=[],
        metavar="AGENT=POLICY",
        help="train one LoRA adapter per policy: agent name or glob pattern -> policy (repeatable; 'frozen' is the "
        "untrained base), e.g. --policy writer=writer --policy rewriter=rewriter --policy checker=frozen",
    )
    parser.add_argument(
        "--default-policy", default=None, help="with --policy: the policy of unmapped agents (default: frozen)"
    )
    parser.add_argument(
        "--policies",
        default=None,
        metavar="FILE",
        help='the policy map as JSON: {"agents": {"writer": "writer", "checker": "frozen"}, "default": "frozen"}',
    )
    parser.add_argument(
        "--policy-settings",
        action="append",
        default=[],
        metavar="POLICY:KEY=VALUE[,...]",
        help="with --policy: one policy's weights (LoRA or full), learning rate, KL weight or LoRA shape "
        "(repeatable), e.g. --policy-settings writer:lr=3e-3,rank=16 or writer:weights=full (keys weights=lora|full, "
        "lr, kl, rank, alpha, targets=q_proj+v_proj; a LoRA policy's lr defaults to 10x --lr, a full one's to --lr)",
    )


class _RunnersAction(argparse.Action):
    """``--runners N`` (local processes) or ``--runners ray[=ADDRESS]`` (``--runner-processes`` Ray actors)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option: Any = None):
        text = str(values)
        if text == "ray" or text.startswith("ray="):
            namespace.runners = 0  # no local runner process: the Ray actors run them
            namespace.ray_address = text[4:] or None
            namespace.runners_ray = True
            return
        try:
            namespace.runners = int(text)
        except ValueError:
            parser.error(f"--runners takes a number or ray[=ADDRESS], got {text!r}")
        namespace.runners_ray = False


def add_runner_arguments(parser: argparse.ArgumentParser, default: int = 1) -> None:
    """``--runners N|ray[=ADDRESS]``, ``--runner-processes``, ``--runner-cpus``, ``--ray-placement``.

    ``--runners ray[=ADDRESS]`` sets ``runners`` to 0 (no local runner), ``runners_ray`` to true and ``ray_address``
    (``None`` without ``=ADDRESS``); ``--runners N`` sets ``runners`` to N and ``runners_ray`` to false.

    Args:
        parser: The parser (``agl train``'s, a training script's).
        default: Local runner processes without ``--runners``.
    """
    parser.add_argument(
        "--runners",
        action=_RunnersAction,
        default=default,
        metavar="N|ray[=ADDRESS]",
        help=f"local runner processes (default: {default}; 0: wait for remote runners), or ray[=ADDRESS]: "
        "--runner-processes runner actors placed by the Ray cluster at ADDRESS (default: $RAY_ADDRESS, else a head "
        "in this process)",
    )
    parser.set_defaults(runners_ray=False, ray_address=None)
    parser.add_argument("--runner-processes", type=int, default=1, help="--runners ray: runner actors (default: 1)")
    parser.add_argument("--runner-cpus", type=float, default=1.0, help="--runners ray: CPUs per runner (default: 1)")
    parser.add_argument(
        "--ray-placement",
        choices=("spread", "pack"),
        default="spread",
        help="--runners ray: spread the runners over the nodes (default) or pack them",
    )


def add_network_arguments(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:  # pyright: ignore[reportPrivateUsage]
    """Options of a trainer whose runners may be on other machines (``agl train`` and the examples' trainers).

    ``--store DSN|URL`` / ``--store-servers N`` / ``--serve-store HOST:PORT`` / ``--store-url URL`` +
    ``--store-token`` (`agentlightning.StoreServing`), ``--proxy-host`` / ``--proxy-port`` / ``--advertise-url`` /
    ``--proxy-token`` (`agentlightning.ProxySettings`) and ``--heartbeat-timeout``. Tokens default to
    ``$AGL_STORE_TOKEN`` / ``$AGL_PROXY_TOKEN``.

    Returns:
        The argument group, for a caller's own options of the same kind.
    """
    net = parser.add_argument_group("runners on other machines")
    net.add_argument(
        "--store",
        metavar="DSN|URL",
        help="keep the run's store in a PostgreSQL database (postgresql://user:password@host:port/dbname, empty: a "
        "fresh database or schema; needs agentlightning-core[postgres]) served to the runners by --store-servers "
        "store servers, or use a served store (http://...) ; default: a SQLite file in the run folder",
    )
    net.add_argument(
        "--store-servers",
        type=int,
        default=1,
        metavar="N",
        help="with a database: N `agl store serve` processes over it, the runners spread over them (each fails over "
        "to the others; default: 1)",
    )
    where = net.add_mutually_exclusive_group()
    where.add_argument("--serve-store", metavar="HOST:PORT", help="serve this run's store to runners elsewhere")
    where.add_argument(
        "--store-url",
        help="use a store already served by `agl store serve` (URL, or several separated by commas) instead of a local "
        "file, or a PostgreSQL database (postgresql://..., as --store)",
    )
    net.add_argument("--store-token", default=os.environ.get("AGL_STORE_TOKEN") or None, help="($AGL_STORE_TOKEN)")
    net.add_argument("--proxy-host", default="127.0.0.1", help="interface the LLM proxy binds (default: 127.0.0.1)")
    net.add_argument("--proxy-port", type=int, default=0, help="port of the LLM proxy (default: a free one)")
    net.add_argument("--advertise-url", help="the proxy's URL as runners reach it (NAT, load balancer, 0.0.0.0)")
    net.add_argument("--proxy-token", default=os.environ.get("AGL_PROXY_TOKEN") or None, help="($AGL_PROXY_TOKEN)")
    net.add_argument(
        "--heartbeat-timeout", type=float, default=30.0, help="seconds before a silent runner's rollout is retried"
    )
    return net


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
            parser = train_parser(engine, plugin)
        except EngineNotFoundError as error:
            if "-h" in words or "--help" in words:  # still list the shared options, and say why the engine's are not
                train_parser().print_help()
            print(f"error: {error}", file=sys.stderr)
            return 2
        parsed = parser.parse_args(words)
        parsed.argv = getattr(args, "argv", words)
        return int(plugin.train(parsed))
