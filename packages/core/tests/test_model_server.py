"""The scripted OpenAI-compatible test server, driven by the real OpenAI client over loopback HTTP."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import openai
import pytest
from openai import OpenAI

from agentlightning.testing import ScriptedModelServer, ScriptedReply, ToyTokenizer
from agentlightning.testing._toy_tokenizer import pseudo_logprob

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "add two numbers",
            "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}},
        },
    }
]


def client(server: ScriptedModelServer) -> OpenAI:
    return OpenAI(base_url=server.base_url, api_key="test", max_retries=0)


def test_tokenizer_round_trips_unicode_and_renders_documented_template() -> None:
    tok = ToyTokenizer()
    text = "héllo → 世界"
    ids = tok.encode(text)
    assert len(ids) == len(text.encode("utf-8"))
    assert all(tok.offset <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == text
    rendered = tok.render_chat([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}])
    assert rendered == "<|system|>\nbe brief\n<|user|>\nhi\n<|assistant|>\n"


def test_chat_returns_real_token_ids_and_deterministic_logprobs() -> None:
    messages = [{"role": "user", "content": "what is 2+2?"}]
    with ScriptedModelServer(["four", "four"]) as server:
        first = client(server).chat.completions.create(
            model="toy", messages=messages, logprobs=True, extra_body={"return_token_ids": True}
        )
        second = client(server).chat.completions.create(
            model="toy", messages=messages, logprobs=True, extra_body={"return_token_ids": True}
        )
    tok = ToyTokenizer()
    assert first.choices[0].message.content == "four"
    assert first.model_extra is not None and first.choices[0].model_extra is not None
    assert first.model_extra["prompt_token_ids"] == tok.encode(tok.render_chat(messages))
    assert first.choices[0].model_extra["token_ids"] == tok.encode("four")
    assert first.choices[0].logprobs is not None and first.choices[0].logprobs.content is not None
    logprobs = [item.logprob for item in first.choices[0].logprobs.content]
    assert logprobs == [pseudo_logprob(t, j) for j, t in enumerate(tok.encode("four"))]
    assert second.choices[0].logprobs is not None and second.choices[0].logprobs.content is not None
    assert [item.logprob for item in second.choices[0].logprobs.content] == logprobs
    assert first.usage is not None and first.usage.completion_tokens == 4
    assert first.id != second.id


def test_no_token_ids_unless_asked_or_when_disabled() -> None:
    with ScriptedModelServer() as server:
        plain = client(server).chat.completions.create(model="toy", messages=[{"role": "user", "content": "x"}])
    assert plain.choices[0].message.content == "x"  # default script echoes the last user message
    assert "prompt_token_ids" not in (plain.model_extra or {})
    assert plain.choices[0].logprobs is None
    with ScriptedModelServer(emit_token_ids=False) as server:
        asked = client(server).chat.completions.create(
            model="toy", messages=[{"role": "user", "content": "x"}], extra_body={"return_token_ids": True}
        )
    assert "prompt_token_ids" not in (asked.model_extra or {})
    assert "token_ids" not in (asked.choices[0].model_extra or {})


def test_tool_calls_non_streamed_and_prompt_includes_tools() -> None:
    reply = ScriptedReply(tool_calls=[{"name": "add", "arguments": {"a": 1, "b": 2}, "id": "call_1"}])
    with ScriptedModelServer([reply]) as server:
        out = client(server).chat.completions.create(
            model="toy",
            messages=[{"role": "user", "content": "1+2"}],
            tools=TOOLS,
            extra_body={"return_token_ids": True},
        )
        served = server.served[0]
    call = out.choices[0].message.tool_calls[0]  # type: ignore[index]
    assert out.choices[0].finish_reason == "tool_calls"
    assert call.id == "call_1" and call.function.name == "add"  # type: ignore[union-attr]
    assert json.loads(call.function.arguments) == {"a": 1, "b": 2}  # type: ignore[union-attr]
    tok = ToyTokenizer()
    assert tok.decode(served.token_ids) == tok.render_tool_call("add", call.function.arguments)  # type: ignore[union-attr]
    assert tok.decode(served.prompt_token_ids).startswith("<|tools|>\n")


def test_streamed_content_and_tool_calls_assemble_in_the_openai_client() -> None:
    script = [
        ScriptedReply(content="a streamed answer"),
        ScriptedReply(content="let me add", tool_calls=[{"name": "add", "arguments": {"a": 10, "b": 32}}]),
    ]
    with ScriptedModelServer(script, stream_chunk_chars=3) as server:
        oc = client(server)
        chunks = list(
            oc.chat.completions.create(
                model="toy",
                messages=[{"role": "user", "content": "q"}],
                stream=True,
                stream_options={"include_usage": True},
                extra_body={"return_token_ids": True},
            )
        )
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == "a streamed answer"
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == len("a streamed answer")
        ids: list[int] = []
        for c in chunks:
            if c.choices:
                ids.extend((c.choices[0].model_extra or {}).get("token_ids", []))
        assert ids == server.served[0].token_ids
        args = ""
        name = None
        text = ""
        for c in oc.chat.completions.create(model="toy", messages=[{"role": "user", "content": "q"}], stream=True):
            text += c.choices[0].delta.content or ""
            for tc in c.choices[0].delta.tool_calls or []:
                name = tc.function.name or name  # type: ignore[union-attr]
                args += tc.function.arguments or ""  # type: ignore[union-attr]
    assert text == "let me add"
    assert name == "add" and json.loads(args) == {"a": 10, "b": 32}


def test_completions_endpoint_with_text_and_token_prompts() -> None:
    with ScriptedModelServer(["xyz", "abc"]) as server:
        oc = client(server)
        out = oc.completions.create(model="toy", prompt="Q:", logprobs=1, extra_body={"return_token_ids": True})
        assert out.choices[0].text == "xyz"
        assert out.choices[0].logprobs is not None and out.choices[0].logprobs.token_logprobs is not None
        assert len(out.choices[0].logprobs.token_logprobs) == 3
        assert (out.model_extra or {})["prompt_token_ids"] == ToyTokenizer().encode("Q:")
        oc.completions.create(model="toy", prompt=[5, 6, 7])
        assert server.served[1].prompt_token_ids == [5, 6, 7]
        assert [m.id for m in oc.models.list()] == ["toy-model"]


def test_callable_script_sees_the_request_and_requests_are_recorded() -> None:
    seen: list[dict[str, Any]] = []

    def script(body: dict[str, Any]) -> ScriptedReply:
        seen.append(body)
        return ScriptedReply(content=f"{len(body['messages'])} messages")

    with ScriptedModelServer(script) as server:
        out = client(server).chat.completions.create(
            model="toy", messages=[{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
        )
        assert out.choices[0].message.content == "2 messages"
        assert server.requests == seen
        assert server.requests[0]["model"] == "toy"


def test_injected_failures_then_recovery_and_exhausted_script() -> None:
    with ScriptedModelServer(["ok"]) as server:
        oc = client(server)
        server.fail_next(2, status=429)
        for _ in range(2):
            with pytest.raises(openai.RateLimitError):
                oc.chat.completions.create(model="toy", messages=[{"role": "user", "content": "u"}])
        assert (
            oc.chat.completions.create(model="toy", messages=[{"role": "user", "content": "u"}])
            .choices[0]
            .message.content
            == "ok"
        )
        with pytest.raises(openai.InternalServerError, match="script exhausted"):
            oc.chat.completions.create(model="toy", messages=[{"role": "user", "content": "u"}])
        assert [c.status for c in server.served] == [429, 429, 200]
        with pytest.raises(ValueError, match="4xx/5xx"):
            server.fail_next(1, status=200)


def test_rejects_n_greater_than_one() -> None:
    with ScriptedModelServer() as server, pytest.raises(openai.BadRequestError, match="n=1"):
        client(server).chat.completions.create(model="toy", messages=[{"role": "user", "content": "u"}], n=2)


async def test_bad_json_gets_400() -> None:
    with ScriptedModelServer() as server:
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"{server.base_url}/chat/completions", data=b"{nope") as resp,
        ):
            assert resp.status == 400
            assert "not valid JSON" in (await resp.json())["error"]["message"]
        assert server.requests == []


def test_url_before_start_is_a_clear_error() -> None:
    with pytest.raises(RuntimeError, match="not started"):
        _ = ScriptedModelServer().url
