"""The in-memory store's state and records: spans, LLM calls, resources versions and the dashboard reads.

`MemoryRecords` holds every dict of a `MemoryStore` and the appended records; `MemoryStore` (``_memory.py``) adds
the rollout queue and the attempt lifecycle on top.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from agentlightning._fast import fast_replace
from agentlightning._models import (
    Attempt,
    LLMCall,
    Resources,
    Rollout,
    RolloutMode,
    Span,
    now,
)
from agentlightning.store._base import (
    NotFoundError,
    RetryPolicy,
    StoreStats,
)
from agentlightning.store._boundary import StoreBoundary
from agentlightning.store._common import (
    ALL_ROLLOUT_STATUSES,
    ChangeNotifier,
    check_record_attempts,
    judgement_batch,
)
from agentlightning.store._query import (
    AttemptFacts,
    RolloutPage,
    RolloutQuery,
    RunStats,
    RunStatsQuery,
    final_reward_of,
    matches,
    policy_stats_from,
    run_stats_from,
    summarize,
)

__all__ = ["MemoryRecords"]

_REQUEST_MEMORY_SIZE = 100_000


class MemoryRecords(StoreBoundary):
    """The state and the appended records of a `MemoryStore` (its base class; use `MemoryStore`).

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

    def _remember(self, key: str, answer: Any) -> None:
        self._requests[key] = answer
        if len(self._requests) > _REQUEST_MEMORY_SIZE:
            self._requests.popitem(last=False)

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

    # ----------------------------------------------------------------- spans and calls

    def _check_attempts_locked(self, pairs: set[tuple[str, str]], what: str, ended_ok: bool = False) -> None:
        """Apply the store's rule on records (`check_record_attempts`): every attempt was started and still runs."""
        check_record_attempts(
            pairs, self._attempt_status_locked, what, lambda r, a: self._unknown_attempt_locked(r, a, what), ended_ok
        )

    def _attempt_status_locked(self, rollout_id: str, attempt_id: str) -> str | None:
        if self._running.get(attempt_id) == rollout_id:  # the usual case: no scan of the rollout's attempts
            return "running"
        if self._attempt_rollout.get(attempt_id) != rollout_id:
            return None
        return self._get_attempt_locked(rollout_id, attempt_id)[1].status

    def _unknown_attempt_locked(self, rollout_id: str, attempt_id: str, what: str) -> NotFoundError:
        self._get_rollout_locked(rollout_id)  # raises, naming the rollout, when it is the rollout that is unknown
        return NotFoundError(
            f"attempt {attempt_id!r} of rollout {rollout_id!r} not found: {what} can only be added to an "
            "attempt the store started (dequeue_rollout)"
        )

    async def add_spans(self, spans: Sequence[Span], *, request_id: str | None = None) -> int:
        """Store spans (idempotent on (rollout_id, attempt_id, span_id)); returns how many were new.

        Raises `NotFoundError` for a span of an attempt the store did not start. A retried request with the same
        ``request_id`` gets the count of the first one.
        """
        batch = spans  # validated at the boundary (StoreBoundary), as every argument below
        key = None if request_id is None else "spans:" + request_id
        added = 0
        with self._lock:
            if key is not None and key in self._requests:
                return self._requests[key]
            self._check_attempts_locked({(s.rollout_id, s.attempt_id) for s in batch}, "spans", judgement_batch(batch))
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
        batch = calls
        key = None if request_id is None else "calls:" + request_id
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
        res = resources
        with self._lock:
            existing = self._resources.get(res.resources_id)
            if existing is not None:
                return existing
            version = (self._latest.version if self._latest else 0) + 1
            stored = fast_replace(res, version=version)
            self._resources[res.resources_id] = stored
            self._latest = stored
            return stored

    async def get_resources(self, resources_id: str | None = None) -> Resources | None:
        """Resources by id, or the latest version when ``resources_id`` is ``None``."""
        with self._lock:
            if resources_id is None:
                return self._latest
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
        query = query or RolloutQuery()  # the boundary passes a validated query
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
        query = query or RunStatsQuery()
        at = now()
        with self._lock:
            counts = dict.fromkeys(ALL_ROLLOUT_STATUSES, 0)
            for rollout in self._rollouts.values():
                counts[rollout.status] += 1
            facts: list[tuple[AttemptFacts, RolloutMode | None]] = [
                (fact, r.mode) for r in self._rollouts.values() for fact in self._facts_locked(r.rollout_id)
            ]
            calls = [(c.policy, c.agent_name, c.model_version, c.attempt_id) for c in self._calls.values()]
        attempts: dict[str, tuple[str, RolloutMode | None, float | None]] = {
            f.attempt.attempt_id: (f.attempt.status, mode, f.reward) for f, mode in facts
        }
        return run_stats_from(query, counts, facts, at, policy_stats_from(calls, attempts))

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
