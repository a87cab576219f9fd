#!/usr/bin/env python3
"""Set up the project and run its two main jobs; needs only Python 3.11+ and pip.

    python3 scripts/dev.py quickstart   # make .venv, install core + LangChain adapter + trainer-torch, train
    python3 scripts/dev.py test         # make .venv, install every package + dev tools, run ruff, pyright and pytest
    python3 scripts/dev.py build        # build a wheel of every package into dist/ (pip install them anywhere)

Installation goes through pip (not uv) on purpose: pip honours a machine's own configuration (a local
CPU wheel of torch, an internal index), while uv would fetch the CUDA build of torch from PyPI. The uv
workspace and its committed ``uv.lock`` remain the source of truth for ``uv sync`` users on GPU machines.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = Path(os.environ.get("AGL_VENV", ROOT / ".venv"))

# One pinned torch for every environment; an unpinned torch lets pip pick a newer, multi-GB CUDA build.
TORCH = "torch==2.13.0"

QUICKSTART_PACKAGES = ["packages/core", "packages/adapter-langchain", "packages/trainer-torch[plot]"]
# The example agent is an ordinary LangGraph app calling an OpenAI-compatible endpoint.
QUICKSTART_AGENT = ["langgraph>=1.0", "langchain-openai>=0.3"]
ALL_PACKAGES = [
    "packages/core[openai,litellm,otlp]",
    "packages/adapter-langchain",
    "packages/adapter-openai-agents",
    "packages/adapter-autogen",
    "packages/trainer-torch[plot,lora]",
    "packages/trainer-verl",
]
DEV_TOOLS = [
    "pytest>=8",
    "pytest-asyncio>=0.24",
    "pytest-timeout>=2.3",
    "hypothesis>=6.100",
    "schemathesis>=4",
    "ruff>=0.6",
    "pyright>=1.1.380",
    # test clients of the real frameworks
    "langgraph>=1.0",
    "langchain-openai>=0.3",
    "autogen-ext[openai]>=0.7",
    # drives Debian's chromium in the dashboard's browser tests (no browser download: the system one is used)
    "playwright>=1.45",
    # builds the core wheel in a test that checks the dashboard's files ship inside it
    "hatchling>=1.24",
]

# System packages the tests need; installed with apt when the job runs as root (CI does).
APT_PACKAGES = {"chromium": "chromium", "ip": "iproute2"}
"""Command -> Debian package: the browser the dashboard tests drive, `ip` for the network-namespace tests."""


def _bin(name: str) -> str:
    sub = "Scripts" if os.name == "nt" else "bin"
    return str(VENV / sub / name)


def _run(*cmd: str) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, cwd=ROOT, check=True)


def _ensure_venv() -> None:
    if not Path(_bin("python")).exists():
        print(f"creating virtual environment {VENV}", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)


def _install(packages: list[str], extra: list[str]) -> None:
    editable: list[str] = []
    for pkg in packages:
        editable += ["-e", pkg]
    _run(_bin("python"), "-m", "pip", "install", "--disable-pip-version-check", "-q", TORCH, *editable, *extra)


def quickstart(args: list[str]) -> int:
    """Install what the calc example needs and run it; extra args go to the example."""
    _ensure_venv()
    _install(QUICKSTART_PACKAGES, QUICKSTART_AGENT)
    return subprocess.call([_bin("python"), "examples/calc/train.py", *args], cwd=ROOT)


def _install_system_packages() -> None:
    """Install `APT_PACKAGES` that are missing when apt can run (root on Debian, as in CI)."""
    missing = [pkg for cmd, pkg in APT_PACKAGES.items() if shutil.which(cmd) is None]
    if not missing:
        return
    if shutil.which("apt-get") is None or not hasattr(os, "geteuid") or os.geteuid() != 0:
        print(f"note: {', '.join(missing)} not installed and apt-get cannot run here (needs root on Debian); "
              "the tests that need them (browser, network namespaces) will be skipped", flush=True)  # fmt: skip
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    print("+ apt-get update && apt-get install -y " + " ".join(missing), flush=True)
    subprocess.run(["apt-get", "update", "-q"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-q", *missing], check=True, env=env)


def test(args: list[str]) -> int:
    """Install everything, then lint, type-check and run the whole test suite; extra args go to pytest."""
    _install_system_packages()
    _ensure_venv()
    _install(ALL_PACKAGES, DEV_TOOLS)
    _run(_bin("ruff"), "check", ".")
    _run(_bin("pyright"))
    return subprocess.call([_bin("python"), "-m", "pytest", *args], cwd=ROOT)


PUBLISHED = ["core", "adapter-langchain", "adapter-openai-agents", "adapter-autogen", "trainer-torch", "trainer-verl"]


def build(args: list[str]) -> int:
    """Build wheels: ``build [--out DIR] [PACKAGE ...]`` (default: every published package into dist/)."""
    out = ROOT / "dist"
    if args[:1] == ["--out"]:
        if len(args) < 2:
            print("error: --out needs a directory", file=sys.stderr)
            return 2
        out, args = Path(args[1]).resolve(), args[2:]
    unknown = [name for name in args if name not in PUBLISHED]
    if unknown:
        print(f"error: unknown package(s) {unknown}; choose from {PUBLISHED}", file=sys.stderr)
        return 2
    folders = [str(ROOT / "packages" / name) for name in (args or PUBLISHED)]
    # Any Python with pip builds them: the build backend (hatchling) is fetched into an isolated build env.
    _run(
        sys.executable, "-m", "pip", "wheel", "--disable-pip-version-check", "-q", "--no-deps", "-w", str(out), *folders
    )
    print(f"wheels in {out}: pip install {out}/agentlightning_core-*.whl {out}/agentlightning_langchain-*.whl")
    return 0


def main() -> int:
    jobs = {"quickstart": quickstart, "test": test, "build": build}
    if len(sys.argv) < 2 or sys.argv[1] not in jobs:
        print(__doc__)
        return 2
    try:
        return jobs[sys.argv[1]](sys.argv[2:])
    except subprocess.CalledProcessError as exc:
        print(f"error: command failed with exit code {exc.returncode}: {' '.join(map(str, exc.cmd))}", file=sys.stderr)
        return exc.returncode or 1


if __name__ == "__main__":
    sys.exit(main())
