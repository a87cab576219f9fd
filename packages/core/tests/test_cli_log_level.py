"""Every ``agl`` command reads ``--log-level`` the same way: in any case, with the usual aliases; a level it does not
know is refused by naming the option (never a traceback, nor an error about something else)."""

from __future__ import annotations

import argparse

import pytest

from agentlightning.cli import build_parser
from agentlightning.cli._train import train_parser

COMMANDS = {
    "train": ["train", "--agent", "my_agent:solve", "--model", "some/model", "--tasks", "tasks.jsonl"],
    "runner": ["runner", "--agent", "my_agent:solve", "--db", "store.db"],
    "store serve": ["store", "serve", "--memory"],
    "proxy serve": ["proxy", "serve", "--db", "store.db", "--backend", "http://127.0.0.1:8000"],
}


def _parse(command: list[str]) -> argparse.Namespace:
    """``agl`` parses ``command`` (``agl train``'s options: its parser, built when it runs with its engine's)."""
    if command[0] == "train":
        return train_parser().parse_args(command[1:])
    return build_parser().parse_args(command)


@pytest.mark.parametrize("command", COMMANDS.values(), ids=COMMANDS.keys())
@pytest.mark.parametrize(
    ("given", "level"),
    [("debug", "debug"), ("DEBUG", "debug"), ("Info", "info"), ("warn", "warning"), ("WARNING", "warning"),
     ("error", "error"), ("fatal", "critical"), ("CRITICAL", "critical")],
)  # fmt: skip
def test_every_command_reads_the_usual_spellings_of_a_log_level(command: list[str], given: str, level: str) -> None:
    # one spelling for the command's own logging (level.upper()) and for uvicorn (lower-case names only)
    assert _parse([*command, "--log-level", given]).log_level == level
    assert _parse(command).log_level == "warning"


@pytest.mark.parametrize("command", COMMANDS.values(), ids=COMMANDS.keys())
def test_a_level_that_does_not_exist_is_refused_naming_the_option(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        _parse([*command, "--log-level", "verbose"])
    assert exited.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert "argument --log-level: 'verbose' is not a log level (use one of: debug, info, warning, error, critical)" in (
        error
    )
