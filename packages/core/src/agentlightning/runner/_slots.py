"""Stable LLM proxy URLs per runner worker slot (see `agentlightning.proxy.LLMProxy` for the proxy's side).

Agent frameworks cache HTTP clients per base URL: langchain-openai builds new httpx clients (TLS context and
connection pool included) for each URL it has not seen, which made the per-rollout URL cost a LangGraph agent more
than twice its own work per rollout. So `agentlightning.llm_base_url` gives an agent the URL of the runner slot it
runs in, ``{proxy}/slot/{runner}.{slot}.{generation}/v1``, the same for every rollout the slot runs. Before the
agent starts, the runner tells the proxy which attempt the slot runs (``PUT /slot/{key}``, with the agents' token
`LLMResource.api_key`), and tells it again with each heartbeat (a restarted proxy learns it back). Registrations
made while another is on its way wait for it and then go together in one ``PUT /slots`` (slots start rollouts in
bursts: one request per burst instead of one per rollout); each agent still starts only once the proxy confirmed its
own registration, and a proxy without ``PUT /slots`` gets them one by one.

An agent that ended uncleanly (timeout, cancellation, an exception) may still have code running: its slot is
cleared on the proxy and the slot's generation moves on, so the next rollout gets a new URL and the old occupant's
late calls are refused (404) instead of being recorded under the next rollout. A proxy that does not know slots
(404/405), or one the runner cannot reach, gets the per-rollout URL instead (``llm_base_url`` falls back to it).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agentlightning._models import Claim, LLMResource, Resources
from agentlightning._urls import slot_base_url

if TYPE_CHECKING:
    import aiohttp

__all__ = ["SlotRegistrar"]

logger = logging.getLogger(__name__)

_TIMEOUT = 10.0
"""Seconds a registration may take before the rollout falls back to its per-rollout URL."""
_MAX_BATCH = 512
"""Most registrations sent in one ``PUT /slots``."""


@dataclass(frozen=True)
class _Held:
    endpoint: str
    api_key: str | None
    key: str
    rollout_id: str
    attempt_id: str


@dataclass(frozen=True)
class _Waiting:
    """A registration waiting for the request that carries it; ``done`` gets whether the proxy took it."""

    held: _Held
    llm: LLMResource | None
    done: asyncio.Future[bool]


_Queue = tuple[asyncio.AbstractEventLoop, str, str | None]
"""Registrations that can share a request: same loop (its session), same proxy, same token."""


class SlotRegistrar:
    """One runner's slot keys and their registrations on the LLM proxy (used from event loops, one per thread).

    Args:
        runner_id: Unique among the runners that share a proxy (default: random).
    """

    def __init__(self, runner_id: str | None = None) -> None:
        self.runner_id = runner_id or uuid.uuid4().hex[:16]
        self._generation: dict[int, int] = {}
        self._held: dict[int, _Held] = {}  # slots whose agent runs
        self._idle: dict[int, _Held] = {}  # slots whose last agent ended cleanly (still registered on the proxy)
        self._unsupported: set[str] = set()
        self._no_batch: set[str] = set()  # slot-aware proxies without PUT /slots
        self._queues: dict[_Queue, list[_Waiting]] = {}
        self._senders: dict[_Queue, asyncio.Task[None]] = {}
        self._warned: set[str] = set()
        self._sessions: dict[asyncio.AbstractEventLoop, aiohttp.ClientSession] = {}
        self._lock = threading.Lock()

    def key(self, slot: int) -> str:
        """The proxy key of ``slot`` now (changes after an unclean end)."""
        return f"{self.runner_id}.{slot}.{self._generation.get(slot, 0)}"

    async def acquire(self, slot: int, claim: Claim, resources: Resources | None) -> str | None:
        """Register ``claim``'s attempt on ``slot``; returns the slot's URL (``None``: use the per-rollout URL)."""
        llm = resources.llm if resources is not None else None
        if llm is None or llm.endpoint in self._unsupported:
            return None
        held = _Held(llm.endpoint, llm.api_key, self.key(slot), claim.rollout.rollout_id, claim.attempt.attempt_id)
        self._idle.pop(slot, None)
        if not await self._register(held, llm):
            return None
        self._held[slot] = held
        return slot_base_url(llm.endpoint, held.key)

    async def refresh(self, slot: int) -> None:
        """Register ``slot``'s attempt again (with each heartbeat: a restarted proxy has forgotten it)."""
        held = self._held.get(slot)
        if held is not None:
            await self._register(held, None)

    async def release(self, slot: int, clean: bool) -> None:
        """The slot's agent is over; ``clean`` means it returned (nothing of it runs any more).

        After a clean end the slot keeps its URL (the next registration replaces the occupant); otherwise the slot
        is cleared on the proxy and gets a new generation, so calls still coming from the old agent are refused.
        """
        held = self._held.pop(slot, None)
        if held is None:
            return
        if clean:
            self._idle[slot] = held
            return
        self._generation[slot] = self._generation.get(slot, 0) + 1
        await self._delete(held)

    async def close(self) -> None:
        """Clear every slot this runner registered (best effort) and close this loop's connections."""
        for slot in list(self._held):
            await self.release(slot, clean=False)
        idle, self._idle = list(self._idle.values()), {}
        for held in idle:
            await self._delete(held)
        loop = asyncio.get_running_loop()
        senders = [task for queue, task in list(self._senders.items()) if queue[0] is loop]
        for task in senders:
            task.cancel()
        await asyncio.gather(*senders, return_exceptions=True)
        with self._lock:
            session = self._sessions.pop(loop, None)
        if session is not None:
            await session.close()

    # ------------------------------------------------------------------ HTTP
    def _session(self) -> aiohttp.ClientSession:
        import aiohttp

        loop = asyncio.get_running_loop()
        with self._lock:
            session = self._sessions.get(loop)
            if session is None or session.closed:
                session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=_TIMEOUT))
                self._sessions[loop] = session
        return session

    @staticmethod
    def _headers(api_key: str | None) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        return headers

    async def _register(self, held: _Held, llm: LLMResource | None) -> bool:
        """Register ``held`` with the next request to its proxy; whether the proxy took it."""
        if held.endpoint in self._no_batch:
            return await self._put(held, llm)
        loop = asyncio.get_running_loop()
        queue: _Queue = (loop, held.endpoint, held.api_key)
        waiting = _Waiting(held, llm, loop.create_future())
        self._queues.setdefault(queue, []).append(waiting)
        if queue not in self._senders:
            self._senders[queue] = loop.create_task(self._send_queued(queue))
        return await waiting.done

    async def _send_queued(self, queue: _Queue) -> None:
        """Send what waits in ``queue``, one request at a time, until nothing waits (the queue's only sender)."""
        batch: list[_Waiting] = []
        try:
            while True:
                waiting = self._queues.pop(queue, [])
                if len(waiting) > _MAX_BATCH:  # the rest goes with the next request
                    waiting, self._queues[queue] = waiting[:_MAX_BATCH], waiting[_MAX_BATCH:]
                batch = [entry for entry in waiting if not entry.done.done()]  # drop those whose caller left
                if not waiting:
                    return
                if not batch:
                    continue
                taken = None if len(batch) == 1 or queue[1] in self._no_batch else await self._put_many(batch)
                for entry in batch:
                    ok = await self._put(entry.held, entry.llm) if taken is None else taken
                    if not entry.done.done():
                        entry.done.set_result(ok)
                batch = []
        except asyncio.CancelledError:  # the loop is closing: nobody waits any more
            for entry in [*batch, *self._queues.pop(queue, [])]:
                entry.done.cancel()
            raise
        except Exception as exc:  # a bug, not the network: each waiting caller raises it, as its own request would
            for entry in [*batch, *self._queues.pop(queue, [])]:
                if not entry.done.done():
                    entry.done.set_exception(exc)
        finally:
            self._senders.pop(queue, None)

    async def _send(self, method: str, held: _Held, path: str, body: dict[str, Any]) -> tuple[int, str] | None:
        """Send one request to ``held``'s proxy: its status and (on failure) text; ``None``: unreachable (warned)."""
        import aiohttp

        url = f"{held.endpoint.rstrip('/')}{path}"
        try:
            async with self._session().request(
                method, url, data=json.dumps(body), headers=self._headers(held.api_key)
            ) as resp:
                if resp.status < 300:
                    await resp.read()
                    self._warned.discard(held.endpoint)
                    return resp.status, ""
                return resp.status, (await resp.text(errors="replace"))[:300]
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            self._warn_once(held.endpoint, f"cannot reach the LLM proxy at {held.endpoint} for a slot ({exc!r})")
            return None

    async def _put_many(self, batch: list[_Waiting]) -> bool | None:
        """Register ``batch`` in one ``PUT /slots``: whether the proxy took them; ``None``: it has no such route."""
        first = batch[0].held
        slots = {e.held.key: {"rollout_id": e.held.rollout_id, "attempt_id": e.held.attempt_id} for e in batch}
        answer = await self._send("PUT", first, "/slots", {"slots": slots})
        if answer is None:
            return False
        status, text = answer
        if status < 300:
            return True
        if status in (404, 405):  # a proxy from before PUT /slots (or no slot-aware proxy at all): one by one
            self._no_batch.add(first.endpoint)
            return None
        self._warn_once(first.endpoint, f"the LLM proxy refused {len(batch)} slot registrations: HTTP {status} {text}")
        return False

    async def _put(self, held: _Held, llm: LLMResource | None) -> bool:
        answer = await self._send("PUT", held, f"/slot/{held.key}", self._ids(held))
        if answer is None:
            return False
        status, text = answer
        if status < 300:
            return True
        url = f"{held.endpoint.rstrip('/')}/slot/{held.key}"
        if status in (404, 405) and llm is not None:
            # Not a slot-aware proxy (an older one, or a plain OpenAI-compatible server): stop asking it.
            self._unsupported.add(held.endpoint)
            logger.info("%s does not know runner slots (HTTP %d); agents get per-rollout URLs", url, status)
        else:
            self._warn_once(held.endpoint, f"the LLM proxy refused slot {held.key}: HTTP {status} {text}")
        return False

    @staticmethod
    def _ids(held: _Held) -> dict[str, str]:
        return {"rollout_id": held.rollout_id, "attempt_id": held.attempt_id}

    async def _delete(self, held: _Held) -> None:
        import aiohttp

        url = f"{held.endpoint.rstrip('/')}/slot/{held.key}"
        body = json.dumps(self._ids(held))
        try:
            async with self._session().delete(url, data=body, headers=self._headers(held.api_key)) as resp:
                await resp.read()
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            # The proxy is unreachable; the slot's key has moved on, so nothing new is ever sent to the old one.
            logger.debug("could not clear slot %s on %s: %r", held.key, held.endpoint, exc)

    def _warn_once(self, endpoint: str, message: str) -> None:
        if endpoint in self._warned:
            logger.debug("%s", message)
            return
        self._warned.add(endpoint)
        logger.warning("%s; agents get per-rollout URLs meanwhile", message)
