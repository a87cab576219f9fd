"""GGUF file -> Hugging Face checkpoint folder (`import_gguf`, ``agl model import``).

A GGUF file (what Ollama and llama.cpp users have) holds the weights, usually quantized, the tokenizer and the chat
template. transformers reads the architectures it knows (``from_pretrained(..., gguf_file=...)``, dequantizing every
tensor); `import_gguf` does that and writes an ordinary folder that `load_model`, the trainers and vLLM load: config,
``model.safetensors`` (float32 unless asked otherwise), tokenizer files, ``chat_template.jinja``, plus
``agentlightning.json`` and ``README.md`` saying what was done (source file and sha256, the quantization that was
dequantized, architecture, parameters, versions, date).

Two things transformers' GGUF tokenizer loading gets wrong are repaired from the file's own metadata: the eos token
(transformers' Llama converter takes it from the *bos* id, so SmolLM2 would never stop at ``<|im_end|>``) and the
added tokens llama.cpp matches whole (token types CONTROL and USER_DEFINED, e.g. ``<tool_call>``), which the Qwen2
converter otherwise splits into pieces.
"""

from __future__ import annotations

import datetime
import hashlib
import importlib.util
import json
import shutil
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

__all__ = [
    "GGUF_INSTALL_HINT",
    "GGUFImportError",
    "GGUFImportResult",
    "GGUFInfo",
    "import_gguf",
    "read_gguf_info",
    "sha256_file",
]

GGUF_INSTALL_HINT = "pip install 'agentlightning-torch[gguf]'"
"""What to run when the ``gguf`` or ``accelerate`` package is missing."""

METADATA_FILE = "agentlightning.json"
"""The imported folder's record of what was done (also the cache stamp of `agentlightning_torch.models`)."""

Dtype = Literal["float32", "bfloat16", "float16"]

_TOKEN_CONTROL = 3  # gguf.TokenType.CONTROL: a special token (not shown when decoding)
_TOKEN_USER_DEFINED = 4  # gguf.TokenType.USER_DEFINED: an added token llama.cpp matches whole


class GGUFImportError(ValueError):
    """Bad input to `import_gguf` (a missing file, not a GGUF, an unknown architecture, a non-empty folder...).

    The message is one line, printed as it is by ``agl model import`` (exit code 2).
    """


@dataclass(frozen=True)
class GGUFInfo:
    """What a GGUF file's header says (`read_gguf_info`); no tensor data is read.

    Attributes:
        architecture: ``general.architecture`` (``llama``, ``qwen2``...).
        name: ``general.name`` (or the file name).
        file_type: The file's quantization (``Q4_1``, ``F32``...) from ``general.file_type``, or the commonest
            tensor type when the field is absent.
        tensor_types: How many tensors of each type (``{"Q4_1": 210, "F32": 61, "Q8_0": 1}``).
        tokens: The vocabulary, by id.
        token_types: ``tokenizer.ggml.token_type`` by id (empty if absent).
        special_ids: ``bos``/``eos``/``unk``/``pad`` -> id, for those the file names.
        context_length: ``<arch>.context_length`` (``None`` if absent).
        chat_template: ``tokenizer.chat_template`` (``None`` if absent).
        license: ``general.license`` (``None`` if absent).
    """

    architecture: str
    name: str
    file_type: str
    tensor_types: dict[str, int]
    tokens: list[str] = field(repr=False)
    token_types: list[int] = field(repr=False)
    special_ids: dict[str, int]
    context_length: int | None
    chat_template: str | None = field(repr=False)
    license: str | None


@dataclass(frozen=True)
class GGUFImportResult:
    """What `import_gguf` wrote.

    Attributes:
        out: The checkpoint folder.
        metadata: The contents of its ``agentlightning.json`` (source, quantization, architecture, parameters...).
        seconds: Wall time of the import.
    """

    out: Path
    metadata: dict[str, Any]
    seconds: float


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while chunk := stream.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _require_packages() -> None:
    missing = [name for name in ("gguf", "accelerate") if importlib.util.find_spec(name) is None]
    if missing:
        raise GGUFImportError(
            f"reading GGUF files needs the {' and '.join(missing)} package{'s' if len(missing) > 1 else ''}: "
            f"{GGUF_INSTALL_HINT}"
        )


