"""The run specification: one typed model of the options every engine shares, and the parsers derived from it.

`RunSpec` is the one definition of each shared option of ``agl train`` (its name, type, default and help): the
parser of ``agl train``, the training scripts' parsers (a trainer package's run kit, which only overrides a default
where a script measured another) and the judge's and network's option groups are all
built from it by `add_spec_arguments`. An engine subclasses it with its own options (`EnginePlugin.spec`) and says
which shared options it honours (`EngineCapabilities`); `refuse_unhonoured` refuses, in one line and before anything
loads, a shared option set to a value the engine cannot honour, so that no option is ever silently ignored.
"""

from __future__ import annotations

import argparse
import os
import types
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Self, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from agentlightning.cli._options import log_level, non_negative_int

__all__ = [
    "Cli",
    "EngineCapabilities",
    "EngineRefusal",
    "RunSpec",
    "add_spec_arguments",
    "option_flag",
    "refuse_unhonoured",
]

DEFAULT_ENGINE = "torch"
"""The engine ``agl train`` uses without ``--engine``: one machine, CPU or one GPU."""

NETWORK = "runners on other machines"
JUDGE = "reward from an LLM judge (rewards without a checker)"


@dataclass(frozen=True)
class Cli:
    """How a `RunSpec` field is spelled on a command line, beyond what its type and default say.

    Attributes:
        metavar: argparse's metavar.
        group: The help section (an argument group) the option is listed in; ``None``: the main one.
        exclusive: Options with the same name here are mutually exclusive (argparse's mutually exclusive group).
        required: The option is required; with ``exclusive``, one of its group is.
        env: The environment variable the default is read from when the parser is built.
        parse: A function that parses the text (``--log-level``'s `log_level`), instead of the field's type.
        action: An `argparse.Action` class that sets this field and others (``--runners``).
        flag: ``False``: no option of its own: set by another option's action; ``label`` names it in errors.
        label: How an error names a non-default value of the field (default: its ``--flag``).
    """

    metavar: str | None = None
    group: str | None = None
    exclusive: str | None = None
    required: bool = False
    env: str | None = None
    parse: Callable[[str], Any] | None = None
    action: type[argparse.Action] | None = None
    flag: bool = True
    label: str | None = None


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


