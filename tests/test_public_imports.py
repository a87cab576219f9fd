"""Packages use only each other's public API: no file imports a private (``_``-prefixed) module or name of a
package it does not belong to.

Scanned with the ``ast`` module (nothing is imported): every package's ``src`` and ``tests``, and ``examples/``,
``benchmarks/``, ``scripts/`` and ``tests/`` at the root, which belong to no package and so may use public API
only. A package's own files may use its private modules.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Files outside every package that deliberately reach into one, with the reason. Keep this short.
ALLOWED: dict[tuple[str, str], str] = {
    ("tests/calc_gpu_recipe_check.py", "agentlightning_verl._cpu_rehearsal"): (
        "rehearses the calc GPU recipe's verl setup on a CPU: the CPU rehearsal is deliberately not user API"
    ),
    ("benchmarks/conversion_bench.py", "agentlightning.credit._batch"): (
        "measures the cost of validated construction by swapping the fast constructor for a validating one"
    ),
    ("benchmarks/conversion_bench.py", "agentlightning.transitions._builder"): (
        "measures the cost of validated construction by swapping the fast constructor for a validating one"
    ),
    ("benchmarks/asgi_layers.py", "agentlightning.store._asgi"): (
        "reads a CPU clock around the served store's body validation to split a request's CPU by layer"
    ),
    ("benchmarks/asgi_layers.py", "agentlightning.store._server"): (
        "builds the served store's app in-process to wrap its layers with CPU clocks"
    ),
    ("benchmarks/span_batch_cpu.py", "agentlightning.store._server"): (
        "builds the served store's app in-process to time its spans route without HTTP"
    ),
    ("benchmarks/span_batch_cpu.py", "agentlightning.store._wire"): (
        "sends the spans route the body StoreClient's own code makes (spans_request_json)"
    ),
    ("benchmarks/bench_tracing_overhead.py", "agentlightning.tracing._provider"): (
        "compares the light recording path for our own spans against the SDK's span objects"
    ),
    ("benchmarks/span_path_bench.py", "agentlightning.tracing._light"): (
        "times the light span path against the OpenTelemetry SDK's spans with the same contents"
    ),
    ("tests/test_lora_policies.py", "agentlightning_torch.vllm._weight_sync"): (
        "checks vLLM's log-probs for each adapter against the trainer's own float32 reference computation"
    ),
    ("tests/test_quickstart.py", "agentlightning_torch.serving._backend"): (
        "spies on the backend's batched generation to count how many requests one forward pass served"
    ),
}


def _packages() -> dict[str, Path]:
    """Import name -> package folder, for every package with a ``src`` layout (the template included)."""
    found: dict[str, Path] = {}
    for src in sorted(ROOT.glob("packages/*/src")):
        for module in src.iterdir():
            if module.is_dir() and (module / "__init__.py").exists():
                found[module.name] = src.parent
    return found


def _private(parts: list[str]) -> bool:
    return any(p.startswith("_") and not (p.startswith("__") and p.endswith("__")) for p in parts)


def _imports(path: Path) -> list[tuple[int, str]]:
    """``(line, dotted name)`` of every absolute import, a ``from x import y`` counting as ``x.y``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module))
            out += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names if alias.name != "*"]
    return out


def _scanned_files(root: Path = ROOT) -> list[Path]:
    files = [*root.glob("packages/*/src/**/*.py"), *root.glob("packages/*/tests/**/*.py")]
    for top in ("examples", "benchmarks", "scripts", "tests"):
        files += (root / top).glob("**/*.py")
    return sorted(f for f in files if ".venv" not in f.parts and "__pycache__" not in f.parts)


def violations(root: Path = ROOT) -> list[str]:
    """Every import of another package's private module or name under ``root``, as ``file:line: name``."""
    packages = _packages()
    found: list[str] = []
    for path in _scanned_files(root):
        rel = path.relative_to(root)
        owner = ROOT / rel.parts[0] / rel.parts[1] if rel.parts[0] == "packages" else None
        for line, name in _imports(path):
            parts = name.split(".")
            home = packages.get(parts[0])
            if home is None or home == owner or not _private(parts[1:]):
                continue
            module = ".".join(parts[: next(i for i, p in enumerate(parts) if i and p.startswith("_")) + 1])
            if (rel.as_posix(), module) not in ALLOWED:
                found.append(f"{rel}:{line}: {name}")
    return found


def test_the_scan_sees_every_package() -> None:
    packages = _packages()
    assert {"agentlightning", "agentlightning_langchain", "agentlightning_torch"} <= set(packages)
    assert len(_scanned_files()) > 50


def test_no_package_imports_another_packages_private_module() -> None:
    found = violations()
    assert not found, "imports of another package's private module or name (make it public instead):\n" + "\n".join(
        found
    )


def test_the_scan_catches_a_private_import(tmp_path: Path) -> None:
    """The check is not vacuous: each kind of private import is reported, a public one and a package's own are not."""
    (tmp_path / "examples").mkdir()
    (tmp_path / "examples" / "probe.py").write_text(
        "import agentlightning.adapters._otel\n"
        "from agentlightning.adapters._otel import lightning_tracer\n"
        "from agentlightning.tracing import _CURRENT\n"
        "from agentlightning.adapters import lightning_tracer as ok\n"
    )
    own = tmp_path / "packages" / "core" / "src" / "agentlightning"
    own.mkdir(parents=True)
    (own / "probe.py").write_text("from agentlightning.adapters._otel import lightning_tracer\n")
    other = tmp_path / "packages" / "adapter-langchain" / "tests"
    other.mkdir(parents=True)
    (other / "probe.py").write_text("from agentlightning.testing._adapter_kit import KitHarness\n")
    found = violations(tmp_path)
    assert found == [
        "examples/probe.py:1: agentlightning.adapters._otel",
        "examples/probe.py:2: agentlightning.adapters._otel",
        "examples/probe.py:2: agentlightning.adapters._otel.lightning_tracer",
        "examples/probe.py:3: agentlightning.tracing._CURRENT",
        "packages/adapter-langchain/tests/probe.py:1: agentlightning.testing._adapter_kit",
        "packages/adapter-langchain/tests/probe.py:1: agentlightning.testing._adapter_kit.KitHarness",
    ]
