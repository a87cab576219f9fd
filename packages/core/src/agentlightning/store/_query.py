"""Read models for dashboards: a filtered, paginated page of rollout summaries and per-version run statistics.

These are part of the store protocol (`LightningStore.list_rollouts`, `run_stats`, `query_resources`) so that
every backend answers them server-side: a dashboard never pulls 100,000 rollouts to show fifty.
The in-memory reference implementation lives here as plain functions over records; SQLite answers in SQL.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from agentlightning import semconv
from agentlightning._models import Attempt, AttemptStatus, Rollout, RolloutMode, RolloutStatus, Span, now
from agentlightning.store._worker_stats import WorkerStats, worker_stats_from

__all__ = [
    "AttemptFacts",
    "PolicyStats",
    "RolloutPage",
    "RolloutQuery",
    "RolloutSummary",
    "RunStats",
    "RunStatsQuery",
    "ThroughputBucket",
    "VersionStats",
    "empty_buckets",
    "final_reward_in",
    "final_reward_of",
    "matches",
    "policy_stats",
    "policy_stats_from",
    "run_stats_from",
    "summarize",
    "summary_row",
    "throughput",
    "version_order",
    "version_stats",
]

_TIMED_OUT: frozenset[str] = frozenset({"timeout", "unresponsive"})
_ERROR_CHARS = 500  # errors in a summary row are cut; the full text is on the attempt


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class RolloutQuery(_Frozen):
    """Which rollouts `LightningStore.list_rollouts` returns, newest first.

    Attributes:
        status: Keep rollouts in one of these statuses (``None``: any).
        mode: Keep rollouts of one of these modes (``None``: any).
        group_id: Keep rollouts of this group.
        model_version: Keep rollouts with an attempt whose LLM calls were served by this model version.
        search: Keep rollouts whose id contains this text.
        limit: Rows per page (1-1000).
        offset: Rows to skip (for page ``n`` of size ``limit``: ``n * limit``).
    """

    status: list[RolloutStatus] | None = None
    mode: list[RolloutMode] | None = None
    group_id: str | None = Field(default=None, min_length=1, max_length=256)
    model_version: int | None = Field(default=None, ge=0)
    search: str | None = Field(default=None, min_length=1, max_length=256)
    limit: int = Field(default=50, ge=1, le=1000)
    offset: int = Field(default=0, ge=0, le=10_000_000)

    @field_validator("group_id", "search")
    @classmethod
    def _no_nul(cls, value: str | None) -> str | None:
        if value is not None and "\x00" in value:
            raise ValueError("must not contain NUL characters")
        return value


class RolloutSummary(_Frozen):
    """One row of the rollout table: the rollout plus facts about its latest attempt.

    Attributes:
        rollout_id: The rollout.
        status: Its status.
        mode: ``train``, ``val``, ``test`` or ``None``.
        group_id: Its group.
        resources_id: Resources it was pinned to (``None``: the latest at claim time).
        attempts: Attempts started so far.
        attempt_status: Status of the latest attempt (``None`` before the first).
        reward: Final reward reported by the latest attempt (``None`` if none).
        model_version: Newest model version that served an LLM call of the latest attempt (as the backend
            reported it; ``None`` without calls).
        duration: Seconds the latest attempt ran (until now while it runs).
        error: The latest attempt's error message (cut to 500 characters).
        created_at: Enqueue time.
        updated_at: Last status change.
    """

    rollout_id: str
    status: RolloutStatus
    mode: RolloutMode | None = None
    group_id: str | None = None
    resources_id: str | None = None
    attempts: int = 0
    attempt_status: AttemptStatus | None = None
    reward: float | None = None
    model_version: int | None = None
    duration: float | None = None
    error: str | None = None
    created_at: float
    updated_at: float


class RolloutPage(_Frozen):
    """A page of `RolloutSummary` rows and how many rows match the query in all."""

    total: int
    offset: int
    limit: int
    rollouts: list[RolloutSummary]


MAX_BUCKETS = 10_000
"""Most entries of a run's throughput series (``window / bucket``)."""


