"""The validated, frozen settings of an LLM judge (`JudgeConfig`)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = ["JudgeConfig"]


class JudgeConfig(BaseModel):
    """Where the judge model is and how its scores become rewards.

    Attributes:
        url: Base URL of any OpenAI-compatible server (``http://127.0.0.1:8000/v1``; ``/chat/completions`` is
            appended). The judge calls it directly over HTTP, never through the LLM proxy, so its calls are never
            recorded as an attempt's calls nor trained on.
        model: The ``model`` sent to that server.
        rubric: What a good rollout is, in the user's words (pasted into the judge's prompt).
        mode: ``group``: the rollouts of one task are scored together, relative to each other (RULER-style), each
            score becoming its rollout's final reward; ``step``: every LLM call of a rollout is scored, each score
            becoming that step's intermediate reward (for the ``per_step`` credit strategy); ``both``.
        weight: How much of the final reward is the judge's: ``weight * judge + (1 - weight) * checker``. ``1.0``
            (default): the judge alone; below 1 a rollout needs the checker's final reward too.
        api_key: Bearer token of the judge server, if it needs one.
        timeout_s: Longest wait for one judge answer.
        max_attempts: Tries per judgement (an answer that is not valid JSON, misses ids or is out of range, a
            timeout, HTTP 429 or 5xx all count); then the rollouts concerned have no reward, with the reason.
        max_retry_after_s: Longest ``Retry-After`` (HTTP 429/503) honoured; longer ones wait this long.
        max_calls_per_iteration: Judge calls allowed per iteration (``None``: no limit); past it, the rollouts not
            judged yet have no reward ("budget").
        max_tokens_per_iteration: Judge tokens (prompt + completion, as the server reports them) per iteration.
        max_failure_ratio: Stop the run when more than this fraction of an iteration's rollouts could not be judged.
        temperature: Sampling temperature of the judge (0: the most repeatable; identical requests are cached).
        max_tokens: Most tokens of one judge answer, sent as ``max_tokens`` (``None``: the server's default, which
            for vLLM and the local backend is the rest of the context: a small judge that loops would fill it).
        max_trace_chars: Longest text of one rollout's trace shown to the judge (the middle is cut).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    url: str = Field(min_length=1)
    model: str = Field(min_length=1)
    rubric: str = Field(min_length=1)
    mode: Literal["group", "step", "both"] = "group"
    weight: float = Field(default=1.0, ge=0.0, le=1.0)
    api_key: str | None = Field(default=None, repr=False)
    timeout_s: float = Field(default=120.0, gt=0)
    max_attempts: int = Field(default=3, ge=1, le=20)
    max_retry_after_s: float = Field(default=30.0, ge=0)
    max_calls_per_iteration: int | None = Field(default=None, ge=1)
    max_tokens_per_iteration: int | None = Field(default=None, ge=1)
    max_failure_ratio: float = Field(default=0.5, ge=0.0, le=1.0)
    temperature: float = Field(default=0.0, ge=0.0)
    max_tokens: int | None = Field(default=None, ge=1)
    max_trace_chars: int = Field(default=12000, ge=200)

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"the judge URL must start with http:// or https://, got {value!r}")
        return value.rstrip("/")

    @field_validator("rubric")
    @classmethod
    def _rubric_text(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("the rubric is blank: say in words what a good rollout is")
        return value.strip()

    @model_validator(mode="after")
    def _weight_needs_group(self) -> JudgeConfig:
        if self.mode == "step" and self.weight != 1.0:
            raise ValueError(
                "weight applies to the judge's final reward, which only mode='group' or 'both' gives; with "
                "mode='step' the checker's final reward is kept as it is (leave weight at 1.0)"
            )
        return self

    @property
    def judges_groups(self) -> bool:
        """Whether rollouts get a final reward from the judge (``group`` or ``both``)."""
        return self.mode in ("group", "both")

    @property
    def judges_steps(self) -> bool:
        """Whether each step gets a score from the judge (``step`` or ``both``)."""
        return self.mode in ("step", "both")

    @classmethod
    def from_files(cls, url: str, model: str, rubric_file: Path, **settings: object) -> JudgeConfig:
        """A config whose rubric is read from ``rubric_file`` (what ``agl train --rubric FILE`` does).

        Raises:
            ValueError: The file is missing, unreadable or blank.
        """
        try:
            rubric = rubric_file.read_text(encoding="utf-8")
        except OSError as exc:
            raise ValueError(f"cannot read the rubric file {rubric_file}: {exc.strerror or exc}") from None
        if not rubric.strip():
            raise ValueError(f"the rubric file {rubric_file} is empty: say in words what a good rollout is")
        return cls.model_validate({"url": url, "model": model, "rubric": rubric, **settings})
