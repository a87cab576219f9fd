"""The engine contract: what `RLLoop` needs from a trainer package (trainer-torch, trainer-verl)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path

from agentlightning._training_models import TrainingBatch

__all__ = ["ENGINE_ENTRY_POINTS", "Engine"]

ENGINE_ENTRY_POINTS = "agentlightning.engines"
"""The entry-point group through which trainer packages offer their engine to ``agl train``.

Each entry point is named after the engine (``agl train --engine NAME``) and points at its
`agentlightning.cli.EnginePlugin` (an object, or a class built without arguments): the options only that engine
understands (``add_arguments(parser)``) and the run (``train(args) -> int``, the parsed options, the exit code).
The engine named NAME is installed with ``pip install agentlightning-NAME``; the core never names the package.
"""


class Engine(ABC):
    """A policy that can be trained and served: one RL engine behind `RLLoop`.

    The loop owns everything else (tasks, rollouts, the LLM proxy, transitions and credit, versions, metrics,
    checkpoints of its own state); an engine owns the model, its optimizer and its inference servers, and usually
    delegates each server step to one `agentlightning.loop.Serving` (the serving contract of every trainer package).

    Call order: `load_state` (on resume) → `start_servers` → per iteration: (`wait_servers_idle`) → `update` →
    `wait_servers_idle` → `sync_weights` → `iteration_metrics` → ... → `save_state` (checkpoints) → `stop_servers`;
    `abort_servers` after a `wait_servers_idle` that timed out. An engine must not serve the new
    weights before `sync_weights`. Synchronously (``LoopConfig.max_staleness == 0``) the loop pauses the LLM proxy
    (no request in flight) before `update` and resumes it after `sync_weights`, so an engine may put its inference
    servers to sleep while it trains (colocated vLLM). With ``max_staleness`` k > 0 the proxy keeps serving the
    next iterations' rollouts during `update` and is paused only around `sync_weights`; the loop accepts that only
    from an engine whose `serves_during_update` is true, and a k no larger than its `max_staleness_supported`.
    """

    serves_during_update: bool = False
    """Whether the inference servers keep serving the current weights while `update` runs (they hold their own
    copy of the weights, and stay awake): what ``LoopConfig.max_staleness`` > 0 needs."""

    max_staleness_supported: int | None = None
    """The largest ``LoopConfig.max_staleness`` this engine can correct for (``None``: any). An engine whose update
    corrects for one version of lag only (or none) says so here, and `RLLoop` refuses a larger bound."""

    policies_unsupported: str | None = "it trains one policy (LoopConfig.policies needs a multi-policy engine)"
    """Why this engine cannot train several policies (``LoopConfig.policies``: one LoRA adapter per agent); ``None``
    for an engine that can (it then trains each `TrainingSample.policy` on its own weights). `RLLoop` refuses a
    config with policies for an engine that gives a reason."""

    @abstractmethod
    async def start_servers(self, model_version: int) -> list[str]:
        """Start the inference servers, serving the current weights as ``model_version``.

        Returns:
            Their OpenAI-compatible base URLs (with or without ``/v1``): the LLM proxy's backends. A backend
            should report the version of the weights behind each answer (a top-level ``model_version`` in
            the body and in every stream chunk, see `agentlightning.proxy.MODEL_VERSION_FIELD`); for one that
            does not, the proxy records the version the loop gave it when it admitted the request.
        """

    async def stop_servers(self) -> None:  # noqa: B027 - optional hook; engines without servers keep the default
        """Stop the inference servers (default: nothing to stop)."""

    async def wait_servers_idle(self, timeout_s: float) -> int:
        """Wait (at most ``timeout_s``) until the inference servers generate nothing (`Serving.wait_idle`: nothing
        is stopped); returns the requests still generating (0: idle).

        The loop calls it once the proxy has aborted the calls of cancelled rollouts and drained, before `update`
        (synchronous loop) and before `sync_weights`: an aborted request may take a moment to leave the server, and
        none may still generate when the weights change. Default: 0 (an engine without servers of its own).
        """
        del timeout_s
        return 0

    async def abort_servers(self, timeout_s: float) -> int:
        """Stop every request the inference servers still generate (`Serving.abort`), waiting at most ``timeout_s``
        for them to leave; returns the requests left.

        The loop calls it when `wait_servers_idle` timed out (a straggler the proxy gave up on): the weights must
        not change under a generating request. Default: 0 (an engine without servers of its own).
        """
        del timeout_s
        return 0

    @abstractmethod
    def update(self, batch: TrainingBatch) -> dict[str, float]:
        """One policy update from ``batch`` (not yet served); returns metrics (loss, kl, entropy...).

        Runs in a worker thread; ``batch`` always holds at least one sample.
        """

    @abstractmethod
    async def sync_weights(self, version: int) -> None:
        """Make the inference servers serve the updated weights, reported as ``version`` from now on."""

    def policy_versions(self) -> dict[str, int]:
        """Per policy, the version of the weights serving it, for servers that report none on their answers (vLLM):
        with ``LoopConfig.policies`` a policy's weights change only when it has samples, so its calls record its
        own version. Default: none (the servers report versions, or every policy has the loop's version)."""
        return {}

    def iteration_metrics(self) -> dict[str, float]:
        """Serving metrics since the previous call (batch sizes, generation time...); default: none."""
        return {}

    def save_state(self, directory: Path) -> None:  # noqa: B027 - optional hook
        """Write what resuming needs (weights, optimizer state...) into ``directory`` (it exists).

        Default: nothing, for engines whose state lives elsewhere; then a resumed run starts from the
        engine's initial weights with the loop's iteration and model version restored.
        """

    def load_state(self, directory: Path) -> None:  # noqa: B027 - optional hook
        """Restore what `save_state` wrote in ``directory``; called before `start_servers`."""