class RunStatsQuery(_Frozen):
    """Parameters of `LightningStore.run_stats`.

    Attributes:
        success_reward: An attempt is a success when its final reward is at least this.
        window: Seconds of recent history in the throughput series.
        bucket: Seconds per throughput bucket.
    """

    success_reward: float = Field(default=1.0, allow_inf_nan=False)
    window: float = Field(default=300.0, gt=0, le=86_400)
    bucket: float = Field(default=10.0, gt=0, le=3_600)

    @model_validator(mode="after")
    def _bounded_series(self) -> RunStatsQuery:
        # window / bucket is the length of the throughput series the store builds: keep it small (a tiny bucket
        # would ask for billions of entries and exhaust the server's memory)
        if self.window / self.bucket > MAX_BUCKETS:
            raise ValueError(
                f"window / bucket must be at most {MAX_BUCKETS} buckets, got {self.window / self.bucket:.3g}"
            )
        return self


class VersionStats(_Frozen):
    """Finished attempts of one (model version, mode) pair.

    Attributes:
        model_version: The version that served the attempts' LLM calls (``None``: attempts without calls).
        mode: Rollout mode of the attempts.
        attempts: Finished attempts.
        succeeded: Attempts that succeeded.
        failed: Attempts that failed (the agent raised).
        timed_out: Attempts ended as ``timeout`` or ``unresponsive``.
        cancelled: Attempts cancelled.
        rewarded: Attempts that reported a final reward.
        reward_mean: Mean final reward of those (``None`` if none did).
        successes: Attempts whose final reward is at least the query's ``success_reward``.
        success_rate: ``successes / rewarded`` (``None`` if none rewarded).
        first_end: When the first of them ended.
        last_end: When the last of them ended.
    """

    model_version: int | None
    mode: RolloutMode | None
    attempts: int
    succeeded: int
    failed: int
    timed_out: int
    cancelled: int
    rewarded: int
    reward_mean: float | None
    successes: int
    success_rate: float | None
    first_end: float | None
    last_end: float | None


class PolicyStats(_Frozen):
    """LLM calls of one (policy, agent, model version, mode) in finished attempts, and those attempts' reward.

    A run with policies (`agentlightning.PolicyMap`) serves each agent's calls by its policy's adapter, whose
    versions count that adapter's updates: one curve per policy is its ``reward_mean`` over ``model_version``.

    Attributes:
        policy: The policy that served the calls (``None``: no policy recorded, a one-policy run).
        agent_name: The agent that made them (``None``: not known).
        model_version: The version of the policy's weights that served them.
        mode: Rollout mode of the attempts.
        calls: LLM calls.
        attempts: Finished attempts with at least one of these calls.
        rewarded: Those that reported a final reward.
        reward_mean: Their mean final reward (``None`` if none did).
    """

    policy: str | None
    agent_name: str | None
    model_version: int | None
    mode: RolloutMode | None
    calls: int
    attempts: int
    rewarded: int
    reward_mean: float | None


class ThroughputBucket(_Frozen):
    """Attempts that ended in ``[start, start + bucket)``."""

    start: float
    finished: int
    failed: int


class RunStats(_Frozen):
    """What a training run looks like right now.

    Attributes:
        now: Server time the stats were computed at.
        rollouts: Rollouts per status.
        attempts: Attempts per status.
        versions: Per (model version, mode) statistics, ordered by version (``None`` first) then mode.
        policies: Per (policy, agent, model version, mode) statistics of LLM calls (see `PolicyStats`), ordered
            by policy, agent, version, mode (``None`` first in each).
        workers: Per worker id, the attempts it claimed by how they ended (see `WorkerStats`; ``runner_totals``
            groups them per runner process), ordered by worker id.
        throughput: Finished attempts per bucket over the last ``window`` seconds (oldest first, all buckets).
        bucket: Seconds per throughput bucket.
        success_reward: The threshold used for ``successes``.
    """

    now: float
    rollouts: dict[str, int]
    attempts: dict[str, int]
    versions: list[VersionStats]
    policies: list[PolicyStats] = Field(default_factory=list["PolicyStats"])
    workers: list[WorkerStats] = Field(default_factory=list[WorkerStats])
    throughput: list[ThroughputBucket]
    bucket: float
    success_reward: float


class AttemptFacts(_Frozen):
    """An attempt plus what its records say: final reward and serving model version (kept by every backend)."""

    attempt: Attempt
    reward: float | None = None
    model_version: int | None = None


def final_reward_of(span: Span) -> float | None:
    """The value of a final reward span (kind ``reward``, ``final`` true, finite number), else ``None``."""
    return final_reward_in(span.attributes)


