"""What installing Agent Lightning adds to an existing LangGraph app: packages and megabytes.

A fresh venv gets a LangGraph app's own packages (langgraph, langchain-openai) from the package index; then the
core and the LangChain adapter from wheels of this checkout (``scripts/dev.py build``), as an agent's process
installs them (``pip install agentlightning-core agentlightning-langchain``); then the core's ``serve`` extra on top.
Before the serving side became an extra, the core's own dependencies were exactly today's base plus ``serve``, so
"with serve" is the install an app got before; ``--before-ref REF`` builds the core from a git revision instead
and installs that in a second venv.

    python benchmarks/app_install_bench.py [--before-ref REF]

Prints a table and, last, one JSON line. Needs the package index (pip's cache makes a rerun quick).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
APP = ["langgraph>=1.0", "langchain-openai>=0.3"]


def _run(*cmd: str | Path, cwd: Path | None = None) -> str:
    done = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(map(str, cmd))} failed:\n{done.stdout}\n{done.stderr}")
    return done.stdout


def _snapshot(python: Path) -> tuple[set[str], int]:
    """(installed distributions, bytes under site-packages) of the venv of ``python``."""
    listed = json.loads(_run(python, "-m", "pip", "list", "--disable-pip-version-check", "--format=json"))
    names = {str(item["name"]).lower().replace("_", "-") for item in listed}
    site = Path(_run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").strip())
    size = sum(p.stat().st_size for p in site.rglob("*") if p.is_file() and not p.is_symlink())
    return names, size


def _pip(python: Path, *args: str | Path) -> None:
    _run(python, "-m", "pip", "install", "--disable-pip-version-check", "-q", *args)


def _app_venv(where: Path) -> Path:
    _run(sys.executable, "-m", "venv", where)
    python = where / "bin" / "python"
    _pip(python, *APP)
    return python


def _wheels(root: Path, out: Path) -> tuple[Path, Path]:
    _run(sys.executable, root / "scripts" / "dev.py", "build", "--out", out, "core", "adapter-langchain")
    (core,) = out.glob("agentlightning_core-*.whl")
    (langchain,) = out.glob("agentlightning_langchain-*.whl")
    return core, langchain


def _added(before: tuple[set[str], int], after: tuple[set[str], int]) -> dict[str, object]:
    new = sorted(after[0] - before[0])
    return {"packages": len(new), "mb": round((after[1] - before[1]) / 1e6, 1), "names": new}


def _before_ref(ref: str, work: Path, langchain: Path) -> dict[str, object]:
    """Core built from ``ref`` (a git worktree) + this checkout's adapter, in a second venv over the same app."""
    tree = work / "before-tree"
    _run("git", "worktree", "add", "--detach", tree, ref, cwd=ROOT)
    try:
        core, _ = _wheels(tree, work / "before-wheels")
    finally:
        _run("git", "worktree", "remove", "--force", tree, cwd=ROOT)
    python = _app_venv(work / "before-venv")
    app = _snapshot(python)
    _pip(python, core, langchain)
    return _added(app, _snapshot(python))


def main() -> int:
    """Measure and print; returns 0."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before-ref", help="also build the core from this git revision (e.g. one before the extra)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="agl-install-") as tmp:
        work = Path(tmp)
        core, langchain = _wheels(ROOT, work / "wheels")
        python = _app_venv(work / "venv")
        app = _snapshot(python)
        _pip(python, core, langchain)
        lean_state = _snapshot(python)
        _pip(python, f"{core}[serve]")
        rows = {"lean": _added(app, lean_state), "with_serve": _added(app, _snapshot(python))}
        if args.before_ref:
            rows[f"ref:{args.before_ref}"] = _before_ref(args.before_ref, work, langchain)
    print(f"LangGraph app ({', '.join(APP)}): {len(app[0])} packages, {app[1] / 1e6:.1f} MB")
    print(f"{'core + LangChain adapter':<36} {'packages added':>15} {'MB added':>9}")
    for name, row in rows.items():
        print(f"{name:<36} {row['packages']:>15} {row['mb']:>9}")
    serve_only = sorted(set(rows["with_serve"]["names"]) - set(rows["lean"]["names"]))  # type: ignore[arg-type]
    print(f"the serve extra adds: {', '.join(serve_only)}")
    print(f"the lean install adds: {', '.join(rows['lean']['names'])}")  # type: ignore[arg-type]
    print(
        json.dumps(
            {"app_packages": len(app[0]), **{k: {"packages": v["packages"], "mb": v["mb"]} for k, v in rows.items()}}
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
