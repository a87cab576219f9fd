"""Stable LLM proxy URLs per runner worker slot, and attempts' ends (see `agentlightning.proxy.LLMProxy`).

Agent frameworks cache HTTP clients per base URL: langchain-openai builds new httpx clients (TLS context and
connection pool included) for each URL it has not seen, which made the per-rollout URL cost a LangGraph agent more
than twice its own work per rollout. So `agentlightning.llm_base_url` gives an agent the URL of the runner slot it
runs in, ``{proxy}/slot/{key}/v1``, the same for every rollout the slot runs. The key is random (``secrets``): one
slot's URL tells an agent nothing about another slot's. Before the agent starts, the runner tells the proxy which
attempt the slot runs (``PUT /slot/{key}``), tells it again with each heartbeat (a restarted proxy learns it back),
and tells it the attempt ended as soon as the agent returns (`SlotRegistrar.end`), so the proxy refuses calls that
still come for it (409), through the slot or the per-rollout URL alike. These requests carry the proxy's runner
token, `LLMResource.runner_token`, which the runner keeps from its agents (`for_agents`); the agents' token
(`LLMResource.api_key`) does not open the slot routes. The slot's URL is all its agent needs for its LLM calls: the
registered key in it admits them, so an agent may pass any ``api_key`` (a per-rollout URL, the fallback, needs the
agents' token). Requests made while another is on its way wait for it and
then go together in one ``PUT /slots`` (slots start and end rollouts in bursts: one request per burst instead of one
per rollout); each agent still starts only once the proxy confirmed its own registration, and a proxy without
``PUT /slots`` gets registrations one by one (and no end reports).

An agent that ended uncleanly (timeout, cancellation, an exception) may still have code running: the slot moves on
to a new key, so its late calls can never reach the slot's next rollout (they are refused as the ended attempt's).
A resource without a runner token, a proxy that does not know slots (404/405), or one the runner cannot reach gets
the per-rollout URL instead (``llm_base_url`` falls back to it).
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import threading
import uuid
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from agentlightning._models import Claim, LLMResource, Resources
from agentlightning._urls import slot_base_url

if TYPE_CHECKING:
    import aiohttp

__all__ = ["SlotRegistrar", "for_agents"]

logger = logging.getLogger(__name__)

_TIMEOUT = 10.0
"""Seconds a registration may take before the rollout falls back to its per-rollout URL."""
_MAX_BATCH = 512
"""Most registrations sent in one ``PUT /slots``."""


_KEY_BYTES = 18
"""Random bytes of a slot key (24 URL-safe characters)."""


def for_agents(resources: Resources | None) -> Resources | None:
    """``resources`` as the agent gets them: every `LLMResource` without its ``runner_token`` (the runner's)."""
    if resources is None or not any(
        isinstance(item, LLMResource) and item.runner_token is not None for item in resources.items.values()
    ):
        return resources
    data = resources.model_dump()
    for item in data["items"].values():
        if item.get("kind") == "llm":
            item["runner_token"] = None
    return Resources.model_validate(data)


@dataclass(frozen=True)
class _Held:
    """An attempt a slot runs, on the proxy at ``endpoint``; ``key`` ``None``: on its per-rollout URL."""

    endpoint: str
    runner_token: str
    key: str | None
    rollout_id: str
    attempt_id: str


@dataclass(frozen=True)
class _Waiting:
    """A registration (or, ``ended``, an end report) waiting for the request that carries it.

    ``llm`` is set on a slot's first registration for an attempt (a 404 then means: not a slot-aware proxy); ``done``
    gets whether the proxy took it.
    """

    held: _Held
    llm: LLMResource | None
    done: asyncio.Future[bool]
    ended: bool = False


_Queue = tuple[asyncio.AbstractEventLoop, str, str]
"""Requests that can share a request: same loop (its session), same proxy, same runner token."""


class SlotRegistrar:
    """One runner's slot keys, their registrations on the LLM proxy and its attempts' ends (one event loop).

    Args:
        runner_id: A name for this runner in logs (default: random); slot keys do not derive from it.
    """

    def __init__(self, runner_id: str | None = None) -> None:
        self.runner_id = runner_id or uuid.uuid4().hex[:16]
        self._keys: dict[int, str] = {}
        self._attempts: dict[int, _Held] = {}  # attempts whose end is not reported yet (on their slot or not)
        self._held: dict[int, _Held] = {}  # slots registered for the attempt they run (renewed with heartbeats)
        self._unsupported: set[str] = set()
        self._no_batch: set[str] = set()  # slot-aware proxies without PUT /slots
        self._queues: dict[_Queue, list[_Waiting]] = {}
        self._senders: dict[_Queue, asyncio.Task[None]] = {}
        self._warned: set[str] = set()
        self._noted: set[str] = set()  # endpoints whose resource has no runner token
        self._sessions: dict[asyncio.AbstractEventLoop, aiohttp.ClientSession] = {}
        self._lock = threading.Lock()

    def key(self, slot: int) -> str:
        """The proxy key of ``slot`` now: random, and replaced after an unclean end."""
        key = self._keys.get(slot)
        if key is None:
            key = self._keys[slot] = secrets.token_urlsafe(_KEY_BYTES)
        return key

    async def acquire(self, slot: int, claim: Claim, resources: Resources | None) -> str | None:
        """Register ``claim``'s attempt on ``slot``; returns the slot's URL (``None``: use the per-rollout URL).

        Either way the attempt's end is reported to the proxy by `end` (when the resource has a runner token).
        """
        llm = resources.llm if resources is not None else None
        if llm is None or llm.endpoint in self._unsupported:
            return None
        if llm.runner_token is None:
            self._note_once(llm.endpoint, "carries no runner_token")
            return None
        rollout_id, attempt_id, key = claim.rollout.rollout_id, claim.attempt.attempt_id, self.key(slot)
        held = _Held(llm.endpoint, llm.runner_token, key, rollout_id, attempt_id)
        self._attempts[slot] = replace(held, key=None)  # until the proxy takes the slot: ended without it
        if not await self._register(held, llm):
            return None
        self._attempts[slot] = self._held[slot] = held
        return slot_base_url(llm.endpoint, key)

    async def refresh(self, slot: int) -> None:
        """Register ``slot``'s attempt again (with each heartbeat: a restarted proxy has forgotten it)."""
        held = self._held.get(slot)
        if held is not None:
            await self._register(held, None)

    async def end(self, slot: int) -> None:
        """The agent on ``slot`` returned (or was abandoned): the proxy refuses its attempt's calls from now on.

        Runs once per attempt (later calls return at once); waits until the proxy took the report (or failed: warned).
        """
        held = self._attempts.pop(slot, None)
        self._held.pop(slot, None)
        if held is None or held.endpoint in self._unsupported or held.endpoint in self._no_batch:
            return
        await self._register(held, None, ended=True)

    async def release(self, slot: int, clean: bool) -> None:
        """The slot's agent is over; ``clean`` means it returned (nothing of it runs any more).

        Reports the attempt's end if `end` did not. After a clean end the slot keeps its URL (the next registration
        replaces the occupant); otherwise it gets a new key, so calls still coming from the old agent can never reach
        the slot's next rollout.
        """
        await self.end(slot)
        if not clean and slot in self._keys:
            del self._keys[slot]  # a new random key on the next acquire

    async def close(self) -> None:
        """Report the end of every attempt still held (best effort) and close this loop's connections.

        The proxy keeps the ended slots (their late calls are refused as such) until they go stale.
        """
        await asyncio.gather(*(self.end(slot) for slot in list(self._attempts)))
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
    def _headers(runner_token: str) -> dict[str, str]:
        return {"Content-Type": "application/json", "Authorization": f"Bearer {runner_token}"}

    async def _register(self, held: _Held, llm: LLMResource | None, ended: bool = False) -> bool:
        """Send ``held``'s registration (or end report) with the next request to its proxy; whether it was taken."""
        if held.endpoint in self._no_batch and not ended:
            return await self._put(held, llm)
        loop = asyncio.get_running_loop()
        queue: _Queue = (loop, held.endpoint, held.runner_token)
        waiting = _Waiting(held, llm, loop.create_future(), ended)
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
                alone = len(batch) == 1 and not batch[0].ended  # a registration alone: the single-slot route
                taken = None if alone or queue[1] in self._no_batch else await self._put_many(batch)
                for entry in batch:
                    if taken is not None:
                        ok = taken
                    else:  # one by one; a proxy without PUT /slots takes no end reports
                        ok = False if entry.ended else await self._put(entry.held, entry.llm)
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
                method, url, data=json.dumps(body), headers=self._headers(held.runner_token)
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
        """Send ``batch`` in one ``PUT /slots``: whether the proxy took it; ``None``: it has no such route."""
        first = batch[0].held
        slots = {e.held.key: self._ids(e.held) for e in batch if not e.ended and e.held.key is not None}
        ended = [{**self._ids(e.held), "slot": e.held.key} for e in batch if e.ended]
        answer = await self._send("PUT", first, "/slots", {"slots": slots, "ended": ended})
        if answer is None:
            return False
        status, text = answer
        if status < 300:
            return True
        if status in (404, 405):  # a proxy from before PUT /slots (or no slot-aware proxy at all): one by one
            self._no_batch.add(first.endpoint)
            return None
        what = f"{len(slots)} slot registration(s) and {len(ended)} end report(s)"
        self._warn_once(first.endpoint, f"the LLM proxy refused {what}: HTTP {status} {text}")
        return False

    async def _put(self, held: _Held, llm: LLMResource | None) -> bool:
        key = held.key or ""
        answer = await self._send("PUT", held, f"/slot/{key}", self._ids(held))
        if answer is None:
            return False
        status, text = answer
        if status < 300:
            return True
        url = f"{held.endpoint.rstrip('/')}/slot/{key}"
        if status in (404, 405) and llm is not None:
            # Not a slot-aware proxy (an older one, or a plain OpenAI-compatible server): stop asking it.
            self._unsupported.add(held.endpoint)
            logger.info("%s does not know runner slots (HTTP %d); agents get per-rollout URLs", url, status)
        else:
            self._warn_once(held.endpoint, f"the LLM proxy refused slot {key}: HTTP {status} {text}")
        return False

    @staticmethod
    def _ids(held: _Held) -> dict[str, str]:
        return {"rollout_id": held.rollout_id, "attempt_id": held.attempt_id}

    def _warn_once(self, endpoint: str, message: str) -> None:
        if endpoint in self._warned:
            logger.debug("%s", message)
            return
        self._warned.add(endpoint)
        hint = " (is the LLM resource's runner_token this proxy's?)" if "HTTP 401" in message else ""
        logger.warning("%s%s; agents get per-rollout URLs, and late calls may not be refused, meanwhile", message, hint)

    def _note_once(self, endpoint: str, why: str) -> None:
        if endpoint in self._noted:
            return
        self._noted.add(endpoint)
        logger.info(
            "the LLM resource for %s %s: agents get per-rollout URLs, and the proxy is not told when attempts end "
            "(late calls are not refused); publish LLMProxy.llm_resource(...) to use runner slots",
            endpoint,
            why,
        )
