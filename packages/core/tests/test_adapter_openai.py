"""The raw openai adapter passes the conformance kit, and the adapter contract itself behaves."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from agentlightning.adapters import (
    Adapter,
    OpenAIAdapter,
    UnsupportedVersionError,
    get_adapter,
    instrument_all,
    supported_range,
    uninstrument_all,
    version_in_range,
)
from agentlightning.testing import AdapterConformanceTests


class TestOpenAIConformance(AdapterConformanceTests):
    supports_tools = False
    supports_agent_spans = False
    supports_streaming = True

    @pytest.fixture
    def adapter(self) -> Adapter:
        return OpenAIAdapter.default()

    @pytest.fixture
    def agent(self) -> Any:
        async def run(base_url: str, task: str) -> str:
            client = openai.AsyncOpenAI(base_url=base_url, api_key="kit")
            messages: list[Any] = [{"role": "user", "content": task}]
            first = await client.chat.completions.create(model="toy", messages=messages)
            messages += [
                {"role": "assistant", "content": first.choices[0].message.content},
                {"role": "user", "content": task},
            ]
            second = await client.chat.completions.create(model="toy", messages=messages)
            return str(second.choices[0].message.content)

        return run

    @pytest.fixture
    def agent_streaming(self) -> Any:
        async def run(base_url: str, task: str) -> str:
            client = openai.AsyncOpenAI(base_url=base_url, api_key="kit")
            stream = await client.chat.completions.create(
                model="toy", messages=[{"role": "user", "content": task}], stream=True
            )
            return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

        return run


@pytest.mark.parametrize(
    ("version", "spec", "expected"),
    [
        ("1.2.3", ">=1.2,<2", True),
        ("2.0.0", ">=1.2,<2", False),
        ("2.0.0rc1", "<2", False),  # PEP 440: a pre-release of 2 is not below 2
        ("1.0rc1", ">=0.3,<2", True),  # an installed pre-release inside the range is accepted
        ("0.3.0.dev1", ">=0.3", False),
        ("0.7.5", ">=0.6,<0.8", True),
        ("0.8.0", ">=0.6,<0.8", False),
        ("1.4.2", "~=1.4", True),
        ("2.0", "~=1.4", False),
        ("1.2.9", "==1.2.*", True),
        ("1.3.0", "==1.2.*", False),
        ("1.0", "!=1.0.0", False),
    ],
)
def test_version_in_range(version: str, spec: str, expected: bool) -> None:
    assert version_in_range(version, spec) is expected


def test_bad_specifier_is_named() -> None:
    with pytest.raises(ValueError, match="bogus"):
        version_in_range("1.0", ">=1,bogus")
    with pytest.raises(ValueError, match="not-a-version"):
        version_in_range("not-a-version", ">=1")


def test_supported_range_is_read_from_the_package_metadata() -> None:
    """The range lives in pyproject.toml only; the adapter reads it back from the installed metadata."""
    assert supported_range("agentlightning-core", "openai") == OpenAIAdapter.SUPPORTED_RANGE
    assert version_in_range("1.50.0", OpenAIAdapter.SUPPORTED_RANGE)
    assert not version_in_range("4.0.0", OpenAIAdapter.SUPPORTED_RANGE)
    with pytest.raises(LookupError, match="declares no version range for torch"):
        supported_range("agentlightning-core", "torch")
    with pytest.raises(LookupError, match="agentlightning-no-such-dist is not installed"):
        supported_range("agentlightning-no-such-dist", "openai")


def test_missing_framework_message() -> None:
    class Missing(Adapter):
        NAME = "missing"
        FRAMEWORK = "agentlightning-no-such-framework"
        SUPPORTED_RANGE = ">=1,<2"

        def _instrument(self) -> None:
            raise AssertionError("must not hook")

        def _uninstrument(self) -> None:
            raise AssertionError("never hooked")

    adapter = Missing()
    with pytest.raises(
        UnsupportedVersionError, match=r"not installed.*pip install 'agentlightning-no-such-framework>=1,<2'"
    ):
        adapter.instrument()
    assert not adapter.instrumented
    adapter.uninstrument()  # harmless when never instrumented


def test_entry_points_find_installed_adapters() -> None:
    """instrument_all() finds adapters through the entry point group; low-level ones only on request."""
    try:
        done = instrument_all()
        assert "openai" not in done
        assert get_adapter("openai") is OpenAIAdapter.default()
        assert "openai" in instrument_all(include=["openai"])
        assert OpenAIAdapter.default().instrumented
    finally:
        uninstrument_all()
    assert not OpenAIAdapter.default().instrumented
    with pytest.raises(KeyError, match="no adapter named 'nope'"):
        get_adapter("nope")
