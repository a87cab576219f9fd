"""Only tests marked ``gpu`` are skipped without CUDA: not every test under a folder or module named ``gpu``."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[1]


def test_a_folder_named_gpu_does_not_skip_its_tests(pytester: pytest.Pytester) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("with CUDA nothing is skipped: the check is for machines without it")
    pytester.makeconftest((ROOT / "conftest.py").read_text(encoding="utf-8"))
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\nmarkers =\n    gpu: needs a CUDA GPU\n")
    folder = pytester.mkdir("gpu")
    (folder / "test_gpu_things.py").write_text(
        "import pytest\n\n\ndef test_plain():\n    pass\n\n\n@pytest.mark.gpu\ndef test_marked():\n    pass\n",
        encoding="utf-8",
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, skipped=1)