class RunSpec(BaseModel):
    """The options every engine shares: what ``agl train`` and the training scripts parse, typed and documented.

    Each field is one option (``tasks_per_iteration``: ``--tasks-per-iteration``); its description is the
    option's help. An engine's own options are the fields of its subclass (`EnginePlugin.spec`).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    engine: str = Field(DEFAULT_ENGINE, description="the engine that trains (pip install agentlightning-NAME)")
    agent: str | None = Field(None, description="the @agl.rollout function as module:function")
    agent_command: str | None = Field(
        None,
        description="instead of --agent: run this program for each rollout, in --app-dir (split as a shell would, "
        "run without a shell: 'node agent.mjs'); the task is on its stdin, the LLM proxy in OPENAI_BASE_URL / "
        'ANTHROPIC_BASE_URL, its reward the last line of its stdout ({"reward": 0.7} or 0.7)',
    )
    agent_timeout: float | None = Field(
        None,
        description="--agent-command: seconds a rollout's command may run before it is stopped and its attempt "
        "failed (default: no limit)",
    )
    model: str = Field(description="a Hugging Face model folder or hub id")
    tasks: str = Field(description="JSONL training tasks, one task dict per line")
    val_tasks: str | None = Field(None, description="JSONL held-out tasks, evaluated before and after")
    minutes: float = Field(10.0, description="RL time budget in minutes")
    iterations: int = Field(100_000, description="most RL iterations (the run ends at either budget)")
    eval_every: int = Field(
        0,
        description="with held-out tasks: evaluate them greedily every N iterations and keep checkpoint/best (0: "
        "only before and after)",
    )
    runners: int = Field(
        1,
        description="local runner processes (0: wait for remote runners), or ray[=ADDRESS]: --runner-processes "
        "runner actors placed by the Ray cluster at ADDRESS (default: $RAY_ADDRESS, else a head in this process)",
    )
    runners_ray: bool = Field(False, description="--runners ray: the runners are Ray actors")
    ray_address: str | None = Field(None, description="--runners ray=ADDRESS: the Ray cluster's address")
    runner_processes: int = Field(1, description="--runners ray: runner actors")
    runner_cpus: float = Field(1.0, description="--runners ray: CPUs per runner")
    ray_placement: Literal["spread", "pack"] = Field(
        "spread", description="--runners ray: spread the runners over the nodes or pack them"
    )
    workers: int = Field(32, description="concurrent rollouts per runner process")
    output: Path = Field(Path("runs/agl-train"), description="run folder (store, metrics, plot, checkpoints)")
    app_dir: str = Field(".", description="folder put first on sys.path to import --agent, or --agent-command's folder")
    tasks_per_iteration: int = Field(16, description="tasks per iteration")
    samples_per_task: int = Field(8, description="rollouts per task (one GRPO group)")
    max_tokens: int | None = Field(
        None, description="most tokens per LLM call (default: 256, or a quarter of the model's context when less)"
    )
    rollout_timeout: float = Field(600.0, description="seconds an iteration waits for its rollouts")
    max_staleness: int = Field(
        0,
        description="0: synchronous; K > 0: the next K iterations' rollouts run during the update (samples up to K "
        "versions off-policy, importance-corrected)",
    )
    lr: float = Field(1e-5, description="the policy's learning rate")
    kl_coef: float = Field(0.0, description="KL penalty to the starting policy (0: none)")
    entropy_coef: float = Field(0.0, description="entropy bonus of the loss (0: none)")
    ppo_epochs: int = Field(1, description="PPO passes over each batch")
    policy: list[str] = Field(
        default_factory=list,
        description="train several policies: agent name or glob pattern -> policy, each trained separately "
        "(repeatable; 'frozen' is the untrained starting model), e.g. --policy writer=writer --policy "
        "rewriter=rewriter --policy checker=frozen",
    )
    default_policy: str | None = Field(None, description="with --policy: the policy of unmapped agents (frozen)")
    policies: str | None = Field(
        None,
        description='the policy map as JSON: {"agents": {"writer": "writer", "checker": "frozen"}, "default": '
        '"frozen"}',
    )
    policy_settings: list[str] = Field(
        default_factory=list,
        description="with several policies: one policy's own settings as KEY=VALUE pairs, the keys the engine's "
        "(repeatable), e.g. --policy-settings writer:lr=3e-3 (each engine's README lists its keys)",
    )
    dashboard_port: int = Field(4747, description="port of the served store (dashboard)")
    seed: int = Field(0, description="random seed")
    store: str | None = Field(
        None,
        description="keep the run's store in a PostgreSQL database (postgresql://user:password@host:port/dbname, "
        "empty: a fresh database or schema; needs agentlightning-core[postgres]) served to the runners by "
        "--store-servers store servers, or use a served store (http://...); default: a SQLite file in the run folder",
    )
    store_servers: int = Field(
        1,
        description="with a database: N `agl store serve` processes over it, the runners spread over them (each "
        "fails over to the others)",
    )
    serve_store: str | None = Field(None, description="serve this run's store to runners elsewhere")
    store_url: str | None = Field(
        None,
        description="use a store already served by `agl store serve` (URL, or several separated by commas) instead "
        "of a local file, or a PostgreSQL database (postgresql://..., as --store)",
    )
    store_token: str | None = Field(None, description="the served store's bearer token ($AGL_STORE_TOKEN)")
    proxy_host: str = Field("127.0.0.1", description="interface the LLM proxy binds")
    proxy_port: int = Field(0, description="port of the LLM proxy (0: a free one)")
    advertise_url: str | None = Field(None, description="the proxy's URL as runners reach it (NAT, load balancer)")
    proxy_token: str | None = Field(None, description="the LLM proxy's bearer token ($AGL_PROXY_TOKEN)")
    heartbeat_timeout: float = Field(30.0, description="seconds before a silent runner's rollout is retried")
    judge: str | None = Field(None, description="an OpenAI-compatible judge server (.../v1)")
    judge_model: str | None = Field(None, description="the judge's model name (with --judge)")
    rubric: str | None = Field(None, description="what a good rollout is, in your words")
    judge_mode: Literal["group", "step", "both"] = Field(
        "group",
        description="group: score each task's rollouts together (final rewards); step: score each LLM call (step "
        "rewards, credit per_step); both",
    )
    judge_weight: float = Field(
        1.0, description="final reward = weight * judge + (1 - weight) * checker (1: the judge alone)"
    )
    judge_max_calls: int | None = Field(None, description="judge calls per iteration (budget)")
    judge_max_tokens: int | None = Field(None, description="judge tokens per iteration (budget)")
    judge_answer_tokens: int | None = Field(None, description="most tokens of one judge answer (default: the server's)")
    judge_attempts: int = Field(
        3, description="tries per judgement (a greedy judge repeats a malformed answer: 1 saves the repeats)"
    )
    judge_timeout: float = Field(120.0, description="seconds per judge answer")
    judge_api_key: str | None = Field(None, description="the judge server's API key ($AGL_JUDGE_API_KEY)")
    quiet: bool = Field(False, description="no progress bar")
    log_level: str = Field("warning", description="logging level: debug, info, warning, error, critical, any case")

    @classmethod
    def from_namespace(cls, args: argparse.Namespace) -> Self:
        """The spec of what a parser built by `add_spec_arguments` parsed (its other attributes are left out).

        Raises:
            pydantic.ValidationError: A value of the wrong type, or a required option missing.
        """
        given = vars(args)
        return cls.model_validate({name: given[name] for name in cls.model_fields if name in given})

    @classmethod
    def engine_fields(cls) -> list[str]:
        """The fields of this subclass that `RunSpec` does not have: an engine's own options."""
        return [name for name in cls.model_fields if name not in RunSpec.model_fields]


