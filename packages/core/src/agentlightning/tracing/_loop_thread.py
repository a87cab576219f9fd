"""A daemon thread that runs an asyncio event loop, for calling async stores from sync code."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["LoopThread"]

logger = logging.getLogger(__name__)

T = TypeVar("T")


class LoopThread:
    """An event loop running forever in a daemon thread.

    Sync code hands coroutines to it with `submit` (a `concurrent.futures.Future`) or `call` (blocks for the
    result). Every coroutine runs on the same loop, so an object bound to that loop (an aiohttp session, an
    ``asyncio.Lock``) is always used from it.

    Args:
        name: Thread name (shows up in debuggers and thread dumps).
    """

    def __init__(self, name: str = "agentlightning-loop") -> None:
        self._name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The running loop (the thread starts on first use)."""
        with self._lock:
            if self._loop is None or self._thread is None or not self._thread.is_alive():
                self._start()
            assert self._loop is not None
            return self._loop

    def _start(self) -> None:
        loop = asyncio.new_event_loop()
        ready = threading.Event()

        def _main() -> None:
            asyncio.set_event_loop(loop)
            loop.call_soon(ready.set)
            try:
                loop.run_forever()
            finally:
                try:
                    loop.run_until_complete(loop.shutdown_asyncgens())
                finally:
                    loop.close()

        thread = threading.Thread(target=_main, name=self._name, daemon=True)
        thread.start()
        ready.wait()
        self._loop = loop
        self._thread = thread

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedule ``coro`` on the loop; returns a future for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the loop and wait for its result (do not call from the loop's own thread)."""
        if self.in_loop_thread():
            coro.close()
            raise RuntimeError(f"LoopThread.call() from the loop thread {self._name!r} would deadlock")
        return self.submit(coro).result(timeout)

    def in_loop_thread(self) -> bool:
        """Whether the caller runs on this loop's thread."""
        return self._thread is not None and threading.current_thread() is self._thread

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the loop and join the thread (pending callbacks are dropped)."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = None
            self._thread = None
        if loop is None or thread is None:
            return
        if not loop.is_closed():
            loop.call_soon_threadsafe(loop.stop)
        if thread is not threading.current_thread():
            thread.join(timeout)
