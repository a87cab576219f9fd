"""Rewards for tasks with no checker: an LLM judge that reads each rollout's trace from the store.

`LLMJudge` scores the rollouts of one task relative to each other (``mode="group"``, RULER-style: each score is
its rollout's final reward) and/or each LLM call of a rollout (``mode="step"``: each score is that step's
intermediate reward, for the ``per_step`` credit strategy). Its calls go straight to any OpenAI-compatible server,
never through the LLM proxy, so they are never training data. Every score and reason is stored as a span of kind
``judge`` in the rollout's last attempt; a rollout the judge could not score has no reward (the reason is stored
and logged). `RLLoop` uses it when `LoopConfig.judge` is set (``agl train --judge URL --judge-model M --rubric
FILE``); `calibrate` measures its agreement with a checker.
"""

from agentlightning.judge._apply import (
    JudgeFailedError,
    apply_judgements,
    check_failures,
    final_reward,
    judge_results,
    rewarded,
)
from agentlightning.judge._calibrate import CalibrationReport, agreement, calibrate, spearman
from agentlightning.judge._client import JudgeCounters
from agentlightning.judge._config import JudgeConfig
from agentlightning.judge._judge import (
    JUDGE_ERROR,
    JUDGE_REASON,
    JUDGE_SCOPE,
    JUDGE_SCORE,
    JUDGE_STEP,
    JUDGE_STEP_ID,
    JUDGE_WEIGHT,
    JudgeOutcome,
    LLMJudge,
    RolloutJudgement,
    stored_judgement,
)
from agentlightning.judge._prompts import InvalidJudgement, Score, parse_scores
from agentlightning.judge._trace import JudgedTrace, TraceStep, read_trace, trace_from_records

__all__ = [
    "JUDGE_ERROR",
    "JUDGE_REASON",
    "JUDGE_SCOPE",
    "JUDGE_SCORE",
    "JUDGE_STEP",
    "JUDGE_STEP_ID",
    "JUDGE_WEIGHT",
    "CalibrationReport",
    "InvalidJudgement",
    "JudgeConfig",
    "JudgeCounters",
    "JudgeFailedError",
    "JudgeOutcome",
    "JudgedTrace",
    "LLMJudge",
    "RolloutJudgement",
    "Score",
    "TraceStep",
    "agreement",
    "apply_judgements",
    "calibrate",
    "check_failures",
    "final_reward",
    "judge_results",
    "parse_scores",
    "read_trace",
    "rewarded",
    "spearman",
    "stored_judgement",
    "trace_from_records",
]