def _check_source(source: Path) -> None:
    if not source.exists():
        raise GGUFImportError(f"no such file: {source}")
    if not source.is_file():
        raise GGUFImportError(f"{source} is not a file")
    with source.open("rb") as stream:
        magic = stream.read(4)
    if magic != b"GGUF":
        raise GGUFImportError(
            f"{source} is not a GGUF file (it starts with {magic!r}; a GGUF file starts with b'GGUF')"
        )


def _field(reader: Any, key: str) -> Any:
    """One metadata value (``None`` if absent): strings decoded, arrays as lists."""
    found: Any = reader.fields.get(key)
    return None if found is None else found.contents()


def read_gguf_info(source: str | Path) -> GGUFInfo:
    """The header of a GGUF file: architecture, quantization, tokenizer ids, chat template.

    Raises:
        GGUFImportError: The file is missing, not a GGUF file, unreadable, or ``gguf`` is not installed.
    """
    path = Path(source).expanduser()
    _check_source(path)
    _require_packages()
    import gguf

    try:
        reader: Any = gguf.GGUFReader(path)
    except Exception as error:  # a truncated or corrupt file fails in many ways (ValueError, struct.error...)
        raise GGUFImportError(f"{path} is not a readable GGUF file: {_first_line(error)}") from None
    architecture = str(_field(reader, "general.architecture") or "")
    if not architecture:
        raise GGUFImportError(f"{path} names no architecture (general.architecture is missing)")
    types = Counter(tensor.tensor_type.name for tensor in reader.tensors)
    file_type_id = _field(reader, "general.file_type")
    try:
        file_type = gguf.LlamaFileType(file_type_id).name.removeprefix("MOSTLY_").removeprefix("ALL_")
    except ValueError:
        file_type = types.most_common(1)[0][0] if types else "unknown"
    roles = (("bos", "bos_token_id"), ("eos", "eos_token_id"), ("unk", "unknown_token_id"), ("pad", "padding_token_id"))
    special = {
        name: int(value) for name, key in roles if (value := _field(reader, f"tokenizer.ggml.{key}")) is not None
    }
    context = _field(reader, f"{architecture}.context_length")
    return GGUFInfo(
        architecture=architecture,
        name=str(_field(reader, "general.name") or path.stem),
        file_type=file_type,
        tensor_types=dict(types.most_common()),
        tokens=[str(token) for token in _field(reader, "tokenizer.ggml.tokens") or []],
        token_types=[int(kind) for kind in _field(reader, "tokenizer.ggml.token_type") or []],
        special_ids=special,
        context_length=None if context is None else int(context),
        chat_template=_field(reader, "tokenizer.chat_template"),
        license=_field(reader, "general.license"),
    )


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


# llama.cpp's names of architectures transformers spells differently (as transformers' own GGUF loader maps them)
_ARCHITECTURE_NAMES = {
    "qwen2moe": "qwen2_moe",
    "qwen3moe": "qwen3_moe",
    "gpt-oss": "gpt_oss",
    "minimax-m2": "minimax_m2",
    "t5encoder": "t5",
}


def _check_architecture(info: GGUFInfo, source: Path) -> None:
    """Refuse, in one line, an architecture transformers' GGUF loader does not read."""
    import transformers
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    readable = [str(name) for name in GGUF_SUPPORTED_ARCHITECTURES]
    if _ARCHITECTURE_NAMES.get(info.architecture, info.architecture) not in readable:
        raise GGUFImportError(
            f"{source.name}: architecture {info.architecture!r} is not one transformers {transformers.__version__} "
            f"reads from GGUF (it reads: {', '.join(sorted(readable))})"
        )


def _prepare_out(out: Path, force: bool) -> None:
    if out.exists() and not out.is_dir():
        raise GGUFImportError(f"--out {out} is a file, not a folder")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise GGUFImportError(f"--out {out} is not empty (pass --force to replace its contents)")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise GGUFImportError(f"cannot create --out {out}: {_first_line(error)}") from None


