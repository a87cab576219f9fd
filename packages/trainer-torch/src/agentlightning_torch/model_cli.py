"""``agl model``: turn a GGUF file into a checkpoint folder, or fetch a model the examples use.

    agl model import FILE.gguf --out DIR [--dtype float32|bfloat16|float16] [--force]
    agl model fetch smollm2 [--cache DIR] [--dtype ...]

``import`` reads any GGUF file of an architecture transformers reads (what Ollama and llama.cpp users have), dequantizes
it and writes a folder the trainers and vLLM load (`agentlightning_torch.models.import_gguf`); ``fetch`` downloads and
imports a pinned model once and prints its cached folder (`agentlightning_torch.models.smollm2`). The folder's path is
the one line on stdout; what was done goes to stderr; bad input is one line, exit code 2.

The core's ``agl`` finds this command through the ``agentlightning.commands`` entry point of agentlightning-torch
(`register`); ``python -m agentlightning_torch.model_cli ...`` runs it without that.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["FETCHABLE", "main", "register"]

FETCHABLE = ("smollm2",)
"""Models ``agl model fetch`` knows (`agentlightning_torch.models`)."""

_DTYPES = ("float32", "bfloat16", "float16")


def register(subparsers: Any) -> None:
    """Add ``model`` (with ``import`` and ``fetch``) to an ``agl`` sub-parser set."""
    model = subparsers.add_parser("model", help="import a GGUF model file; fetch the examples' models")
    commands = model.add_subparsers(dest="model_command", required=True)
    importing = commands.add_parser(
        "import",
        help="GGUF file -> checkpoint folder (config, safetensors, tokenizer, chat template)",
        description="Convert a GGUF file (Ollama, llama.cpp) of an architecture transformers reads into a "
        "Hugging Face folder that agl train, the trainers and vLLM load; quantized weights are dequantized.",
    )
    importing.add_argument("file", help="the .gguf file")
    importing.add_argument("--out", required=True, help="the folder to write (absent or empty, unless --force)")
    importing.add_argument("--dtype", choices=_DTYPES, default="float32", help="saved weights' dtype (float32)")
    importing.add_argument("--force", action="store_true", help="replace the contents of a non-empty --out")
    importing.set_defaults(func=import_command, owns_lifeline=lambda args: True)
    fetching = commands.add_parser(
        "fetch", help="download and import a model the examples use; prints its cached folder"
    )
    fetching.add_argument("name", choices=FETCHABLE, help="the model")
    fetching.add_argument("--cache", default=None, help="models folder (default $AGL_MODELS or ~/.cache/...)")
    fetching.add_argument("--dtype", choices=_DTYPES, default="float32", help="saved weights' dtype (float32)")
    fetching.set_defaults(func=fetch_command, owns_lifeline=lambda args: True)


def _console() -> Any:
    from rich.console import Console

    return Console(stderr=True, soft_wrap=True)


def _fail(console: Any, command: str, error: BaseException) -> int:
    from rich.markup import escape

    console.print(f"[red]error:[/red] agl model {command}: {escape(str(error))}")
    return 2


def import_command(args: argparse.Namespace) -> int:
    """``agl model import``: returns the exit code (2 with one line for bad input)."""
    console = _console()
    try:
        from agentlightning_torch.models._gguf_import import GGUFImportError, import_gguf
    except ImportError as error:  # torch/transformers missing: a broken install, still one line
        return _fail(console, "import", error)
    try:
        result = import_gguf(args.file, args.out, dtype=args.dtype, force=args.force)
    except GGUFImportError as error:
        return _fail(console, "import", error)
    meta = result.metadata
    quant = meta["quantization"]
    console.print(
        f"{meta['model_class']} ({meta['parameters']:,} parameters) from {meta['source']['file']}: "
        f"{quant['file_type']} -> {meta['dtype']} in {result.seconds:.1f} s"
    )
    sys.stdout.write(f"{result.out}\n")
    return 0


def fetch_command(args: argparse.Namespace) -> int:
    """``agl model fetch NAME``: prints the cached folder; returns the exit code."""
    console = _console()
    from agentlightning_torch.models import GGUFImportError, ModelFetchError, smollm2

    try:
        folder = smollm2(cache_dir=args.cache, dtype=args.dtype)
    except (GGUFImportError, ModelFetchError) as error:
        return _fail(console, "fetch", error)
    sys.stdout.write(f"{folder}\n")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m agentlightning_torch.model_cli import ...``: the same command without the core's ``agl``."""
    parser = argparse.ArgumentParser(prog="agl", description="Agent Lightning model files")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
