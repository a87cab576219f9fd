"""How the LLM proxy records calls: one `LLMCall` per call, written before the answer (``record="sync"``) or queued.

`CallRecorder` is the recording half of `LLMProxy` (``_proxy.py``): it builds each call's record from the backend's
answer, warns once per backend that returns no token ids, and writes records to the store at once or in batches
from a background task (``record="background"``, see `CallRecorder.flush`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Literal

from starlette.responses import Response

from agentlightning._models import LLMCall, now
from agentlightning.proxy._asgi import error
from agentlightning.proxy._assemble import Extracted, without_token_fields
from agentlightning.proxy._slots import SlotTable
from agentlightning.proxy._streaming import LATE_CALL, Meta, refusal_of
from agentlightning.store import AttemptEndedError, LightningStore

__all__ = ["CallRecorder", "unrecorded"]

logger = logging.getLogger("agentlightning.proxy._proxy")  # the proxy's logger, as before the split


class CallRecorder:
    """The recording half of `LLMProxy` (which sets the attributes below in its constructor)."""

    store: LightningStore
    record: Literal["sync", "background"]
    _loop: asyncio.AbstractEventLoop | None
    _pending: list[LLMCall]
    _flush_wakeup: asyncio.Event | None
    _writes: set[asyncio.Task[Any]]
    _missing_ids_count: dict[str, int]
    _late_calls: int
    slots: SlotTable

    def _count_late(self, rollout_id: str, attempt_id: str, answered: bool = False) -> None:
        """Count a late call (its attempt had ended) and remember the end: its next calls are refused unforwarded.

        ``answered``: the agent already had its answer (``record="background"``), only the record was refused.
        """
        self.slots.end(rollout_id, attempt_id)
        self._late_calls += 1
        count = self._late_calls
        if count == 1 or count % 100 == 0:
            logger.warning(
                "refused a late LLM call for attempt %s of rollout %s, which already ended (%d late call(s) so far)%s: "
                "some agent code still runs after its rollout ended",
                attempt_id,
                rollout_id,
                count,
                "; its answer was given, its record is not stored" if answered else "",
            )

    async def flush(self) -> None:
        """Store every record queued before this call (``record="background"``); returns once they are written.

        Records of calls answered meanwhile are not waited for, so a proxy that keeps serving (the RL loop's
        ``max_staleness`` > 0) cannot hold a flush up.
        """
        loop = self._loop
        if loop is not None and loop is not asyncio.get_running_loop():
            await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self.flush(), loop))
            return
        # First the tasks that queue the records of streams that ended before this call, then every batch write
        # that may hold a record queued before it: ours (what is queued now) and those already running (the
        # background writer's, which may have taken some of them).
        await asyncio.gather(*list(self._writes), return_exceptions=True)
        self._spawn(self._write_batch())
        await asyncio.gather(*list(self._writes), return_exceptions=True)

    def _spawn(self, coro: Any) -> asyncio.Future[Any]:
        task = asyncio.ensure_future(coro)
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)
        return task

    async def _record_shielded(
        self, meta: Meta, response: dict[str, Any] | None, extracted: Extracted, error: str | None = None
    ) -> str | None:
        """`_record`, finished even when the agent hangs up meanwhile (the handler is then cancelled)."""
        if self.record == "background":
            # Queuing never suspends, so no cancellation can cut it short: no task and shield per call (the RL loop's
            # mode: this runs for every LLM call)
            return await self._record(meta, response, extracted, error)
        return await asyncio.shield(self._record(meta, response, extracted, error))

    async def _record(
        self,
        meta: Meta,
        response: dict[str, Any] | None,
        extracted: Extracted,
        error: str | None = None,
    ) -> str | None:
        """Record one call; returns why it could not be stored (``None`` once stored or queued)."""
        call_id, rollout_id, backend = meta[0], meta[1], meta[4]
        if error is None and extracted.response_token_ids is None:
            self._warn_missing_ids(backend, call_id, rollout_id)
        if extracted.note:
            logger.warning("LLM call %s from backend %s: %s", call_id, backend, extracted.note)
        try:
            call = self._call_record(meta, response, extracted, error)
        except ValueError as exc:  # e.g. NaN logprobs from the backend: the store would refuse them too
            logger.error("LLM proxy cannot record call %s of rollout %s: %s", call_id, rollout_id, exc)
            return f"the call's record is invalid: {' '.join(str(exc).split())}"
        if self.record == "background":
            self._pending.append(call)
            if self._flush_wakeup is not None:
                self._flush_wakeup.set()
            return None
        try:
            await self.store.add_llm_calls([call])
        except AttemptEndedError as exc:  # ended elsewhere (the store's API, a timeout, a cancel): a late call
            self._count_late(rollout_id, call.attempt_id)
            return LATE_CALL + " ".join(str(exc).split())
        except Exception as exc:
            logger.exception("LLM proxy could not store call %s of rollout %s", call_id, rollout_id)
            return f"{type(exc).__name__}: {exc}"
        return None

    def _call_record(
        self, meta: Meta, response: dict[str, Any] | None, extracted: Extracted, error: str | None
    ) -> LLMCall:
        call_id, rollout_id, attempt_id, agent_request, backend, start, admitted_version, policy, agent = meta
        return LLMCall(
            call_id=call_id,
            rollout_id=rollout_id,
            attempt_id=attempt_id,
            response_id=response.get("id") if response else None,
            request=agent_request,
            response=without_token_fields(response) if response is not None else None,
            prompt_token_ids=extracted.prompt_token_ids or [],
            response_token_ids=extracted.response_token_ids or [],
            response_logprobs=extracted.response_logprobs,
            model=(response.get("model") if response else None) or agent_request.get("model"),
            model_version=admitted_version if extracted.model_version is None else extracted.model_version,
            backend=backend,
            start_time=start,
            end_time=now(),
            error=error,
            policy=policy,
            agent_name=agent,
        )

    def _warn_missing_ids(self, backend: str, call_id: str, rollout_id: str) -> None:
        count = self._missing_ids_count.get(backend, 0) + 1
        self._missing_ids_count[backend] = count
        if count == 1 or count % 100 == 0:
            logger.warning(
                "backend %s returned no token ids (call %s, rollout %s; %d such call(s) so far): the call is "
                "recorded with empty ids and cannot be trained on. Serve the model with vLLM >= 0.10.2 "
                "(return_token_ids) or the agentlightning torch backend.",
                backend,
                call_id,
                rollout_id,
                count,
            )

    async def _write_batch(self) -> None:
        batch, self._pending = self._pending, []
        if not batch:
            return
        try:
            await self.store.add_llm_calls(batch)
        except AttemptEndedError:  # the store refused the whole batch: store the calls of attempts still running
            await self._write_per_attempt(batch)
        except Exception:
            logger.exception("LLM proxy could not store %d call(s)", len(batch))

    async def _write_per_attempt(self, batch: list[LLMCall]) -> None:
        """Write a refused batch again, one request per attempt, so only the late calls' records are dropped."""
        groups: dict[tuple[str, str], list[LLMCall]] = {}
        for call in batch:
            groups.setdefault((call.rollout_id, call.attempt_id), []).append(call)
        for (rollout_id, attempt_id), calls in groups.items():
            try:
                await self.store.add_llm_calls(calls)
            except AttemptEndedError:
                for _ in calls:
                    self._count_late(rollout_id, attempt_id, answered=True)
            except Exception:
                logger.exception("LLM proxy could not store %d call(s) of rollout %s", len(calls), rollout_id)

    async def _flush_loop(self) -> None:
        assert self._flush_wakeup is not None
        while True:
            await self._flush_wakeup.wait()
            self._flush_wakeup.clear()
            await self._spawn(self._write_batch())  # tracked, so that `flush` waits for a batch being written


def unrecorded(failure: str, headers: dict[str, str]) -> Response:
    """The answer to a call whose record could not be stored: 409 for a late call (`refusal_of`), else 404 / 502."""
    status, kind, message = refusal_of(failure)
    return error(status, message, kind, headers=headers)
