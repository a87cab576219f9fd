"""In-memory store: the reference backend for tests and single-process runs."""

from __future__ import annotations

import heapq
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, NoReturn

from agentlightning._models import (
    TERMINAL_ROLLOUT_STATUSES,
    Attempt,
    AttemptStatus,
    Claim,
    LLMCall,
    Resources,
    Rollout,
    RolloutMode,
    RolloutStatus,
    Span,
    new_id,
    now,
)
from agentlightning.store import _common as boundary
from agentlightning.store._base import (
    RELEASED,
    ConflictError,
    NotFoundError,
    RetryPolicy,
    RolloutRequest,
    StoreStats,
)
from agentlightning.store._common import (
    ALL_ROLLOUT_STATUSES,
    ChangeNotifier,
    check_finish_status,
    check_id,
    check_statuses,
    rollout_status_after,
    timed_out_status,
    wait_until_finished,
)
from agentlightning.store._query import (
    AttemptFacts,
    RolloutPage,
    RolloutQuery,
    RunStats,
    RunStatsQuery,
    final_reward_of,
    matches,
    run_stats_from,
    summarize,
)

__all__ = ["MemoryStore"]

_REQUEST_MEMORY_SIZE = 100_000


class MemoryStore:
    """A `LightningStore` that keeps everything in this process's memory.

    Safe to share between asyncio tasks and threads of one process; nothing survives the process and it
    cannot be shared with other processes (use `SqliteStore` or a served store for that).

    Args:
        retry_policy: When failed or silent attempts are retried; defaults to `RetryPolicy()`.
    """

    def __init__(self, retry_policy: RetryPolicy | None = None) -> None:
        self.retry_policy: RetryPolicy = retry_policy or RetryPolicy()
        self._lock = threading.RLock()
        self._notifier = ChangeNotifier()
        self._seq = 0
        self._rollouts: dict[str, Rollout] = {}
        self._order: dict[str, int] = {}  # rollout id -> enqueue sequence (FIFO key, survives retries)
        self._queue: list[tuple[int, str]] = []  # heap; entries of rollouts no longer queuing are skipped
        self._attempts: dict[str, list[Attempt]] = {}
        self._spans: dict[str, dict[tuple[str, str], Span]] = {}  # rollout -> (attempt, span) -> span
        self._calls: dict[str, LLMCall] = {}
        self._resources: dict[str, Resources] = {}
        self._latest: Resources | None = None
        self._running: dict[str, str] = {}  # running attempt id -> rollout id
        # what an attempt's records say, for dashboards: (rollout, attempt) -> (span sequence_id, final reward)
        self._rewards: dict[tuple[str, str], tuple[int, float]] = {}
        self._versions: dict[tuple[str, str], int] = {}  # (rollout, attempt) -> newest model version of its calls
        self._attempt_rollout: dict[str, str] = {}  # every attempt id -> its rollout id
        self._requests: OrderedDict[str, Any] = OrderedDict()  # client request id -> answer, for retries
        # a lower bound of the earliest moment a running attempt can time out (heartbeats only push it later)
        self._next_deadline = float("inf")
        self._closed = False

    def reopen_spec(self) -> NoReturn:
        """Not available: an in-memory store lives in one process and cannot be reopened elsewhere."""
        raise TypeError(
            "MemoryStore cannot be shared across processes; use SqliteStore(path) or a served store "
            "(`agl store serve`) for multi-process runners"
        )

    # ----------------------------------------------------------------- rollouts

    async def enqueue_rollouts(self, requests: Sequence[RolloutRequest]) -> list[Rollout]:
        """Queue rollouts (batched); returns them in request order."""
        reqs = boundary.validate_requests(requests)
        out: list[Rollout] = []
        with self._lock:
            for req in reqs:
                rollout_id = req.rollout_id or new_id("ro")
                existing = self._rollouts.get(rollout_id)
                if existing is not None:
                    out.append(existing)
                    continue
                t = now()
                rollout = Rollout(
                    rollout_id=rollout_id,
                    input=req.input,
                    mode=req.mode,
                    group_id=req.group_id,
                    resources_id=req.resources_id,
                    metadata=req.metadata,
                    created_at=t,
                    updated_at=t,
                )
                self._seq += 1
                self._rollouts[rollout_id] = rollout
                self._order[rollout_id] = self._seq
                self._attempts[rollout_id] = []
                heapq.heappush(self._queue, (self._seq, rollout_id))
                out.append(rollout)
        return out

    async def enqueue_rollout(self, input: Any = None, **fields: Any) -> Rollout:
        """Queue one rollout; ``fields`` are those of `RolloutRequest`."""
        (rollout,) = await self.enqueue_rollouts([RolloutRequest(input=input, **fields)])
        return rollout

    async def dequeue_rollout(self, worker_id: str | None = None, *, request_id: str | None = None) -> Claim | None:
        """Claim the oldest queuing rollout and start an attempt for it, or ``None`` when the queue is empty.

        A retried request with the same ``request_id`` gets the same claim back (answers are kept in memory).
        """
        if worker_id is not None:
            check_id("worker_id", worker_id)
        key = None if request_id is None else "dequeue:" + check_id("request_id", request_id)
        with self._lock:
            if key is not None and key in self._requests:
                ids = self._requests[key]
                if ids is None:
                    return None
                rollout_id, attempt_id = ids
                return Claim(
                    rollout=self._rollouts[rollout_id], attempt=self._get_attempt_locked(rollout_id, attempt_id)[1]
                )
            claim = self._dequeue_locked(worker_id)
            if key is not None:
                self._remember(key, None if claim is None else (claim.rollout.rollout_id, claim.attempt.attempt_id))
            return claim

    def _remember(self, key: str, answer: Any) -> None:
        self._requests[key] = answer
        if len(self._requests) > _REQUEST_MEMORY_SIZE:
            self._requests.popitem(last=False)

    def _dequeue_locked(self, worker_id: str | None) -> Claim | None:
        self._check_timeouts_locked()
        while self._queue:
            _, rollout_id = heapq.heappop(self._queue)
            rollout = self._rollouts[rollout_id]
            if rollout.status != "queuing":
                continue
            t = now()
            attempts = self._attempts[rollout_id]
            attempt = Attempt(
                rollout_id=rollout_id,
                attempt_id=new_id("at"),
                sequence=len(attempts) + 1,
                worker_id=worker_id,
                start_time=t,
                last_heartbeat=t,
            )
            attempts.append(attempt)
            self._attempt_rollout[attempt.attempt_id] = rollout_id
            self._running[attempt.attempt_id] = rollout_id
            self._next_deadline = min(self._next_deadline, self._deadline(attempt))
            rollout = rollout.model_copy(update={"status": "running", "updated_at": t})
            self._rollouts[rollout_id] = rollout
            return Claim(rollout=rollout, attempt=attempt)
        return None

    def _get_rollout_locked(self, rollout_id: str) -> Rollout:
        rollout = self._rollouts.get(rollout_id)
        if rollout is None:
            raise NotFoundError(f"rollout {rollout_id!r} not found")
        return rollout

    def _get_attempt_locked(self, rollout_id: str, attempt_id: str) -> tuple[int, Attempt]:
        self._get_rollout_locked(rollout_id)
        for index, attempt in enumerate(self._attempts[rollout_id]):
            if attempt.attempt_id == attempt_id:
                return index, attempt
        raise NotFoundError(f"attempt {attempt_id!r} of rollout {rollout_id!r} not found")

    async def heartbeat(self, rollout_id: str, attempt_id: str) -> Attempt:
        """Record a sign of life; raises `ConflictError` if the attempt is no longer running."""
        check_id("rollout_id", rollout_id)
        check_id("attempt_id", attempt_id)
        with self._lock:
            index, attempt = self._get_attempt_locked(rollout_id, attempt_id)
            if attempt.status != "running":
                raise ConflictError(f"attempt {attempt_id!r} is {attempt.status}, not running")
            attempt = attempt.model_copy(update={"last_heartbeat": now()})
            self._attempts[rollout_id][index] = attempt
            return attempt

    def _end_attempt_locked(
        self, index: int, attempt: Attempt, status: AttemptStatus, error: str | None, t: float
    ) -> tuple[Attempt, Rollout]:
        """End a running attempt and move its rollout on; the caller holds the lock."""
        rollout_id = attempt.rollout_id
        ended = attempt.model_copy(update={"status": status, "end_time": t, "error": error})
        self._attempts[rollout_id][index] = ended
        self._running.pop(attempt.attempt_id, None)
        rollout = self._rollouts[rollout_id]
        next_status: RolloutStatus = rollout_status_after(self.retry_policy, status, attempt.sequence)
        update: dict[str, Any] = {"status": next_status, "updated_at": t}
        if next_status == "queuing":
            update["retry_count"] = rollout.retry_count + 1
            heapq.heappush(self._queue, (self._order[rollout_id], rollout_id))
        rollout = rollout.model_copy(update=update)
        self._rollouts[rollout_id] = rollout
        return ended, rollout

    async def finish_attempt(
        self, rollout_id: str, attempt_id: str, status: AttemptStatus, error: str | None = None
    ) -> Rollout:
        """End an attempt and move its rollout on according to the retry policy."""
        check_id("rollout_id", rollout_id)
        check_id("attempt_id", attempt_id)
        check_finish_status(status)
        with self._lock:
            index, attempt = self._get_attempt_locked(rollout_id, attempt_id)
            if attempt.status != "running":
                if attempt.status == status:
                    return self._rollouts[rollout_id]
                raise ConflictError(
                    f"attempt {attempt_id!r} already ended as {attempt.status}; cannot finish it as {status}"
                )
            _, rollout = self._end_attempt_locked(index, attempt, status, error, now())
        if rollout.status in TERMINAL_ROLLOUT_STATUSES:
            self._notifier.notify()
        return rollout

    async def release_claim(self, rollout_id: str, attempt_id: str) -> Rollout:
        """Give a running attempt back: it ends ``cancelled`` and its rollout is queued again at once."""
        check_id("rollout_id", rollout_id)
        check_id("attempt_id", attempt_id)
        with self._lock:
            index, attempt = self._get_attempt_locked(rollout_id, attempt_id)
            rollout = self._rollouts[rollout_id]
            if attempt.status != "running":
                return rollout
            t = now()
            self._attempts[rollout_id][index] = attempt.model_copy(
                update={"status": "cancelled", "end_time": t, "error": RELEASED}
            )
            self._running.pop(attempt_id, None)
            rollout = rollout.model_copy(
                update={"status": "queuing", "updated_at": t, "retry_count": rollout.retry_count + 1}
            )
            self._rollouts[rollout_id] = rollout
            heapq.heappush(self._queue, (self._order[rollout_id], rollout_id))
            return rollout

    async def cancel_rollout(self, rollout_id: str) -> Rollout:
        """Cancel a rollout that has not finished (its running attempt is cancelled too)."""
        check_id("rollout_id", rollout_id)
        with self._lock:
            rollout = self._get_rollout_locked(rollout_id)
            if rollout.status == "cancelled":
                return rollout
            if rollout.status in TERMINAL_ROLLOUT_STATUSES:
                raise ConflictError(f"rollout {rollout_id!r} already {rollout.status}; cannot cancel it")
            t = now()
            attempts = self._attempts[rollout_id]
            for index, attempt in enumerate(attempts):
                if attempt.status == "running":
                    attempts[index] = attempt.model_copy(update={"status": "cancelled", "end_time": t})
                    self._running.pop(attempt.attempt_id, None)
            rollout = rollout.model_copy(update={"status": "cancelled", "updated_at": t})
            self._rollouts[rollout_id] = rollout
        self._notifier.notify()
        return rollout

    def _deadline(self, attempt: Attempt) -> float:
        policy = self.retry_policy
        deadline = attempt.last_heartbeat + policy.heartbeat_timeout
        if policy.rollout_timeout is not None:
            deadline = min(deadline, attempt.start_time + policy.rollout_timeout)
        return deadline

    def _check_timeouts_locked(self) -> list[Attempt]:
        t = now()
        ended: list[Attempt] = []
        if t <= self._next_deadline:
            return ended
        next_deadline = float("inf")
        for attempt_id, rollout_id in list(self._running.items()):
            index, attempt = self._get_attempt_locked(rollout_id, attempt_id)
            status = timed_out_status(self.retry_policy, attempt.start_time, attempt.last_heartbeat, t)
            if status is None:
                next_deadline = min(next_deadline, self._deadline(attempt))
            else:
                done, _ = self._end_attempt_locked(index, attempt, status, None, t)
                ended.append(done)
        self._next_deadline = next_deadline
        return ended

    async def check_timeouts(self) -> list[Attempt]:
        """Apply heartbeat/rollout timeouts now; returns the attempts that were ended."""
        with self._lock:
            ended = self._check_timeouts_locked()
        if ended:
            self._notifier.notify()
        return ended

    async def get_rollout(self, rollout_id: str) -> Rollout:
        """One rollout; raises `NotFoundError`."""
        check_id("rollout_id", rollout_id)
        with self._lock:
            return self._get_rollout_locked(rollout_id)

    async def query_rollouts(
        self, status: Sequence[RolloutStatus] | None = None, rollout_ids: Sequence[str] | None = None
    ) -> list[Rollout]:
        """Rollouts filtered by status and/or ids, in enqueue order."""
        statuses = check_statuses(status)
        ids = None if rollout_ids is None else set(boundary.validate_ids(rollout_ids, "rollout_ids"))
        with self._lock:
            rollouts = [
                r
                for r in self._rollouts.values()  # dicts keep insertion (= enqueue) order
                if (statuses is None or r.status in statuses) and (ids is None or r.rollout_id in ids)
            ]
        return rollouts

    async def query_attempts(self, rollout_id: str) -> list[Attempt]:
        """Attempts of a rollout in order."""
        check_id("rollout_id", rollout_id)
        with self._lock:
            self._get_rollout_locked(rollout_id)
            return list(self._attempts[rollout_id])

    async def wait_for_rollouts(self, rollout_ids: Sequence[str], timeout: float | None = None) -> list[Rollout]:
        """Wait until the rollouts reach a terminal status or ``timeout`` seconds pass; returns the finished ones."""
        ids = boundary.validate_ids(rollout_ids, "rollout_ids")
        with self._lock:
            for rollout_id in ids:
                self._get_rollout_locked(rollout_id)

        async def poll() -> tuple[list[Rollout], bool]:
            await self.check_timeouts()
            with self._lock:
                finished = [self._rollouts[i] for i in ids if self._rollouts[i].status in TERMINAL_ROLLOUT_STATUSES]
            return finished, len(finished) == len(ids)

        # timeouts are the only change not announced by the notifier, so polling can be lazy
        poll_interval = min(0.5, self.retry_policy.heartbeat_timeout / 2)
        return await wait_until_finished(self._notifier, poll, timeout, poll_interval)

    # ----------------------------------------------------------------- spans and calls

    def _check_attempts_locked(self, pairs: set[tuple[str, str]], what: str) -> None:
        for rollout_id, attempt_id in pairs:
            if self._attempt_rollout.get(attempt_id) != rollout_id:
                self._get_rollout_locked(rollout_id)
                raise NotFoundError(
                    f"attempt {attempt_id!r} of rollout {rollout_id!r} not found: {what} can only be added to an "
                    "attempt the store started (dequeue_rollout)"
                )

    async def add_spans(self, spans: Sequence[Span], *, request_id: str | None = None) -> int:
        """Store spans (idempotent on (rollout_id, attempt_id, span_id)); returns how many were new.

        Raises `NotFoundError` for a span of an attempt the store did not start. A retried request with the same
        ``request_id`` gets the count of the first one.
        """
        batch = boundary.validate_spans(spans)
        key = None if request_id is None else "spans:" + check_id("request_id", request_id)
        added = 0
        with self._lock:
            if key is not None and key in self._requests:
                return self._requests[key]
            self._check_attempts_locked({(s.rollout_id, s.attempt_id) for s in batch}, "spans")
            for span in batch:
                per_rollout = self._spans.setdefault(span.rollout_id, {})
                span_key = (span.attempt_id, span.span_id)
                if span_key not in per_rollout:
                    per_rollout[span_key] = span
                    added += 1
                    reward = final_reward_of(span)
                    if reward is not None:
                        facts_key = (span.rollout_id, span.attempt_id)
                        known = self._rewards.get(facts_key)
                        if known is None or known[0] <= span.sequence_id:
                            self._rewards[facts_key] = (span.sequence_id, reward)
            if key is not None:
                self._remember(key, added)
        return added

    async def query_spans(self, rollout_id: str, attempt_id: str | None = None) -> list[Span]:
        """Spans of a rollout (or one attempt), ordered by attempt then sequence_id."""
        check_id("rollout_id", rollout_id)
        if attempt_id is not None:
            check_id("attempt_id", attempt_id)
        with self._lock:
            spans = [
                s for s in self._spans.get(rollout_id, {}).values() if attempt_id is None or s.attempt_id == attempt_id
            ]
            order = {a.attempt_id: a.sequence for a in self._attempts.get(rollout_id, [])}
        # spans of attempts the store does not know sort after the known ones (same order as SqliteStore)
        spans.sort(key=lambda s: (order.get(s.attempt_id, 1 << 62), s.attempt_id, s.sequence_id, s.span_id))
        return spans

    async def add_llm_calls(self, calls: Sequence[LLMCall], *, request_id: str | None = None) -> int:
        """Store proxy records (idempotent on call_id); returns how many were new.

        Raises `NotFoundError` for a call of an attempt the store did not start; ``request_id`` as in `add_spans`.
        """
        batch = boundary.validate_calls(calls)
        key = None if request_id is None else "calls:" + check_id("request_id", request_id)
        added = 0
        with self._lock:
            if key is not None and key in self._requests:
                return self._requests[key]
            self._check_attempts_locked({(c.rollout_id, c.attempt_id) for c in batch}, "LLM calls")
            for call in batch:
                if call.call_id not in self._calls:
                    self._calls[call.call_id] = call
                    added += 1
                    if call.model_version is not None:
                        facts_key = (call.rollout_id, call.attempt_id)
                        self._versions[facts_key] = max(self._versions.get(facts_key, -1), call.model_version)
            if key is not None:
                self._remember(key, added)
        return added

    async def query_llm_calls(self, rollout_id: str, attempt_id: str | None = None) -> list[LLMCall]:
        """LLM calls of a rollout (or one attempt) in start order."""
        check_id("rollout_id", rollout_id)
        if attempt_id is not None:
            check_id("attempt_id", attempt_id)
        with self._lock:
            calls = [
                c
                for c in self._calls.values()
                if c.rollout_id == rollout_id and (attempt_id is None or c.attempt_id == attempt_id)
            ]
        calls.sort(key=lambda c: c.start_time)
        return calls

    # ----------------------------------------------------------------- resources

    async def add_resources(self, resources: Resources) -> Resources:
        """Store a new resources version; returns it with its assigned version."""
        res = boundary.validate_resources(resources)
        with self._lock:
            existing = self._resources.get(res.resources_id)
            if existing is not None:
                return existing
            version = (self._latest.version if self._latest else 0) + 1
            stored = res.model_copy(update={"version": version})
            self._resources[res.resources_id] = stored
            self._latest = stored
            return stored

    async def get_resources(self, resources_id: str | None = None) -> Resources | None:
        """Resources by id, or the latest version when ``resources_id`` is ``None``."""
        with self._lock:
            if resources_id is None:
                return self._latest
            check_id("resources_id", resources_id)
            found = self._resources.get(resources_id)
            if found is None:
                raise NotFoundError(f"resources {resources_id!r} not found")
            return found

    async def query_resources(self) -> list[Resources]:
        """Every stored resources version, oldest first (the last one is the current one)."""
        with self._lock:
            return sorted(self._resources.values(), key=lambda r: r.version)

    # ----------------------------------------------------------------- dashboards

    def _facts_locked(self, rollout_id: str) -> list[AttemptFacts]:
        facts: list[AttemptFacts] = []
        for attempt in self._attempts.get(rollout_id, []):
            key = (rollout_id, attempt.attempt_id)
            reward = self._rewards.get(key)
            facts.append(
                AttemptFacts(
                    attempt=attempt,
                    reward=None if reward is None else reward[1],
                    model_version=self._versions.get(key),
                )
            )
        return facts

    async def list_rollouts(self, query: RolloutQuery | None = None) -> RolloutPage:
        """A page of rollout summaries matching ``query``, newest first, with the total number of matches."""
        query = RolloutQuery.model_validate(query if query is not None else {})
        at = now()
        with self._lock:
            served: dict[str, set[int]] = {}
            if query.model_version is not None:
                for (rollout_id, _), version in self._versions.items():
                    served.setdefault(rollout_id, set()).add(version)
            selected = [
                rollout
                for rollout in reversed(self._rollouts.values())  # newest first
                if matches(query, rollout, served.get(rollout.rollout_id, ()))
            ]
            page = selected[query.offset : query.offset + query.limit]
            rows = [summarize(r, self._facts_locked(r.rollout_id), at) for r in page]
        return RolloutPage(total=len(selected), offset=query.offset, limit=query.limit, rollouts=rows)

    async def run_stats(self, query: RunStatsQuery | None = None) -> RunStats:
        """Counts per status, reward and success rate per (model version, mode), and recent throughput."""
        query = RunStatsQuery.model_validate(query if query is not None else {})
        at = now()
        with self._lock:
            counts = dict.fromkeys(ALL_ROLLOUT_STATUSES, 0)
            for rollout in self._rollouts.values():
                counts[rollout.status] += 1
            facts: list[tuple[AttemptFacts, RolloutMode | None]] = [
                (fact, r.mode) for r in self._rollouts.values() for fact in self._facts_locked(r.rollout_id)
            ]
        return run_stats_from(query, counts, facts, at)

    # ----------------------------------------------------------------- misc

    async def stats(self) -> StoreStats:
        """Counts of what is stored."""
        with self._lock:
            counts = dict.fromkeys(ALL_ROLLOUT_STATUSES, 0)
            for rollout in self._rollouts.values():
                counts[rollout.status] += 1
            return StoreStats(
                rollouts=counts,
                attempts=sum(len(a) for a in self._attempts.values()),
                spans=sum(len(s) for s in self._spans.values()),
                llm_calls=len(self._calls),
                resources=len(self._resources),
            )

    async def close(self) -> None:
        """Nothing to release; the data stays readable until the object is dropped."""
        self._closed = True