_CLI: dict[str, Cli] = {
    "engine": Cli(metavar="NAME"),
    "agent": Cli(exclusive="agent", required=True),
    "agent_command": Cli(metavar="CMD", exclusive="agent", required=True),
    "agent_timeout": Cli(metavar="SECONDS"),
    "runners": Cli(metavar="N|ray[=ADDRESS]", action=_RunnersAction),
    "runners_ray": Cli(flag=False, label="--runners ray"),
    "ray_address": Cli(flag=False, label="--runners ray=ADDRESS"),
    "policy": Cli(metavar="AGENT=POLICY"),
    "policies": Cli(metavar="FILE"),
    "policy_settings": Cli(metavar="POLICY:KEY=VALUE[,...]"),
    "store": Cli(metavar="DSN|URL", group=NETWORK),
    "store_servers": Cli(metavar="N", group=NETWORK),
    "serve_store": Cli(metavar="HOST:PORT", group=NETWORK, exclusive="store"),
    "store_url": Cli(group=NETWORK, exclusive="store"),
    "store_token": Cli(group=NETWORK, env="AGL_STORE_TOKEN"),
    "proxy_host": Cli(group=NETWORK),
    "proxy_port": Cli(group=NETWORK),
    "advertise_url": Cli(group=NETWORK),
    "proxy_token": Cli(group=NETWORK, env="AGL_PROXY_TOKEN"),
    "heartbeat_timeout": Cli(group=NETWORK),
    "judge": Cli(metavar="URL", group=JUDGE),
    "judge_model": Cli(group=JUDGE),
    "rubric": Cli(metavar="FILE", group=JUDGE),
    "judge_mode": Cli(group=JUDGE),
    "judge_weight": Cli(group=JUDGE),
    "judge_max_calls": Cli(group=JUDGE),
    "judge_max_tokens": Cli(group=JUDGE),
    "judge_answer_tokens": Cli(group=JUDGE),
    "judge_attempts": Cli(group=JUDGE),
    "judge_timeout": Cli(group=JUDGE),
    "judge_api_key": Cli(group=JUDGE, env="AGL_JUDGE_API_KEY"),
    "max_staleness": Cli(metavar="K", parse=non_negative_int),
    "log_level": Cli(metavar="LEVEL", parse=log_level),
}
"""How each shared option is spelled beyond its type (an engine's fields carry a `Cli` in their metadata)."""

NETWORK_FIELDS = tuple(name for name, cli in _CLI.items() if cli.group == NETWORK)
"""The options of a trainer whose runners may be on other machines (`agentlightning.cli.add_network_arguments`)."""

JUDGE_FIELDS = tuple(name for name, cli in _CLI.items() if cli.group == JUDGE)
"""The options of a reward from an LLM judge."""

RUNNER_FIELDS = ("runners", "runners_ray", "ray_address", "runner_processes", "runner_cpus", "ray_placement")
"""``--runners N|ray[=ADDRESS]`` and the Ray runners' settings."""


def option_flag(name: str) -> str:
    """The option of field ``name``: ``--tasks-per-iteration`` for ``tasks_per_iteration``."""
    return "--" + name.replace("_", "-")


def _cli(field: FieldInfo, name: str) -> Cli:
    """The `Cli` of a field: from its metadata (an engine's field), else the shared table, else the plain one."""
    for item in field.metadata:
        if isinstance(item, Cli):
            return item
    return _CLI.get(name, Cli())


def _plain(annotation: Any) -> tuple[Any, bool]:
    """``(type, optional)`` of an annotation: ``int | None`` is ``(int, True)``."""
    if get_origin(annotation) in (Union, types.UnionType):
        members = [arg for arg in get_args(annotation) if arg is not type(None)]
        return (members[0] if len(members) == 1 else str), True
    return annotation, False


def _default(field: FieldInfo) -> Any:
    """A field's default (a fresh one from its factory); `PydanticUndefined` for a required field."""
    if field.default_factory is not None:
        return field.default_factory()  # pyright: ignore[reportCallIssue]
    return field.default


