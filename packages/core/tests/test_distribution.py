"""`agl --version`, and a foreign ``agentlightning`` distribution found at import and when ``agl`` starts."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest

import agentlightning
from agentlightning.cli import main


def test_agl_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    installed = importlib.metadata.version("agentlightning-core")  # the distribution's, not a constant of ours
    assert out == f"agl (agentlightning-core) {installed}\n" and agentlightning.__version__ == installed


def _with_foreign_distribution(tmp_path: Path, code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` with a fake dist-info of the unrelated ``agentlightning`` distribution on the path."""
    info = tmp_path / "agentlightning-0.2.2.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: agentlightning\nVersion: 0.2.2\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def test_foreign_distribution_is_named_at_import_and_by_agl(tmp_path: Path) -> None:
    imported = _with_foreign_distribution(tmp_path, "import agentlightning")
    assert imported.returncode == 0
    assert "ForeignDistributionWarning" in imported.stderr
    assert "pip uninstall agentlightning" in imported.stderr and "'agentlightning' 0.2.2" in imported.stderr
    cli = _with_foreign_distribution(
        tmp_path, "import sys, warnings; warnings.simplefilter('ignore'); from agentlightning.cli import main; "
        "sys.exit(main(['--version']))"
    )  # fmt: skip
    assert cli.returncode == 2
    assert cli.stderr.startswith("agl: error: The unrelated distribution 'agentlightning' 0.2.2 is installed")
    assert "pip uninstall agentlightning" in cli.stderr


def test_no_warning_without_a_foreign_distribution() -> None:
    done = subprocess.run(
        [sys.executable, "-W", "error::RuntimeWarning", "-c", "import agentlightning"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
