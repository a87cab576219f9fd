"""Stable LLM proxy URLs per runner worker slot (see `agentlightning.proxy.LLMProxy` for the proxy's side).

Agent frameworks cache HTTP clients per base URL: langchain-openai builds new httpx clients (TLS context and
connection pool included) for each URL it has not seen, which made the per-rollout URL cost a LangGraph agent more
than twice its own work per rollout. So `agentlightning.llm_base_url` gives an agent the URL of the runner slot it
runs in, ``{proxy}/slot/{runner}.{slot}.{generation}/v1``, the same for every rollout the slot runs. Before the
agent starts, the runner tells the proxy which attempt the slot runs (``PUT /slot/{key}``, with the agents' token
`LLMResource.api_key`), and tells it again with each heartbeat (a restarted proxy learns it back).

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
from typing import TYPE_CHECKING

from agentlightning._models import Claim, LLMResource, Resources
from agentlightning._urls import slot_base_url

if TYPE_CHECKING:
    import aiohttp

__all__ = ["SlotRegistrar"]

logger = logging.getLogger(__name__)

_TIMEOUT = 10.0
"""Seconds a registration may take before the rollout falls back to its per-rollout URL."""


@dataclass(frozen=True)
class _Held:
    endpoint: str
    api_key: str | None
    key: str
    rollout_id: str
    attempt_id: str


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
        if not await self._put(held, llm):
            return None
        self._held[slot] = held
        return slot_base_url(llm.endpoint, held.key)

    async def refresh(self, slot: int) -> None:
        """Register ``slot``'s attempt again (with each heartbeat: a restarted proxy has forgotten it)."""
        held = self._held.get(slot)
        if held is not None:
            await self._put(held, None)

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
        with self._lock:
            session = self._sessions.pop(asyncio.get_running_loop(), None)
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

    async def _put(self, held: _Held, llm: LLMResource | None) -> bool:
        import aiohttp

        url = f"{held.endpoint.rstrip('/')}/slot/{held.key}"
        body = json.dumps({"rollout_id": held.rollout_id, "attempt_id": held.attempt_id})
        try:
            async with self._session().put(url, data=body, headers=self._headers(held.api_key)) as resp:
                if resp.status < 300:
                    await resp.read()
                    self._warned.discard(held.endpoint)
                    return True
                text = (await resp.text(errors="replace"))[:300]
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            self._warn_once(held.endpoint, f"cannot reach the LLM proxy at {held.endpoint} for a slot ({exc!r})")
            return False
        if resp.status in (404, 405) and llm is not None:
            # Not a slot-aware proxy (an older one, or a plain OpenAI-compatible server): stop asking it.
            self._unsupported.add(held.endpoint)
            logger.info("%s does not know runner slots (HTTP %d); agents get per-rollout URLs", url, resp.status)
        else:
            self._warn_once(held.endpoint, f"the LLM proxy refused slot {held.key}: HTTP {resp.status} {text}")
        return False

    async def _delete(self, held: _Held) -> None:
        import aiohttp

        url = f"{held.endpoint.rstrip('/')}/slot/{held.key}"
        body = json.dumps({"rollout_id": held.rollout_id, "attempt_id": held.attempt_id})
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