def _argparse_kwargs(field: FieldInfo, cli: Cli, default: Any) -> dict[str, Any]:
    """What ``add_argument`` takes for a field: its action or type, choices, default and help."""
    kind, _ = _plain(field.annotation)
    kwargs: dict[str, Any] = {"help": field.description or ""}
    if cli.metavar is not None:
        kwargs["metavar"] = cli.metavar
    if cli.env is not None:
        default = os.environ.get(cli.env) or default
    if default is PydanticUndefined:
        kwargs["required"] = not cli.exclusive  # an exclusive group says it once for all its options
    else:
        kwargs["default"] = default
        if default not in (None, False, [], "") and "default:" not in kwargs["help"] and cli.env is None:
            kwargs["help"] += f" (default: {default})"
    if cli.action is not None:
        kwargs["action"] = cli.action
    elif kind is bool:
        kwargs["action"] = "store_true"
    elif get_origin(kind) is list:
        kwargs["action"] = "append"
    elif get_origin(kind) is Literal:
        choices = get_args(kind)
        kwargs["choices"], kwargs["type"] = choices, type(choices[0])
    elif cli.parse is not None:
        kwargs["type"] = cli.parse
    elif kind in (int, float, Path):
        kwargs["type"] = kind
    return kwargs


def add_spec_arguments(
    parser: argparse.ArgumentParser,
    model: type[RunSpec] = RunSpec,
    names: Iterable[str] | None = None,
    defaults: Mapping[str, Any] | None = None,
    groups: dict[str, Any] | None = None,
    into: Any | None = None,
) -> dict[str, Any]:
    """Add the options of ``model``'s fields (all, or ``names``) to ``parser``, each as its field defines it.

    Args:
        parser: The parser (``agl train``'s, a training script's).
        model: `RunSpec`, or an engine's subclass of it.
        names: The fields to add, in this order (default: all of the model's).
        defaults: A script's own defaults for some of them (``{"lr": 3e-4}``): the same option, another default.
        groups: Argument groups by title, reused and filled in (a title not there is a new group).
        into: Where the options of no group of their own go (``agl train``'s section of the engine; default: the
            parser itself).

    Returns:
        The argument groups by title (``"runners on other machines"``...), for a caller's own options of the kind.

    Raises:
        KeyError: A name or a default that is not a field of ``model``.
    """
    overrides = dict(defaults or {})
    unknown = sorted(set(overrides) - set(model.model_fields))
    if unknown:
        raise KeyError(f"{model.__name__} has no option {', '.join(unknown)}")
    made: dict[str, Any] = {} if groups is None else groups
    exclusive: dict[str, Any] = {}
    for name in model.model_fields if names is None else names:
        field = model.model_fields[name]
        cli = _cli(field, name)
        default = overrides.get(name, _default(field))
        if not cli.flag:  # set by another option's action: only its default here
            parser.set_defaults(**{name: default})
            continue
        where: Any = parser if into is None else into
        if cli.group is not None:
            if cli.group not in made:
                made[cli.group] = parser.add_argument_group(cli.group)
            where = made[cli.group]
        if cli.exclusive is not None:
            if cli.exclusive not in exclusive:
                exclusive[cli.exclusive] = where.add_mutually_exclusive_group(required=cli.required)
            where = exclusive[cli.exclusive]
        where.add_argument(option_flag(name), dest=name, **_argparse_kwargs(field, cli, default))
    return made


class EngineRefusal(ValueError):
    """A shared option set to a value the engine cannot honour: one line naming the option and the engine."""


class EngineCapabilities(BaseModel):
    """Which shared options (`RunSpec` fields) an engine honours; each other one is refused when it is not default.

    Attributes:
        honours: The `RunSpec` fields the engine reads and acts on, whatever their value.
        refusals: Why the engine refuses a field it does not honour (one clause, e.g. ``"several policies need
            --engine torch"``); a field without one is refused as not supported.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    honours: frozenset[str]
    refusals: dict[str, str] = Field(default_factory=dict)

    @field_validator("honours", "refusals")
    @classmethod
    def _shared_options_only(cls, value: Any) -> Any:
        unknown = sorted(set(value) - set(RunSpec.model_fields))
        if unknown:
            raise ValueError(f"not options of agl train: {', '.join(unknown)}")
        return value


def refuse_unhonoured(spec: RunSpec, engine: str, capabilities: EngineCapabilities) -> None:
    """Refuse a shared option that ``spec`` sets to a non-default value ``engine`` does not honour.

    Raises:
        EngineRefusal: One line: the first such option, the engine, and why (a `EngineCapabilities.refusals`).
    """
    for name, field in RunSpec.model_fields.items():
        if name == "engine" or name in capabilities.honours:
            continue
        value = getattr(spec, name)
        if value == _default(field):
            continue
        cli = _cli(field, name)
        label = cli.label or option_flag(name)
        why = capabilities.refusals.get(name, "this engine does not support it (leave it at its default)")
        raise EngineRefusal(f"agl train --engine {engine} cannot honour {label}: {why}")
