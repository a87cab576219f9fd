"""`LocalBackend` against vLLM (the reference), serving the same model folder, greedy: the same answers.

Both serve the session's tool model (`tool_model_dir`, whose ``<tool_call>`` markers are *special* tokens) over
HTTP and get the same requests: chat with and without tools, a tool result, stops, ``max_tokens``, streaming,
``tool_choice: none``, ``skip_special_tokens: false``, completions from token ids and from text, and prompts the
model was not trained on. Each pair of answers must have the same token ids, text, tool calls and finish reason,
and log-probs within `TOLERANCE`. Two float32 engines may order two candidates differently when their log-probs
are closer than that; at such a step either is accepted and the comparison ends there (the rest is a different
continuation), so the test does not depend on rounding.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from transformers import AutoTokenizer

from agentlightning_torch import BackendServer, LocalBackend, serve_backend
from agentlightning_torch.testing import TOOL_MODEL_CALL, VLLMServer, add_tool_schema

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1200)]

TOLERANCE = 1e-4
QUESTION = [{"role": "user", "content": "What is 2 plus 3?"}]
TOOLS = [add_tool_schema(0)]
CALL = {
    "id": "c1",
    "type": "function",
    "function": {"name": "add", "arguments": json.dumps(TOOL_MODEL_CALL["arguments"])},
}
AFTER_TOOL = [
    *QUESTION,
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "c1", "content": "5"},
]

CHAT_CASES: dict[str, dict[str, Any]] = {
    "tool-call": {"messages": QUESTION, "tools": TOOLS},
    "tool-call-other-schema": {
        "messages": [{"role": "system", "content": "Be brief."}, *QUESTION],
        "tools": [add_tool_schema(1)],
    },
    "after-tool-result": {"messages": AFTER_TOOL, "tools": TOOLS},
    "plain": {"messages": QUESTION},
    "stop-string": {"messages": QUESTION, "stop": [" is"]},
    "max-tokens-mid-call": {"messages": QUESTION, "tools": TOOLS, "max_tokens": 6},
    "tool-choice-none": {"messages": QUESTION, "tools": TOOLS, "tool_choice": "none"},
    "keep-special-tokens": {"messages": QUESTION, "tools": TOOLS, "tool_choice": "none", "skip_special_tokens": False},
    "untrained-prompt": {"messages": [{"role": "user", "content": "zebra <tool_call> quantum ~~ 9"}], "max_tokens": 48},
    "untrained-system": {
        "messages": [{"role": "system", "content": "Réponds en français."}, {"role": "user", "content": "?"}],
        "tools": TOOLS,
        "max_tokens": 48,
    },
}


@pytest.fixture(scope="module")
def local(tool_model_dir: Path) -> Iterator[BackendServer]:
    running = serve_backend(LocalBackend(tool_model_dir, model_name="tiny", batch_wait_ms=1.0))
    yield running
    running.stop()


@pytest.fixture(scope="module")
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=300) as client:
        yield client


def post(http: httpx.Client, base_url: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    resp = http.post(f"{base_url}/{path}", json=body)
    assert resp.status_code == 200, f"{base_url}: {resp.text}"
    return resp.json()


def stream(http: httpx.Client, base_url: str, body: dict[str, Any]) -> dict[str, Any]:
    """A streamed chat answer assembled: ids, logprobs with their top two, content, tool calls, finish reason."""
    out: dict[str, Any] = {"ids": [], "entries": [], "content": "", "calls": {}, "finish": None}
    with http.stream("POST", f"{base_url}/chat/completions", json={**body, "stream": True}) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for choice in json.loads(line[6:]).get("choices") or []:
                out["ids"] += choice.get("token_ids") or []
                out["entries"] += (choice.get("logprobs") or {}).get("content") or []
                delta = choice.get("delta") or {}
                out["content"] += delta.get("content") or ""
                for call in delta.get("tool_calls") or []:
                    slot = out["calls"].setdefault(call.get("index", 0), {"name": "", "arguments": ""})
                    slot["name"] += (call.get("function") or {}).get("name") or ""
                    slot["arguments"] += (call.get("function") or {}).get("arguments") or ""
                out["finish"] = choice.get("finish_reason") or out["finish"]
    return out


def tool_calls(message: dict[str, Any]) -> list[tuple[str, Any]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message.get("tool_calls") or []]


def same_steps(reference: dict[str, Any], ours: dict[str, Any]) -> bool:
    """Ids and log-probs agree step by step; ``False`` when the two legitimately diverge at a near tie.

    ``reference``/``ours``: ``{"ids": [...], "entries": [{"logprob", "top_logprobs": [two best]}...]}``.
    """
    for step, (want, got) in enumerate(zip(reference["ids"], ours["ids"], strict=False)):
        mine, theirs = ours["entries"][step], reference["entries"][step]
        if want != got:
            best = [t["logprob"] for t in theirs["top_logprobs"][:2]]
            assert len(best) == 2 and best[0] - best[1] < TOLERANCE, (
                f"step {step}: vLLM chose {want}, LocalBackend {got}, and vLLM's two best differ by {best}"
            )
            assert mine["logprob"] == pytest.approx(best[1], abs=TOLERANCE)
            return False
        assert mine["logprob"] == pytest.approx(theirs["logprob"], abs=TOLERANCE), f"step {step}"
        assert [t["logprob"] for t in mine["top_logprobs"]] == pytest.approx(
            [t["logprob"] for t in theirs["top_logprobs"]], abs=TOLERANCE
        ), f"step {step}"
    assert len(reference["ids"]) == len(ours["ids"])
    return True


def chat_body(case: dict[str, Any]) -> dict[str, Any]:
    return {"model": "tiny", "temperature": 0, "max_tokens": 64, "logprobs": True, "top_logprobs": 2,
            "return_token_ids": True, **case}  # fmt: skip


@pytest.mark.parametrize("name", list(CHAT_CASES))
def test_chat_matches_vllm(
    name: str, vllm_server: VLLMServer, local: BackendServer, http: httpx.Client, tool_model_dir: Path
) -> None:
    body = chat_body(CHAT_CASES[name])
    answers = {}
    for who, url in (("vllm", vllm_server.base_url), ("local", local.base_url)):
        data = post(http, url, "chat/completions", body)
        choice = data["choices"][0]
        answers[who] = {
            "prompt": data["prompt_token_ids"], "ids": choice["token_ids"], "entries": choice["logprobs"]["content"],
            "content": choice["message"].get("content"), "calls": tool_calls(choice["message"]),
            "finish": choice["finish_reason"],
        }  # fmt: skip
    vllm, ours = answers["vllm"], answers["local"]
    assert ours["prompt"] == vllm["prompt"]
    if same_steps(vllm, ours):
        assert (ours["content"], ours["calls"], ours["finish"]) == (vllm["content"], vllm["calls"], vllm["finish"])
        assert [e["token"] for e in ours["entries"]] == [e["token"] for e in vllm["entries"]]
    if name.startswith("tool-call"):  # the model's call, its markers special tokens, parsed by both
        tokenizer = AutoTokenizer.from_pretrained(tool_model_dir)
        marker = tokenizer.convert_tokens_to_ids("<tool_call>")
        assert tokenizer.decode([marker], skip_special_tokens=True) == "" and marker in vllm["ids"]
        assert vllm["calls"] == [(TOOL_MODEL_CALL["name"], TOOL_MODEL_CALL["arguments"])]
        assert vllm["finish"] == "tool_calls" and vllm["content"] is None


@pytest.mark.parametrize("name", ["tool-call", "plain", "stop-string", "untrained-system"])
def test_streamed_chat_matches_vllm(
    name: str, vllm_server: VLLMServer, local: BackendServer, http: httpx.Client
) -> None:
    """Streamed, the assembled answers agree (vLLM streams a call's arguments in pieces, ours in one delta)."""
    body = chat_body(CHAT_CASES[name])
    vllm, ours = stream(http, vllm_server.base_url, body), stream(http, local.base_url, body)
    if same_steps(vllm, ours):
        assert (ours["content"], ours["finish"]) == (vllm["content"], vllm["finish"])
        assert [(c["name"], json.loads(c["arguments"])) for c in ours["calls"].values()] == [
            (c["name"], json.loads(c["arguments"])) for c in vllm["calls"].values()
        ]
    if name == "tool-call":
        assert vllm["finish"] == "tool_calls" and len(vllm["calls"]) == 1


@pytest.mark.parametrize(
    "prompt",
    [
        [1, 2, 3, 40, 50, 60],
        "What is 2 plus 3?",
        "<|im_start|>user\nWhat is 2 plus 3?<|im_end|>\n<|im_start|>assistant\n",
    ],
    ids=["token-ids", "text", "chat-text"],
)
@pytest.mark.parametrize("skip_special_tokens", [True, False], ids=["skip-special", "keep-special"])
def test_completion_matches_vllm(
    prompt: Any, skip_special_tokens: bool, vllm_server: VLLMServer, local: BackendServer, http: httpx.Client
) -> None:
    body = {"model": "tiny", "prompt": prompt, "temperature": 0, "max_tokens": 40, "logprobs": 2,
            "return_token_ids": True, "skip_special_tokens": skip_special_tokens}  # fmt: skip
    answers = {}
    for who, url in (("vllm", vllm_server.base_url), ("local", local.base_url)):
        choice = post(http, url, "completions", body)["choices"][0]
        block = choice["logprobs"]
        entries = [
            {"logprob": value, "top_logprobs": [{"logprob": v} for v in sorted(top.values(), reverse=True)]}
            for value, top in zip(block["token_logprobs"], block["top_logprobs"], strict=True)
        ]
        answers[who] = {
            "prompt": choice.get("prompt_token_ids"), "ids": choice["token_ids"], "entries": entries,
            "text": choice["text"], "finish": choice["finish_reason"],
        }  # fmt: skip
    vllm, ours = answers["vllm"], answers["local"]
    if same_steps(vllm, ours):
        assert (ours["text"], ours["finish"]) == (vllm["text"], vllm["finish"])
