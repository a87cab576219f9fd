"""Reproducible installs: `scripts/constraints.txt` is `uv.lock` exported, and the test venv holds those versions."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent


def _dev() -> object:
    spec = importlib.util.spec_from_file_location("agl_dev_script", ROOT / "scripts" / "dev.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _uv() -> str:
    found = Path(sys.executable).with_name("uv")
    return str(found) if found.exists() else shutil.which("uv") or "uv"


def test_uv_lock_matches_every_pyproject() -> None:
    """A pyproject changed without re-locking fails here (`python3 scripts/dev.py lock` fixes it)."""
    done = subprocess.run([_uv(), "lock", "--check", "--offline"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


def test_constraints_are_the_lock_exported() -> None:
    dev = _dev()
    exported = dev.export_constraints()  # type: ignore[attr-defined]
    committed = (ROOT / "scripts" / "constraints.txt").read_text()
    assert committed == exported, "scripts/constraints.txt is stale: run `python3 scripts/dev.py lock` and commit it"


def test_the_installed_versions_are_the_locked_ones() -> None:
    """Every locked package that applies to this machine and is installed has the locked version (a local build tag
    such as torch's ``+cpu`` aside)."""
    checked, wrong = 0, []
    for line in (ROOT / "scripts" / "constraints.txt").read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        req = Requirement(line)
        if req.marker is not None and not Marker(str(req.marker)).evaluate():
            continue
        try:
            installed = importlib.metadata.version(req.name)
        except importlib.metadata.PackageNotFoundError:
            continue  # locked for another extra or platform than this venv installs
        (spec,) = req.specifier
        if Version(installed).public != Version(spec.version).public:
            wrong.append(f"{canonicalize_name(req.name)} {installed} (locked {spec.version})")
        checked += 1
    assert checked > 100, f"only {checked} locked packages found installed: is this the project's venv?"
    assert not wrong, f"installed versions differ from uv.lock: {wrong}"
