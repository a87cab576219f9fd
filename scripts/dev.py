#!/usr/bin/env python3
"""Set up the project and run its two main jobs; needs only Python 3.11+ and pip.

    python3 scripts/dev.py quickstart   # make .venv, install core + LangChain adapter + trainer-torch, train
    python3 scripts/dev.py test         # make .venv, install every package + dev tools, run ruff, pyright and pytest
    python3 scripts/dev.py build        # build a wheel of every package into dist/ (pip install them anywhere)
    python3 scripts/dev.py lock         # after editing a pyproject: re-lock and rewrite scripts/constraints.txt
    python3 scripts/dev.py upgrade      # move uv.lock to the newest allowed versions, install them, run the tests

Installation goes through pip (not uv) on purpose: pip honours a machine's own configuration (a local
CPU wheel of torch, an internal index), while uv would fetch the CUDA build of torch from PyPI. The versions
still come from the committed ``uv.lock``: pip gets them as constraints (``scripts/constraints.txt``, the
lock exported by uv), so a fresh clone installs what was tested, and a newer release changes nothing until
``dev.py upgrade`` is run and its result committed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
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
    "packages/core[openai,litellm,otlp,postgres]",
    "packages/adapter-langchain",
    "packages/adapter-openai-agents",
    "packages/adapter-autogen",
    "packages/trainer-torch[plot,lora]",
    "packages/trainer-verl",
]
# pip installs exactly the versions in uv.lock: CONSTRAINTS is `uv export` of the lock (the dev group and every extra
# the tests use), committed beside this script and checked against the lock by tests/test_lock_constraints.py.
CONSTRAINTS = ROOT / "scripts" / "constraints.txt"
EXPORT_ARGS = [
    "export", "--frozen", "--all-packages", "--group", "dev", "--no-hashes", "--no-emit-workspace", "--no-header",
    "--no-annotate", "--extra", "openai", "--extra", "litellm", "--extra", "otlp", "--extra", "postgres",
    "--extra", "test", "--extra", "lora", "--extra", "plot",
]  # fmt: skip
CONSTRAINTS_HEADER = "# uv.lock as pip constraints; made by `python3 scripts/dev.py lock`, do not edit by hand\n"


def dev_tools() -> list[str]:
    """The root pyproject's `dev` dependency group (test runners, linters, the frameworks' test clients)."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        group: list[str] = tomllib.load(f)["dependency-groups"]["dev"]
    return [req for req in group if not req.replace(" ", "").startswith("torch==")]


# System packages the tests need; installed with apt when the job runs as root (CI does).
APT_PACKAGES = {"chromium": "chromium", "ip": "iproute2", "initdb": "postgresql"}
"""Command -> Debian package: the browser the dashboard tests drive, `ip` for the network-namespace tests,
PostgreSQL's server (`initdb`, `pg_ctl`) for the PostgreSQL store's tests, which start one of their own."""


def _has_command(cmd: str) -> bool:
    """Whether ``cmd`` is on PATH or, for PostgreSQL's programs, where Debian puts them (off PATH)."""
    if shutil.which(cmd) is not None:
        return True
    return cmd == "initdb" and any(Path("/usr/lib/postgresql").glob("*/bin/initdb"))


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
    _run(
        _bin("python"), "-m", "pip", "install", "--disable-pip-version-check", "-q", "-c", str(CONSTRAINTS), TORCH,
        *editable, *extra,
    )  # fmt: skip


def quickstart(args: list[str]) -> int:
    """Install what the calc example needs and run it; extra args go to the example."""
    _ensure_venv()
    _install(QUICKSTART_PACKAGES, QUICKSTART_AGENT)
    return subprocess.call([_bin("python"), "examples/calc/train.py", *args], cwd=ROOT)


def _install_system_packages() -> None:
    """Install `APT_PACKAGES` that are missing when apt can run (root on Debian, as in CI)."""
    missing = [pkg for cmd, pkg in APT_PACKAGES.items() if not _has_command(cmd)]
    if not missing:
        return
    if shutil.which("apt-get") is None or not hasattr(os, "geteuid") or os.geteuid() != 0:
        print(f"note: {', '.join(missing)} not installed and apt-get cannot run here (needs root on Debian); "
              "the tests that need them (browser, netns, PostgreSQL) will be skipped", flush=True)  # fmt: skip
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    print("+ apt-get update && apt-get install -y " + " ".join(missing), flush=True)
    subprocess.run(["apt-get", "update", "-q"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-q", *missing], check=True, env=env)


def test(args: list[str]) -> int:
    """Install everything, then lint, type-check and run the whole test suite; extra args go to pytest."""
    _install_system_packages()
    _ensure_venv()
    _install(ALL_PACKAGES, dev_tools())
    _run(_bin("ruff"), "check", ".")
    _run(_bin("pyright"))
    return subprocess.call([_bin("python"), "-m", "pytest", *args], cwd=ROOT)


def export_constraints() -> str:
    """`uv.lock` rendered as pip constraints (needs uv: `pip install uv`, or the dev venv's)."""
    uv = _bin("uv") if Path(_bin("uv")).exists() else (shutil.which("uv") or "uv")
    out = subprocess.run([uv, *EXPORT_ARGS], cwd=ROOT, check=True, capture_output=True, text=True).stdout
    return CONSTRAINTS_HEADER + out


def lock(args: list[str]) -> int:
    """Re-lock (``lock --upgrade`` moves every package to its newest allowed version) and rewrite the constraints."""
    _ensure_venv()
    if not Path(_bin("uv")).exists():
        _run(_bin("python"), "-m", "pip", "install", "--disable-pip-version-check", "-q", "-c", str(CONSTRAINTS), "uv")
    _run(_bin("uv"), "lock", *args)
    CONSTRAINTS.write_text(export_constraints())
    print(f"wrote {CONSTRAINTS.relative_to(ROOT)}", flush=True)
    return 0


def upgrade(args: list[str]) -> int:
    """Move uv.lock to the newest allowed versions, install them and run the tests: commit the result if green."""
    code = lock(["--upgrade"])
    return code or test(args)


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
    jobs = {"quickstart": quickstart, "test": test, "build": build, "lock": lock, "upgrade": upgrade}
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