def _repair_tokenizer(tokenizer: Any, info: GGUFInfo) -> None:
    """Give the tokenizer the file's special tokens and whole-matched added tokens (see the module docstring)."""
    from tokenizers import AddedToken

    present = set(tokenizer.get_vocab())
    added = [
        AddedToken(token, special=kind == _TOKEN_CONTROL, normalized=False)
        for token, kind in zip(info.tokens, info.token_types, strict=False)
        if kind in (_TOKEN_CONTROL, _TOKEN_USER_DEFINED) and token in present
    ]
    known = {str(token) for token in tokenizer.added_tokens_decoder.values()}
    special = [token for token in added if token.special and token.content not in known]
    ordinary = [token for token in added if not token.special and token.content not in known]
    if special:
        tokenizer.add_tokens(special, special_tokens=True)
    if ordinary:
        tokenizer.add_tokens(ordinary)
    for role in ("bos", "eos", "unk", "pad"):
        token_id = info.special_ids.get(role)
        if token_id is not None and 0 <= token_id < len(info.tokens):
            setattr(tokenizer, f"{role}_token", info.tokens[token_id])
        elif role != "eos":  # transformers' guesses ("<s>", Qwen2's unk "<|endoftext|>"): the file names none
            setattr(tokenizer, f"{role}_token", None)
    if info.context_length:
        tokenizer.model_max_length = info.context_length


# Keys transformers' GGUF loading leaves in tokenizer_config.json that describe the GGUF, not the tokenizer
# (``model_type: gpt2`` on a Llama, stale ``eos_token_id``): dropped so the saved folder says one thing.
_STALE_TOKENIZER_KEYS = (
    "model_type",
    "bos_token_id",
    "eos_token_id",
    "unk_token_id",
    "pad_token_id",
    "is_local",
    "local_files_only",
)


def _clean_tokenizer_config(folder: Path) -> None:
    path = folder / "tokenizer_config.json"
    config = json.loads(path.read_text())
    for key in _STALE_TOKENIZER_KEYS:
        config.pop(key, None)
    if config.get("tokenizer_class") == "TokenizersBackend":
        # transformers 5's name for a tokenizer.json tokenizer; 4.x reads the folder only under the older name,
        # which 5.x still maps to the same class
        config["tokenizer_class"] = "PreTrainedTokenizerFast"
    # transformers' GGUF Llama converter asks for the space clean-up that corrupts BPE text ("a ." -> "a."); 5.x
    # ignores it with a warning, 4.x would apply it
    config["clean_up_tokenization_spaces"] = False
    path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