def final_reward_in(attributes: dict[str, Any]) -> float | None:
    """`final_reward_of` the span with these attributes."""
    if attributes.get(semconv.SPAN_KIND) != semconv.KIND_REWARD or attributes.get(semconv.REWARD_FINAL) is not True:
        return None
    value = attributes.get(semconv.REWARD_VALUE)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def matches(query: RolloutQuery, rollout: Rollout, versions: Iterable[int | None]) -> bool:
    """Whether ``rollout`` (whose attempts were served by ``versions``) passes ``query``'s filters."""
    if query.status is not None and rollout.status not in query.status:
        return False
    if query.mode is not None and rollout.mode not in query.mode:
        return False
    if query.group_id is not None and rollout.group_id != query.group_id:
        return False
    if query.search is not None and query.search not in rollout.rollout_id:
        return False
    return query.model_version is None or query.model_version in versions


def summarize(rollout: Rollout, attempts: Sequence[AttemptFacts], at: float | None = None) -> RolloutSummary:
    """The table row of ``rollout`` given its attempts (any order) at time ``at`` (default: now)."""
    base = {
        "rollout_id": rollout.rollout_id,
        "status": rollout.status,
        "mode": rollout.mode,
        "group_id": rollout.group_id,
        "resources_id": rollout.resources_id,
        "created_at": rollout.created_at,
        "updated_at": rollout.updated_at,
    }
    return summary_row(base, attempts, at)


def summary_row(base: dict[str, Any], attempts: Sequence[AttemptFacts], at: float | None = None) -> RolloutSummary:
    """The table row from a rollout's own fields (``rollout_id``, ``status``, ``mode``, ``group_id``,
    ``resources_id``, ``created_at``, ``updated_at``) and its attempts."""
    fields = dict(base)
    fields["attempts"] = len(attempts)
    latest = max(attempts, key=lambda f: f.attempt.sequence) if attempts else None
    if latest is not None:
        attempt = latest.attempt
        end = attempt.end_time if attempt.end_time is not None else (now() if at is None else at)
        error = attempt.error
        fields["attempt_status"] = attempt.status
        fields["reward"] = latest.reward
        fields["model_version"] = latest.model_version
        fields["duration"] = max(0.0, end - attempt.start_time)
        fields["error"] = error if error is None or len(error) <= _ERROR_CHARS else error[: _ERROR_CHARS - 1] + "…"
    return RolloutSummary(**fields)


class _VersionAcc:
    __slots__ = ("attempts", "cancelled", "failed", "first", "last", "reward_sum", "rewarded", "succeeded", "successes")

    def __init__(self) -> None:
        self.attempts = self.succeeded = self.failed = self.cancelled = self.rewarded = self.successes = 0
        self.reward_sum = 0.0
        self.first = math.inf
        self.last = -math.inf


def version_stats(
    key: tuple[int | None, RolloutMode | None], counts: dict[str, int], rewarded: int, reward_sum: float,
    successes: int, first: float | None, last: float | None,
) -> VersionStats:  # fmt: skip
    """Build one `VersionStats` from aggregated counts (shared by every backend so they agree exactly)."""
    return VersionStats(
        model_version=key[0],
        mode=key[1],
        attempts=sum(counts.values()),
        succeeded=counts.get("succeeded", 0),
        failed=counts.get("failed", 0),
        timed_out=sum(counts.get(s, 0) for s in _TIMED_OUT),
        cancelled=counts.get("cancelled", 0),
        rewarded=rewarded,
        reward_mean=reward_sum / rewarded if rewarded else None,
        successes=successes,
        success_rate=successes / rewarded if rewarded else None,
        first_end=first,
        last_end=last,
    )


def version_order(key: tuple[int | None, str | None]) -> tuple[int, int, str]:
    """Sort key of (model version, mode): versionless first, then by version, then mode."""
    version, mode = key
    return (-1 if version is None else version, 0 if mode is None else 1, mode or "")


def empty_buckets(query: RunStatsQuery, at: float) -> tuple[float, list[list[int]]]:
    """Start of the throughput window (aligned to the bucket size) and zeroed ``[finished, failed]`` counters."""
    count = max(1, math.ceil(query.window / query.bucket))
    start = (math.floor(at / query.bucket) + 1 - count) * query.bucket
    return start, [[0, 0] for _ in range(count)]


