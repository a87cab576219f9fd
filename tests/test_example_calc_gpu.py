"""The calculator example's GPU recipe, checked on the CPU (the GPU run itself is scripts/gpu_smoke.sh, step 4).

``examples/calc/calc_gpu_config.py`` (verl, SmolLM2-1.7B-Instruct): it expands into verl's own config dataclasses
with the settings the README states; the ``vllm serve`` flags verl would build from it parse with vLLM's own parser;
and the Ray setup hook that registers the ``calc`` tool parser works where a Ray worker runs it (a fresh process that
cannot import the recipe). Without that hook, verl's vLLM server refuses ``--tool-call-parser calc`` (checked too).
``train.py --device cuda --backend vllm --model-dir DIR`` builds its trainer config (the torch-engine GPU recipe).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
CALC = ROOT / "examples" / "calc"


def test_the_gpu_recipe_builds_a_verl_config_with_the_calc_tool_parser() -> None:
    pytest.importorskip("agentlightning_verl")
    pytest.importorskip("verl")
    from verl.utils.config import omega_conf_to_dataclass

    sys.path.insert(0, str(CALC))  # the autouse fixture in conftest.py puts sys.path back
    from calc_gpu_config import CONFIG, LOOP, MODEL, PLUGIN, build  # pyright: ignore[reportMissingImports]

    verl = CONFIG.to_verl_config()
    assert verl.actor_rollout_ref.model.path == MODEL == "HuggingFaceTB/SmolLM2-1.7B-Instruct"
    assert verl.actor_rollout_ref.model.lora_rank == 0  # full weights (the README says why)
    actor = omega_conf_to_dataclass(verl.actor_rollout_ref.actor)
    assert actor.use_kl_loss and actor.kl_loss_coef == 0.05 and actor.optim.lr == 1e-6
    rollout = omega_conf_to_dataclass(verl.actor_rollout_ref.rollout)
    assert rollout.name == "vllm" and rollout.n == 8 and 0 < rollout.gpu_memory_utilization <= 0.5
    assert rollout.engine_kwargs["vllm"] == {
        "enable_auto_tool_choice": True,
        "tool_call_parser": "calc",
        "tool_parser_plugin": str(PLUGIN),
    }
    assert PLUGIN.is_file()
    assert verl.data.max_prompt_length >= 512 and verl.data.max_response_length >= 16
    assert LOOP.samples_per_task == 8 and LOOP.tasks_per_iteration == 32 and LOOP.estimator == "grpo"
    assert LOOP.max_tokens == 16 and LOOP.best_metric == "accuracy" and LOOP.model_name == MODEL

    local = build("/models/smollm2-1.7b-instruct")  # a folder written by `agl model import`
    assert local.to_verl_config().actor_rollout_ref.model.path == "/models/smollm2-1.7b-instruct"
    assert local.loop_config().model_name == "/models/smollm2-1.7b-instruct"


def _verl_vllm_python() -> Path:
    venv = Path(os.environ.get("AGL_VERL_VLLM_VENV") or ROOT / ".venv-verl-vllm")
    python = venv / "bin" / "python"
    if not python.exists():
        pytest.skip(f"no verl + vLLM CPU environment at {venv}: python3 scripts/dev.py verl-vllm")
    return python


@pytest.mark.timeout(1200)  # imports verl, vLLM and Ray twice: minutes on a busy 2-core machine
def test_the_recipes_vllm_flags_parse_and_its_ray_hook_registers_the_calc_parser(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join(str(p) for p in sorted((ROOT / "packages").glob("*/src"))),
    }
    env.pop("VIRTUAL_ENV", None)
    script = ROOT / "tests" / "calc_gpu_recipe_check.py"
    cmd = [str(_verl_vllm_python()), str(script), str(CALC), str(tmp_path / "hook.pkl")]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, f"rc={done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    result: dict[str, Any] = json.loads(lines[-1][len("RESULT ") :])
    assert result["enable_auto_tool_choice"] is True and result["tool_call_parser"] == "calc"
    assert Path(result["tool_parser_plugin"]) == CALC / "vllm_calc_parser.py"
    # what verl's vLLM server meets without the hook: it builds the chat endpoint without importing the plugin
    assert "calc" in result["refused_without_hook"] and "not been registered" in result["refused_without_hook"]
    assert result["fresh_rc"] == 0 and result["fresh_parser"] == "CalcToolParser", result["fresh_stderr"]


def test_train_py_takes_the_gpu_options_with_a_model_folder(tmp_path: Path, example_script: Any) -> None:
    pytest.importorskip("agentlightning_torch")
    train = example_script("calc", "train")
    folder = tmp_path / "smollm2-1.7b-instruct"  # not loaded: the config is checked before the model loads
    folder.mkdir()
    argv = ["--model", "smollm2", "--model-dir", str(folder), "--device", "cuda", "--backend", "vllm"]
    args = train.parse_args([*argv, "--iterations", "2", "--output", str(tmp_path / "run")])
    config = train.build_config(args)
    assert config.device == "cuda" and config.backend == "vllm" and Path(config.model_dir) == folder
    assert config.tool_parser == "calc" and config.vllm.tool_parser_plugin == CALC / "vllm_calc_parser.py"
    assert config.ppo.lora is not None and config.ppo.lora.r == 16 and config.ppo.kl_coef == 0.05
    # the same prompt file as the 135M model: same tokenizer and chat template family
    assert args.prompt_file == CALC / "prompts" / "smollm2.json"


def test_policy_per_agent_gives_the_caller_and_the_answerer_each_an_adapter_at_the_runs_lora_rate(
    tmp_path: Path, example_script: Any
) -> None:
    pytest.importorskip("agentlightning_torch")
    from agentlightning_torch.runkit import UsageError

    train = example_script("calc", "train")
    folder = tmp_path / "smollm2-135m-instruct"  # not loaded: the config is checked before the model loads
    folder.mkdir()
    base = ["--model", "smollm2", "--model-dir", str(folder), "--output", str(tmp_path / "run")]
    config = train.build_config(train.parse_args([*base, "--agent", "langgraph-two", "--policy-per-agent"]))
    assert config.policies is not None
    assert {a: config.policies.resolve(a, None).policy for a in ("caller", "answerer")} == {
        "caller": "caller",
        "answerer": "answerer",
    }
    # the run trains LoRA already: its --lr (5e-4) is the adapters' rate, not 10x it; the run's rank 16 each
    assert {n: s.ppo(config.ppo).lr for n, s in config.policy_settings.items()} == {"caller": 5e-4, "answerer": 5e-4}
    assert {s.lora_settings(config.ppo).r for s in config.policy_settings.values()} == {16}
    # an explicit --policy-settings wins over the run's rate
    args = train.parse_args(
        [*base, "--agent", "langgraph-two", "--policy-per-agent", "--policy-settings", "caller:lr=1e-3"]
    )
    assert train.build_config(args).policy_settings["caller"].lr == 1e-3
    with pytest.raises(UsageError, match="--policy-per-agent needs --agent langgraph-two"):
        train.build_config(train.parse_args([*base, "--policy-per-agent"]))
