"""A kit test cannot be silently overridden: replacing one needs an ``xfail`` marker with a reason."""

from __future__ import annotations

from typing import Any

import pytest

from agentlightning.testing import AdapterConformanceTests, StoreConformanceTests, silent_overrides


class _Quiet(AdapterConformanceTests):
    async def test_trace_tree(self, harness: Any, agent: Any) -> None:  # replaced without a word
        pass


class _Declared(AdapterConformanceTests):
    @pytest.mark.xfail(reason="this framework has no tool spans")
    async def test_trace_tree(self, harness: Any, agent: Any) -> None:
        pass


class _NoReason(StoreConformanceTests):
    @pytest.mark.xfail
    async def test_cancel(self, store: Any) -> None:
        pass


class _Skipped(StoreConformanceTests):
    @pytest.mark.skip(reason="a skip is not an xfail")
    async def test_stats(self, store: Any) -> None:
        pass


def test_silent_override_is_reported() -> None:
    assert silent_overrides(_Quiet) == ["test_trace_tree"]
    with pytest.raises(AssertionError, match="test_trace_tree"):
        _Quiet().test_no_overrides_DO_NOT_OVERRIDE()


def test_xfail_with_reason_is_allowed() -> None:
    assert silent_overrides(_Declared) == []
    _Declared().test_no_overrides_DO_NOT_OVERRIDE()


def test_xfail_without_reason_or_a_skip_is_not_enough() -> None:
    assert silent_overrides(_NoReason) == ["test_cancel"]
    assert silent_overrides(_Skipped) == ["test_stats"]


def test_the_guard_itself_cannot_be_overridden() -> None:
    with pytest.raises(TypeError, match="test_no_overrides_DO_NOT_OVERRIDE"):

        class _Sneaky(AdapterConformanceTests):  # pyright: ignore[reportUnusedClass]
            def test_no_overrides_DO_NOT_OVERRIDE(self) -> None:
                pass
