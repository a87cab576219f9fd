"""``agl doctor``: is my agent trainable? A few rollouts through ``agl train``'s path, or an existing run's store.

    agl doctor --agent calc_agent:calc_agent --app-dir examples/calc --model toy --tasks train.jsonl [-n 8]
        [--samples 4] [--json] [any agl train option: --tool-parser, --max-tokens, --engine...]
    agl doctor --store runs/agl-train/store.db [--model M] [--agent-filter NAME] [--json]

The first form runs ``-n`` tasks ``--samples`` times each through exactly what ``agl train`` runs (its parser, its
engine plug-in's serving, the LLM proxy, runner processes, the store) and trains nothing: the engine plug-in's
``doctor(spec, round)`` does it (the torch engine has one). The second checks a store that a run left. Both print
one row per agent and call site, the run's figures and one line per problem with its fix
(`agentlightning.doctor.diagnose`); exit code 0 trainable, 1 with problems, 2 when it could not run.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from agentlightning.cli._engines import DEFAULT_ENGINE, EngineNotFoundError, load_engine

__all__ = ["DoctorRound", "add_doctor_arguments", "register"]


class DoctorRound(BaseModel):
    """What ``agl doctor`` adds to ``agl train``'s options: the round an engine plug-in's ``doctor(spec, round)``
    runs (its engine's typed spec holds the rest).

    Attributes:
        doctor_tasks: Tasks of the round (``-n``).
        samples: Rollouts per task, one group (``--samples``).
        as_json: Print the report as one JSON object (``--json``).
        agent_filter: The agents training would select (``None``: every agent).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    doctor_tasks: int = 8
    samples: int = 4
    as_json: bool = False
    agent_filter: list[str] | None = None


_DESCRIPTION = (
    "Is the agent trainable? Runs -n tasks --samples times each through agl train's path (its options apply: "
    "--tool-parser, --max-tokens, --engine...) and trains nothing, or checks a run's --store; prints per agent and "
    "call site what training would get, and one line per problem with its fix. Exit 0: trainable, 1: problems, "
    "2: could not run."
)


def register(subparsers: Any) -> None:
    """Add ``agl doctor`` to the ``agl`` parser (a stand-in: the engine's options are known once it is loaded)."""
    stand_in = subparsers.add_parser(
        "doctor",
        help="is my agent trainable? a few rollouts through agl train's path (or a run's --store), checked",
        add_help=False,
        prefix_chars="\0",  # every word after ``doctor`` (options and --help too) goes to the real parser
    )
    stand_in.add_argument("doctor_args", nargs=argparse.REMAINDER)
    stand_in.set_defaults(func=_run)


def add_doctor_arguments(parser: argparse.ArgumentParser, run: bool = True) -> None:
    """The options only ``agl doctor`` has (`DoctorRound`, an engine plug-in's ``doctor`` reads them); ``run``: with the
    options of a doctor's own rollouts (``-n``, ``--samples``), which a ``--store`` check has none of."""
    group = parser.add_argument_group(
        "agl doctor", "(agl doctor --store URL|FILE [--model M] checks the rollouts of a run's store instead)"
    )
    if run:
        group.add_argument(
            "-n", "--doctor-tasks", dest="doctor_tasks", type=int, default=8, metavar="N", help="tasks (default: 8)"
        )
        group.add_argument("--samples", type=int, default=4, help="rollouts per task, one group (default: 4)")
    group.add_argument("--json", action="store_true", help="print the report as one JSON object")
    group.add_argument(
        "--agent-filter",
        action="append",
        default=None,
        metavar="NAME",
        help="the agents training would select (repeatable; default: every agent)",
    )


def _store_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agl doctor", description=_DESCRIPTION)
    parser.add_argument("--store", required=True, metavar="URL|FILE", help="a run's store: a SQLite file or a URL")
    parser.add_argument("--store-token", default=None, help="the served store's bearer token ($AGL_STORE_TOKEN)")
    parser.add_argument("--model", default=None, help="the model folder, to check prompts against its template")
    parser.add_argument("--engine", default=DEFAULT_ENGINE, help="the engine whose package reads --model")
    add_doctor_arguments(parser, run=False)
    return parser


def _fail(message: str) -> int:
    print(f"agl doctor: error: {message}", file=sys.stderr)
    return 2


def _run(args: argparse.Namespace) -> int:
    words: list[str] = list(args.doctor_args)
    first = argparse.ArgumentParser(add_help=False)
    first.add_argument("--store")
    first.add_argument("--engine", default=DEFAULT_ENGINE)
    known, _ = first.parse_known_args(words)
    if known.store is not None:
        if any(
            word in ("--agent", "--agent-command") or word.startswith(("--agent=", "--agent-command="))
            for word in words
        ):
            return _fail(
                "--store checks the rollouts of an existing run's store; to run the agent, leave --store out (the "
                "doctor's rollouts go to a temporary SQLite store)"
            )
        return _check_store(_store_parser().parse_args(words))
    try:
        plugin = load_engine(known.engine)
    except EngineNotFoundError as error:
        return _fail(str(error).replace("agl train", "agl doctor"))
    doctor = getattr(plugin, "doctor", None)
    if doctor is None:
        return _fail(
            f"the engine {known.engine!r} cannot run agl doctor (its plug-in has no doctor(spec, round)); use --store"
        )
    from agentlightning.cli._spec import EngineRefusal, refuse_unhonoured
    from agentlightning.cli._train import train_parser

    parser = train_parser(known.engine, plugin)
    parser.prog, parser.description = "agl doctor", _DESCRIPTION
    add_doctor_arguments(parser)
    parsed = parser.parse_args(words)
    if parsed.doctor_tasks < 1 or parsed.samples < 1:
        return _fail(f"-n and --samples must be at least 1, got {parsed.doctor_tasks} and {parsed.samples}")
    spec = plugin.spec.from_namespace(parsed)
    try:
        refuse_unhonoured(spec, known.engine, plugin.capabilities)
    except EngineRefusal as error:
        return _fail(str(error).replace("agl train", "agl doctor"))
    round_ = DoctorRound(
        doctor_tasks=parsed.doctor_tasks, samples=parsed.samples, as_json=parsed.json, agent_filter=parsed.agent_filter
    )
    return int(doctor(spec, round_))


def _check_store(args: argparse.Namespace) -> int:
    """``agl doctor --store``: check the finished rollouts of a run's store."""
    from agentlightning import run_async
    from agentlightning.cli._store import connect_store
    from agentlightning.doctor import diagnose, show_report

    location: str = args.store
    remote = location.startswith(("http://", "https://"))
    if not remote and not location.startswith("postgresql") and not Path(location).is_file():
        return _fail(f"--store {location!r}: no such file (give a run's store.db or a served store's URL)")
    renderer, context = None, None
    if args.model is not None:
        try:
            plugin = load_engine(args.engine)
        except EngineNotFoundError as error:
            return _fail(str(error).replace("agl train", "agl doctor"))
        model_for_doctor = getattr(plugin, "doctor_model", None)
        if model_for_doctor is None:
            return _fail(f"the engine {args.engine!r} cannot read --model for agl doctor")
        try:
            renderer, context = model_for_doctor(args.model)
        except (OSError, ValueError) as error:
            return _fail(f"--model {args.model!r}: {str(error).splitlines()[0]}")

    async def check() -> Any:
        store = connect_store(location if remote else None, location, args.store_token)
        try:
            return await diagnose(store, renderer=renderer, context=context, agent_filter=args.agent_filter)
        finally:
            close = getattr(store, "close", None)
            if close is not None:
                result = close()
                if hasattr(result, "__await__"):
                    await result

    try:
        report = run_async(check())
    except Exception as error:  # an unreachable server, a file that is not a store: one line, exit 2
        return _fail(f"cannot read the store {location!r}: {str(error).splitlines()[0] if str(error) else error!r}")
    return show_report(report, args.json)