def _load(source: Path, dtype: Dtype, info: GGUFInfo) -> tuple[Any, Any]:
    """The model and tokenizer transformers makes of the file (dequantized to ``dtype``)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    folder, name = str(source.parent), source.name
    try:
        tokenizer: Any = AutoTokenizer.from_pretrained(folder, gguf_file=name)  # pyright: ignore[reportUnknownMemberType]
        model: Any = AutoModelForCausalLM.from_pretrained(  # pyright: ignore[reportUnknownMemberType]
            folder, gguf_file=name, dtype=torch_dtype
        )
    except (ValueError, KeyError, NotImplementedError) as error:
        raise GGUFImportError(
            f"{source.name}: transformers cannot make a causal LM of this {info.architecture} file: "
            f"{_first_line(error)}"
        ) from None
    _repair_tokenizer(tokenizer, info)
    return model, tokenizer


def _metadata(source: Path, digest: str, info: GGUFInfo, model: Any, dtype: Dtype) -> dict[str, Any]:
    import torch
    import transformers

    from agentlightning_torch.models._loading import count_parameters

    def version(distribution: str) -> str | None:
        from importlib.metadata import PackageNotFoundError
        from importlib.metadata import version as installed

        try:
            return installed(distribution)
        except PackageNotFoundError:
            return None

    quantized = sorted(kind for kind in info.tensor_types if kind not in ("F32", "F16", "BF16"))
    return {
        "built_by": "agl model import",
        "source": {"file": source.name, "sha256": digest, "bytes": source.stat().st_size},
        "name": info.name,
        "license": info.license,
        "gguf_architecture": info.architecture,
        "model_type": model.config.model_type,
        "model_class": type(model).__name__,
        "parameters": count_parameters(model),
        "quantization": {"file_type": info.file_type, "tensor_types": info.tensor_types, "quantized": quantized},
        "dtype": dtype,
        "chat_template": info.chat_template is not None,
        "special_tokens": {role: info.tokens[i] for role, i in info.special_ids.items() if 0 <= i < len(info.tokens)},
        "versions": {
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "gguf": version("gguf"),
            "agentlightning-torch": version("agentlightning-torch"),
        },
        "imported_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }


def _readme(meta: dict[str, Any]) -> str:
    source, quant = meta["source"], meta["quantization"]
    dequantized = (
        f"dequantized from {quant['file_type']} ({', '.join(f'{n} {k}' for k, n in quant['tensor_types'].items())} "
        f"tensors) to {meta['dtype']}: the weights are the quantized values, not the original model's"
        if quant["quantized"]
        else f"stored unquantized ({', '.join(quant['tensor_types'])}), written as {meta['dtype']}"
    )
    template = "its chat template" if meta["chat_template"] else "no chat template (the file has none: add one)"
    return (
        f"# {meta['name']}\n\n"
        f"Imported from the GGUF file `{source['file']}` (sha256 `{source['sha256']}`, {source['bytes']:,} bytes) by "
        f"`agl model import` on {meta['imported_at']}.\n\n"
        f"- Weights: {dequantized}.\n"
        f"- Architecture: {meta['gguf_architecture']} in the file, `{meta['model_class']}` "
        f"(model_type `{meta['model_type']}`) here; {meta['parameters']:,} parameters.\n"
        f"- Tokenizer: the file's vocabulary, with {template}; special tokens "
        f"{', '.join(f'{role} `{token}`' for role, token in meta['special_tokens'].items())}.\n"
        f"- License (from the file): {meta['license'] or 'not stated'}.\n"
        f"- Versions: transformers {meta['versions']['transformers']}, torch {meta['versions']['torch']}, "
        f"gguf {meta['versions']['gguf']}.\n\n"
        f"`{METADATA_FILE}` holds the same facts for programs.\n"
    )


def _move_into_place(staging: Path, out: Path) -> None:
    """Put the finished folder at ``out`` (replacing what was there) so a reader never sees half a folder."""
    if out.is_dir():
        trash = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
        out.rename(trash / out.name)
        staging.rename(out)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        staging.rename(out)


def import_gguf(
    source: str | Path, out: str | Path, *, dtype: Dtype = "float32", force: bool = False
) -> GGUFImportResult:
    """Convert a GGUF file into a Hugging Face checkpoint folder that `load_model`, the trainers and vLLM load.

    Args:
        source: The ``.gguf`` file.
        out: The folder to write (created; it must be absent or empty unless ``force``).
        dtype: The saved weights' dtype (quantized tensors are dequantized to it).
        force: Replace a non-empty ``out``.

    Returns:
        The folder, its metadata and the time taken.

    Raises:
        GGUFImportError: With a one-line reason: the file is missing or not a GGUF file, ``gguf``/``accelerate``
            are not installed, transformers does not read its architecture, ``out`` is not empty...
    """
    started = time.perf_counter()
    path, target = Path(source).expanduser().resolve(), Path(out).expanduser().absolute()
    if dtype not in ("float32", "bfloat16", "float16"):
        raise GGUFImportError(f"--dtype must be float32, bfloat16 or float16, not {dtype!r}")
    info = read_gguf_info(path)
    _check_architecture(info, path)
    _prepare_out(target, force)
    digest = sha256_file(path)
    model, tokenizer = _load(path, dtype, info)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.importing-", dir=target.parent))
    try:
        staging.chmod(0o755)  # mkdtemp's 0700 would make the finished folder private
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        _clean_tokenizer_config(staging)
        meta = _metadata(path, digest, info, model, dtype)
        (staging / "README.md").write_text(_readme(meta))
        (staging / METADATA_FILE).write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n")
        for written in staging.iterdir():
            written.chmod(0o644)  # safetensors writes 0600: vLLM or a trainer run as another user must read it
        _move_into_place(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return GGUFImportResult(out=target, metadata=meta, seconds=time.perf_counter() - started)
