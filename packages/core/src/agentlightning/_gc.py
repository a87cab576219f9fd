"""`frozen_gc`: what a long-running process built before its main loop is left out of full garbage collections.

A trainer or runner holds hundreds of thousands of long-lived objects (torch, transformers, the agent framework,
the openai client and their modules). CPython's full (generation-2) collection walks every one of them each time,
holding the GIL: measured in the CPU quickstart, a full collection took ~130 ms in the trainer (stalling its
decode thread and its proxy alike) and ~95 ms in a runner, about 4% of all CPU. `gc.freeze` moves the objects
alive at the start of the main loop into a permanent generation that collections skip; objects made later are
collected as usual, and reference counting still frees frozen objects that are no longer used (only reference
cycles among them wait until `gc.unfreeze`, at the end of the loop).

Before freezing, only the young generations are collected (the temporaries of the last moments: model loading,
client set-up). A full collection there walked every object once more for almost nothing: measured here, ~0.26 s
of CPU in a trainer (torch and transformers loaded, ~400k objects) and ~0.06 s in a runner of the calc example's
plain OpenAI agent (~100k objects), each to free under 120 objects. Cycles that were garbage already in the oldest
generation stay frozen with the rest until the block ends, as frozen cycles that become garbage later do.

A script can also run its whole ``main`` in `defer_full_gc`: no full collection while it imports and starts (they
walk the growing set of module objects again and again: measured ~0.8 s of CPU in the calc quickstart's trainer, 7
collections freeing ~330 objects between them), and what the loop's block froze stays frozen until the script's
block ends (giving it back right after the loop cost one more full walk of ~420k objects, ~0.24 s, during the plot).
"""

from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import Generator

__all__ = ["GC_FREEZE_ENV", "defer_full_gc", "frozen_gc"]

GC_FREEZE_ENV = "AGL_GC_FREEZE"
"""Set to ``0`` to leave the garbage collector as it is (no `gc.freeze` around the training or runner loop)."""


_NEVER = 1 << 30
"""A generation-2 threshold no process reaches: no full collection happens on its own."""


class _Script:
    """The state of the `defer_full_gc` block running now, if any (one per process)."""

    active = False
    deferred: tuple[int, int, int] | None = None  # the thresholds it replaced, until a loop's block puts them back
    froze = False  # a loop's `frozen_gc` froze inside it and left the objects frozen for the block to give back


def _off() -> bool:
    return os.environ.get(GC_FREEZE_ENV, "1").strip() == "0"


def _resume_full_gc() -> None:
    if _Script.deferred is not None:
        gc.set_threshold(*_Script.deferred)
        _Script.deferred = None


@contextlib.contextmanager
def defer_full_gc() -> Generator[bool]:
    """For a training or runner script's ``main``, around all of it (entered before its heavy imports): no full
    collection until its loop's `frozen_gc` block starts, and what that block froze stays frozen to the end of this
    one; yields whether it changed anything.

    Until the loop starts, only the young generations are collected (cyclic garbage of the moment is still freed;
    the full collections that would walk every module object again and again are skipped, see the module doc). The
    loop's block puts the thresholds back once it froze, and leaves its objects frozen after the loop (the plot and
    summary that follow would otherwise start with one more full walk of all of them); this block gives them back
    at its end. Does nothing with ``AGL_GC_FREEZE=0``, when nested, or when objects are frozen already.
    """
    if _off() or _Script.active or gc.get_freeze_count() > 0:
        yield False
        return
    thresholds = gc.get_threshold()
    gc.set_threshold(thresholds[0], thresholds[1], _NEVER)
    _Script.active, _Script.deferred, _Script.froze = True, thresholds, False
    try:
        yield True
    finally:
        _resume_full_gc()  # no loop ran
        if _Script.froze:
            gc.unfreeze()
        _Script.active, _Script.froze = False, False


@contextlib.contextmanager
def frozen_gc() -> Generator[bool]:
    """Collect the young generations, then freeze every object tracked now until the block ends; yields whether
    it froze.

    Does nothing with ``AGL_GC_FREEZE=0`` or when objects are frozen already (by the application, or by an outer
    block in another thread of this process: only the block that froze unfreezes). Inside `defer_full_gc`, it puts
    full collections back (once it froze) and leaves the unfreezing to that block.
    """
    if _off() or gc.get_freeze_count() > 0:
        _resume_full_gc()
        yield False
        return
    gc.collect(1)  # the young generations only: a full collection costs a walk of every object (module doc)
    gc.freeze()
    _resume_full_gc()
    kept = _Script.froze = _Script.active
    try:
        yield True
    finally:
        if not kept:
            gc.unfreeze()
