"""Plain HTTP chat completions to any OpenAI-compatible judge server, with a per-iteration budget and a cache.

The judge never goes through the LLM proxy: its calls are not recorded for any attempt, so they never become
training data and never count as an agent's calls. Each request is one POST to ``{url}/chat/completions``; an
identical request (same model, messages and settings) is answered from the cache of valid answers.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from agentlightning.judge._config import JudgeConfig

if TYPE_CHECKING:
    import aiohttp

__all__ = ["JudgeAnswer", "JudgeBudgetExceeded", "JudgeCallError", "JudgeClient", "JudgeCounters"]

logger = logging.getLogger(__name__)

_CACHE_SIZE = 4096


class JudgeCallError(Exception):
    """One judge call failed (timeout, HTTP error, a body without an answer).

    Attributes:
        reason: One line saying why.
        retry_after: Seconds the server asked to wait (HTTP 429/503 ``Retry-After``), if it said.
    """

    def __init__(self, reason: str, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after


class JudgeBudgetExceeded(JudgeCallError):
    """The iteration's judge budget (calls or tokens) is spent."""


@dataclass
class JudgeAnswer:
    """The judge's text and what it cost."""

    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0


@dataclass
class JudgeCounters:
    """What the judge did in one iteration (reported as ``judge_*`` metrics)."""

    calls: int = 0
    failed_calls: int = 0
    retries: int = 0
    cache_hits: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0
    rollouts_judged: int = 0
    rollouts_missing: int = 0
    steps_judged: int = 0
    budget_exhausted: int = 0
    reasons: list[str] = field(default_factory=list[str])

    def as_metrics(self) -> dict[str, float]:
        """The counts as ``judge_*`` metrics."""
        return {
            "judge_calls": float(self.calls),
            "judge_failed_calls": float(self.failed_calls),
            "judge_retries": float(self.retries),
            "judge_cache_hits": float(self.cache_hits),
            "judge_prompt_tokens": float(self.prompt_tokens),
            "judge_completion_tokens": float(self.completion_tokens),
            "judge_tokens": float(self.prompt_tokens + self.completion_tokens),
            "judge_latency_s": self.latency_s,
            "judge_rollouts_judged": float(self.rollouts_judged),
            "judge_rollouts_missing": float(self.rollouts_missing),
            "judge_steps_judged": float(self.steps_judged),
            "judge_budget_exhausted": float(self.budget_exhausted),
        }


def _retry_after(headers: Any) -> float | None:
    value = headers.get("Retry-After")
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None  # an HTTP date: the caller's own backoff applies


class JudgeClient:
    """Chat completions to the judge server (one `aiohttp` session, opened on first use).

    Args:
        config: The judge's settings.
    """

    def __init__(self, config: JudgeConfig) -> None:
        self.config = config
        self.counters = JudgeCounters()
        self._cache: OrderedDict[str, Any] = OrderedDict()  # the newest `_CACHE_SIZE` valid answers
        self._session: aiohttp.ClientSession | None = None

    def new_iteration(self) -> JudgeCounters:
        """Start counting a new iteration (its budget starts afresh); returns the last iteration's counters."""
        last, self.counters = self.counters, JudgeCounters()
        return last

    def cached(self, key: str) -> Any | None:
        """A valid answer given before to the same request (counted as a cache hit)."""
        value = self._cache.get(key)
        if value is not None:
            self._cache.move_to_end(key)
            self.counters.cache_hits += 1
        return value

    def remember(self, key: str, value: Any) -> None:
        """Keep a validated answer for identical requests."""
        self._cache[key] = value
        if len(self._cache) > _CACHE_SIZE:
            self._cache.popitem(last=False)  # a long run must not keep every answer it ever got

    def body(self, messages: list[dict[str, str]]) -> dict[str, Any]:
        """The request body for ``messages``."""
        body: dict[str, Any] = {
            "model": self.config.model,
            "messages": messages,
            "temperature": self.config.temperature,
        }
        if self.config.max_tokens is not None:
            body["max_tokens"] = self.config.max_tokens
        return body

    @staticmethod
    def key(body: dict[str, Any]) -> str:
        """The cache key of a request body."""
        return hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()

    def _check_budget(self) -> None:
        config, counters = self.config, self.counters
        if config.max_calls_per_iteration is not None and counters.calls >= config.max_calls_per_iteration:
            raise JudgeBudgetExceeded(
                f"the judge's budget of {config.max_calls_per_iteration} calls per iteration is spent"
            )
        tokens = counters.prompt_tokens + counters.completion_tokens
        if config.max_tokens_per_iteration is not None and tokens >= config.max_tokens_per_iteration:
            raise JudgeBudgetExceeded(
                f"the judge's budget of {config.max_tokens_per_iteration} tokens per iteration is spent ({tokens} used)"
            )

    async def complete(self, body: dict[str, Any]) -> JudgeAnswer:
        """One POST to ``{url}/chat/completions``.

        Raises:
            JudgeBudgetExceeded: The iteration's budget is spent (nothing was sent).
            JudgeCallError: Timeout, connection error, an HTTP error status, or a body without an answer.
        """
        self._check_budget()
        import aiohttp  # on first use: a config that names a judge does not pull the HTTP client in

        if self._session is None:
            self._session = aiohttp.ClientSession()
        headers = {"Content-Type": "application/json"}
        if self.config.api_key:
            headers["Authorization"] = f"Bearer {self.config.api_key}"
        self.counters.calls += 1
        started = time.monotonic()
        try:
            async with self._session.post(
                f"{self.config.url}/chat/completions",
                data=orjson.dumps(body),
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=self.config.timeout_s),
            ) as response:
                raw = await response.read()
                if response.status >= 400:
                    self.counters.failed_calls += 1
                    detail = raw[:200].decode("utf-8", "replace")
                    raise JudgeCallError(f"HTTP {response.status}: {detail}", _retry_after(response.headers))
        except TimeoutError:
            self.counters.failed_calls += 1
            raise JudgeCallError(f"no answer in {self.config.timeout_s:g} s (timeout)") from None
        except aiohttp.ClientError as exc:
            self.counters.failed_calls += 1
            raise JudgeCallError(f"cannot reach the judge at {self.config.url}: {exc}") from None
        finally:
            self.counters.latency_s += time.monotonic() - started
        return self._answer(raw)

    def _answer(self, raw: bytes) -> JudgeAnswer:
        try:
            data = orjson.loads(raw)
            text = data["choices"][0]["message"]["content"]
        except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
            self.counters.failed_calls += 1
            raise JudgeCallError("the judge server's body is not a chat completion") from None
        usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
        prompt = int(usage.get("prompt_tokens") or 0)
        completion = int(usage.get("completion_tokens") or 0)
        self.counters.prompt_tokens += prompt
        self.counters.completion_tokens += completion
        return JudgeAnswer(text if isinstance(text, str) else "", prompt, completion)

    async def wait_before_retry(self, error: JudgeCallError, attempt: int) -> None:
        """Back off before try ``attempt + 1``: the server's ``Retry-After`` (bounded), else a short growing pause."""
        delay = error.retry_after if error.retry_after is not None else min(0.25 * 2 ** (attempt - 1), 4.0)
        await asyncio.sleep(min(delay, self.config.max_retry_after_s))

    async def close(self) -> None:
        """Close the HTTP session."""
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()
