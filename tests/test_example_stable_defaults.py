"""The sql, rag and math examples' default command is the README's measured run: stable RL settings, an iterations
budget, held-out points during training. A user who runs ``python examples/<name>/train.py`` on any machine gets the
settings whose figures the README reports (issue 26), and each setting reaches the trainer."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("agentlightning_torch")


def _parse(example: str, module: Any, argv: list[str]) -> Any:
    return module.parse_train_args(argv) if example == "math" else module.parse_args(argv)


@pytest.mark.parametrize(("example", "iterations"), [("sql", 30), ("rag", 20), ("math", 30)])
def test_the_default_command_is_the_readme_run_with_the_stable_settings(
    example: str, iterations: int, example_script: Any, tmp_path: Any
) -> None:
    if example == "sql":
        pytest.importorskip("langgraph")
    module = example_script(example, "train")
    config = module.build_config(_parse(example, module, ["--output", str(tmp_path)]))
    assert config.iterations == iterations and config.eval_every == 10
    assert config.time_budget_s == 3600  # a cap only: the iterations end the run first on any machine
    ppo = config.ppo
    assert (ppo.lr, ppo.kl_coef, ppo.entropy_coef, ppo.epochs) == (3e-4, 0.05, 0.01, 2)
    assert module.STABLE["iterations"] == iterations


@pytest.mark.parametrize("example", ["sql", "rag", "math"])
def test_the_stability_options_still_override_the_defaults(example: str, example_script: Any, tmp_path: Any) -> None:
    if example == "sql":
        pytest.importorskip("langgraph")
    module = example_script(example, "train")
    argv = ["--output", str(tmp_path), "--kl-coef", "0", "--entropy-coef", "0", "--ppo-epochs", "1", "--lr", "5e-4"]
    config = module.build_config(_parse(example, module, [*argv, "--iterations", "7", "--eval-every", "0"]))
    assert (config.ppo.lr, config.ppo.kl_coef, config.ppo.entropy_coef, config.ppo.epochs) == (5e-4, 0, 0, 1)
    assert config.iterations == 7 and config.eval_every == 0
