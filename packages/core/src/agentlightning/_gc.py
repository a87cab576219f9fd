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
"""

from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import Generator

__all__ = ["GC_FREEZE_ENV", "frozen_gc"]

GC_FREEZE_ENV = "AGL_GC_FREEZE"
"""Set to ``0`` to leave the garbage collector as it is (no `gc.freeze` around the training or runner loop)."""


@contextlib.contextmanager
def frozen_gc() -> Generator[bool]:
    """Collect the young generations, then freeze every object tracked now until the block ends; yields whether
    it froze.

    Does nothing with ``AGL_GC_FREEZE=0`` or when objects are frozen already (by the application, or by an outer
    block in another thread of this process: only the block that froze unfreezes).
    """
    if os.environ.get(GC_FREEZE_ENV, "1").strip() == "0" or gc.get_freeze_count() > 0:
        yield False
        return
    gc.collect(1)  # the young generations only: a full collection costs a walk of every object (module doc)
    gc.freeze()
    try:
        yield True
    finally:
        gc.unfreeze()
