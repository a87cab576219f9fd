"""Heartbeats of one runner's attempts sent together: one ``heartbeat_many`` request per beat instead of one each.

Every attempt of a process beats on the same ticks of the event loop's clock (multiples of the heartbeat interval),
so the beats due at one tick arrive together; `HeartbeatBatcher` gathers those that arrive within a short window
and sends them in one request. An attempt the store no longer runs gets `ConflictError`, as with ``heartbeat``.
"""

from __future__ import annotations

import asyncio
import weakref

from agentlightning.store import ConflictError, LightningStore, StoreError

__all__ = ["HeartbeatBatcher", "batcher_for", "next_tick"]

_WINDOW = 0.05
"""Seconds a first beat waits for the others of its tick (heartbeat timeouts are tens of seconds)."""

_batchers: weakref.WeakKeyDictionary[LightningStore, HeartbeatBatcher] = weakref.WeakKeyDictionary()


def next_tick(loop: asyncio.AbstractEventLoop, interval: float) -> float:
    """Seconds until the next multiple of ``interval`` on ``loop``'s clock (in (0, interval])."""
    return interval - loop.time() % interval


def batcher_for(store: LightningStore) -> HeartbeatBatcher:
    """The batcher of ``store`` on the running event loop (one per store and loop)."""
    loop = asyncio.get_running_loop()
    batcher = _batchers.get(store)
    if batcher is None or batcher.loop is not loop:
        batcher = _batchers[store] = HeartbeatBatcher(store, loop)
    return batcher


class HeartbeatBatcher:
    """Gathers the heartbeats of one store's attempts on one event loop and sends them in one request.

    Args:
        store: Where the beats go.
        loop: The event loop every `beat` runs on.
    """

    def __init__(self, store: LightningStore, loop: asyncio.AbstractEventLoop) -> None:
        self.store = store
        self.loop = loop
        self._pending: list[tuple[str, str, asyncio.Future[None]]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._sending: set[asyncio.Task[None]] = set()

    async def beat(self, rollout_id: str, attempt_id: str) -> None:
        """Record a sign of life of one attempt (with the others of its tick); `ConflictError` if it no longer runs."""
        fut: asyncio.Future[None] = self.loop.create_future()
        self._pending.append((rollout_id, attempt_id, fut))
        if self._timer is None:
            self._timer = self.loop.call_later(_WINDOW, self._flush)
        await fut

    def _flush(self) -> None:
        self._timer = None
        pending, self._pending = self._pending, []
        task = self.loop.create_task(self._send(pending))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _send(self, pending: list[tuple[str, str, asyncio.Future[None]]]) -> None:
        if len(pending) > 1:
            try:
                attempts = await self.store.heartbeat_many([(r, a) for r, a, _ in pending])
            except StoreError:  # one unknown attempt refuses the batch: beat each alone, so it fails only itself
                pass
            except BaseException as exc:  # the store unreachable: every beat of the batch failed alike
                for _, _, fut in pending:
                    _settle(fut, exc)
                if not isinstance(exc, Exception):
                    raise
                return
            else:
                for (_, attempt_id, fut), attempt in zip(pending, attempts, strict=True):
                    gone = None
                    if attempt.status != "running":
                        gone = ConflictError(f"attempt {attempt_id!r} is {attempt.status}, not running")
                    _settle(fut, gone)
                return
        for rollout_id, attempt_id, fut in pending:
            try:
                await self.store.heartbeat(rollout_id, attempt_id)
            except Exception as exc:
                _settle(fut, exc)
            else:
                _settle(fut, None)


def _settle(fut: asyncio.Future[None], exc: BaseException | None) -> None:
    if fut.done():  # its beat was cancelled (the attempt ended meanwhile)
        return
    if exc is None:
        fut.set_result(None)
    else:
        fut.set_exception(exc)