def run_stats_from(
    query: RunStatsQuery,
    rollout_counts: dict[str, int],
    facts: Iterable[tuple[AttemptFacts, RolloutMode | None]],
    at: float,
    policies: Sequence[PolicyStats] = (),
) -> RunStats:
    """Compute `RunStats` from every attempt (with its rollout's mode): the reference implementation
    (``policies``: `policy_stats_from` of the same snapshot)."""
    attempt_counts: dict[str, int] = {}
    groups: dict[tuple[int | None, RolloutMode | None], tuple[dict[str, int], _VersionAcc]] = {}
    start, buckets = empty_buckets(query, at)
    claims: list[tuple[str | None, str, float | None]] = []
    for fact, mode in facts:
        attempt = fact.attempt
        attempt_counts[attempt.status] = attempt_counts.get(attempt.status, 0) + 1
        claims.append((attempt.worker_id, attempt.status, attempt.start_time))
        if attempt.status == "running" or attempt.end_time is None:
            continue
        key = (fact.model_version, mode)
        entry = groups.get(key)
        if entry is None:
            entry = groups[key] = ({}, _VersionAcc())
        counts, acc = entry
        counts[attempt.status] = counts.get(attempt.status, 0) + 1
        if fact.reward is not None:
            acc.rewarded += 1
            acc.reward_sum += fact.reward
            acc.successes += fact.reward >= query.success_reward
        acc.first = min(acc.first, attempt.end_time)
        acc.last = max(acc.last, attempt.end_time)
        index = math.floor((attempt.end_time - start) / query.bucket)
        if 0 <= index < len(buckets):
            buckets[index][0] += 1
            buckets[index][1] += attempt.status != "succeeded"
    versions = [
        version_stats(key, counts, acc.rewarded, acc.reward_sum, acc.successes, acc.first, acc.last)
        for key, (counts, acc) in sorted(groups.items(), key=lambda item: version_order(item[0]))
    ]
    return RunStats(
        now=at,
        rollouts=rollout_counts,
        attempts=attempt_counts,
        versions=versions,
        policies=list(policies),
        workers=worker_stats_from(claims),
        throughput=throughput(start, query.bucket, buckets),
        bucket=query.bucket,
        success_reward=query.success_reward,
    )


def throughput(start: float, bucket: float, counts: list[list[int]]) -> list[ThroughputBucket]:
    """The throughput series from bucket counters."""
    return [ThroughputBucket(start=start + i * bucket, finished=c[0], failed=c[1]) for i, c in enumerate(counts)]


PolicyKey = tuple[str | None, str | None, int | None, RolloutMode | None]
"""(policy, agent name, model version, mode) of a `PolicyStats` row."""


def _policy_order(key: PolicyKey) -> tuple[tuple[int, str], tuple[int, str], int, tuple[int, str]]:
    policy, agent, version, mode = key
    return ((policy is not None, policy or ""), (agent is not None, agent or ""),
            -1 if version is None else version, (mode is not None, mode or ""))  # fmt: skip


def policy_stats(groups: Mapping[PolicyKey, tuple[int, int, int, float]]) -> list[PolicyStats]:
    """`PolicyStats` rows, in order, from ``key -> (calls, attempts, rewarded, reward sum)`` (every backend)."""
    return [
        PolicyStats(policy=key[0], agent_name=key[1], model_version=key[2], mode=key[3], calls=calls,
                    attempts=attempts, rewarded=rewarded, reward_mean=reward_sum / rewarded if rewarded else None)
        for key, (calls, attempts, rewarded, reward_sum) in sorted(groups.items(), key=lambda i: _policy_order(i[0]))
    ]  # fmt: skip


def policy_stats_from(
    calls: Iterable[tuple[str | None, str | None, int | None, str]],
    attempts: Mapping[str, tuple[str, RolloutMode | None, float | None]],
) -> list[PolicyStats]:
    """The reference implementation of `RunStats.policies`.

    Args:
        calls: ``(policy, agent name, model version, attempt id)`` of every stored LLM call.
        attempts: ``attempt id -> (status, mode, final reward)`` of every attempt (calls of running or unknown
            attempts are not counted).
    """
    per_attempt: dict[tuple[str | None, str | None, int | None, str], int] = {}
    for call in calls:
        per_attempt[call] = per_attempt.get(call, 0) + 1
    groups: dict[PolicyKey, list[Any]] = {}
    for (policy, agent, version, attempt_id), count in per_attempt.items():
        attempt = attempts.get(attempt_id)
        if attempt is None or attempt[0] == "running":
            continue
        entry = groups.setdefault((policy, agent, version, attempt[1]), [0, 0, 0, 0.0])
        entry[0] += count
        entry[1] += 1
        if attempt[2] is not None:
            entry[2] += 1
            entry[3] += attempt[2]
    return policy_stats({key: (e[0], e[1], e[2], e[3]) for key, e in groups.items()})
