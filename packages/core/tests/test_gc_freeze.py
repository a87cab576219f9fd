"""`frozen_gc`: objects alive when the training or runner loop starts are left out of full collections."""

from __future__ import annotations

import gc
import sys
import threading

import pytest

from agentlightning._gc import GC_FREEZE_ENV, defer_full_gc, frozen_gc


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def _tracked(generation: int | None = None) -> set[int]:
    return {id(o) for o in gc.get_objects(generation)}


def test_objects_alive_at_the_start_are_frozen_and_given_back_at_the_end() -> None:
    assert gc.get_freeze_count() == 0
    before = _Cycle()
    with frozen_gc() as froze:
        assert froze and gc.get_freeze_count() > 0
        assert gc.is_tracked(before) and id(before) not in _tracked()  # in no generation a collection walks
        after = _Cycle()
        assert id(after) in _tracked(generation=0)  # new objects are collected as usual
    assert gc.get_freeze_count() == 0
    assert id(before) in _tracked()


def test_a_frozen_cycle_that_became_garbage_is_collected_after_the_block() -> None:
    freed = threading.Event()

    class Tracked(_Cycle):
        def __del__(self) -> None:
            freed.set()

    cycle: Tracked | None = Tracked()
    with frozen_gc():
        cycle = None
        gc.collect()
        assert not freed.is_set()  # frozen: not even a full collection looks at it
    del cycle
    gc.collect()
    assert freed.is_set()


def test_nested_or_switched_off_it_leaves_the_collector_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    with frozen_gc() as outer:
        count = gc.get_freeze_count()
        with frozen_gc() as inner:  # another loop of the same process: the outer block keeps its freeze
            assert outer and not inner
        assert gc.get_freeze_count() == count
    assert gc.get_freeze_count() == 0
    monkeypatch.setenv(GC_FREEZE_ENV, "0")
    with frozen_gc() as froze:
        assert not froze and gc.get_freeze_count() == 0


@pytest.mark.skipif(sys.version_info >= (3, 14), reason="3.14's incremental collector may take old garbage along")
def test_only_the_young_generations_are_collected_before_freezing() -> None:
    # A full collection before the freeze walked every object of a big process to free next to nothing: garbage
    # that already sits in the oldest generation is frozen with the rest, young garbage is still collected.
    freed_old, freed_young = threading.Event(), threading.Event()

    class Old(_Cycle):
        def __del__(self) -> None:
            freed_old.set()

    class Young(_Cycle):
        def __del__(self) -> None:
            freed_young.set()

    old: Old | None = Old()
    gc.collect()  # alive: moved to the oldest generation
    assert id(old) in _tracked(generation=2)
    old = None  # garbage now, in the oldest generation
    young: Young | None = Young()
    young = None  # garbage in the youngest generation
    with frozen_gc() as froze:
        assert froze
        assert freed_young.is_set()  # collected before the freeze
        assert not freed_old.is_set()  # frozen, not collected
    gc.collect()
    assert freed_old.is_set()  # given back to the collector at the end of the block
    del old, young


@pytest.mark.skipif(sys.version_info >= (3, 14), reason="3.14's incremental collector has no full collections to defer")
def test_a_script_makes_no_full_collection_until_its_loop_and_keeps_the_freeze_to_its_end() -> None:
    full: list[int] = []

    def on_collect(phase: str, info: dict[str, int]) -> None:
        if phase == "start" and info["generation"] == 2:
            full.append(1)

    thresholds = gc.get_threshold()
    young, middle, _ = thresholds
    gc.callbacks.append(on_collect)
    try:
        with defer_full_gc() as deferred:
            assert deferred
            with defer_full_gc() as nested:
                assert not nested
            # survivors, as imports leave: more than a quarter of the old generation (what starts a full collection)
            kept = [_Cycle() for _ in range(len(gc.get_objects()) + young * middle)]
            assert not full  # startup: only the young generations were collected
            assert gc.get_threshold()[:2] == (young, middle)
            del kept
            before = _Cycle()
            with frozen_gc() as froze:
                assert froze and gc.get_threshold() == thresholds  # the loop collects as usual
                assert id(before) not in _tracked()
            assert gc.get_freeze_count() > 0 and id(before) not in _tracked()  # still frozen after the loop
            with frozen_gc() as again:  # a later loop of the same script: nothing more to freeze or give back
                assert not again
        assert gc.get_freeze_count() == 0 and id(before) in _tracked()  # given back at the script's end
    finally:
        gc.callbacks.remove(on_collect)
        gc.set_threshold(*thresholds)
        gc.unfreeze()


def test_a_script_that_never_reaches_its_loop_gets_the_collector_back() -> None:
    thresholds = gc.get_threshold()
    with pytest.raises(RuntimeError), defer_full_gc():
        assert gc.get_threshold() != thresholds
        raise RuntimeError("a usage error before the loop")
    assert gc.get_threshold() == thresholds
    with frozen_gc() as froze:  # and later loops freeze and unfreeze as before
        assert froze
    assert gc.get_freeze_count() == 0


def test_switched_off_a_script_leaves_the_collector_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(GC_FREEZE_ENV, "0")
    thresholds = gc.get_threshold()
    with defer_full_gc() as deferred:
        assert not deferred and gc.get_threshold() == thresholds
        with frozen_gc() as froze:
            assert not froze
    assert gc.get_freeze_count() == 0
