"""The serving contract: how an `Engine` serves its policy (one protocol, owned here, for every trainer package).

An engine owns inference servers of some kind (an embedded batched backend, a vLLM server, verl's vLLM replicas) and
delegates each of its server steps to one `Serving`: ``start_servers`` → `Serving.start`, ``wait_servers_idle`` →
`Serving.wait_idle`, ``abort_servers`` → `Serving.abort`, ``sync_weights`` → `Serving.sync`, ``iteration_metrics``
→ `Serving.metrics`, ``stop_servers`` → `Serving.stop`, ``policy_versions`` → `Serving.policy_versions`; and an
engine that shares its accelerator with its servers calls `Serving.release` before it trains.

Each verb means one thing: `wait_idle` only waits (it never stops a request), `abort` only stops what is generating
(it neither pauses the servers nor changes what they serve).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

__all__ = ["Serving"]


@runtime_checkable
class Serving(Protocol):
    """The inference servers behind the LLM proxy, and how the trainer's weights get into them."""

    async def start(self, version: int) -> list[str]:
        """Start (or reach) the servers, serving the trainer's current weights as ``version``.

        Returns:
            Their OpenAI-compatible base URLs (the LLM proxy's backends; an ``inproc://`` one for a server in this
            process; none where nothing serves). Starting again keeps the running servers.
        """
        ...

    async def wait_idle(self, timeout_s: float) -> int:
        """Wait (at most ``timeout_s``) until the servers generate nothing; every request runs to its end (or its
        client's cancellation). Returns the requests still generating (0: idle)."""
        ...

    async def abort(self, timeout_s: float) -> int:
        """Stop every request the servers generate now (their callers get an error or a truncated answer), and wait
        (at most ``timeout_s``) for them to leave; new requests are served as before. Returns the requests left."""
        ...

    async def sync(self, version: int) -> None:
        """Serve the trainer's updated weights from now on, reported as ``version``."""
        ...

    def metrics(self) -> dict[str, float]:
        """Serving metrics since the previous call (generation counts and time, weight-sync timings)."""
        ...

    async def stop(self) -> None:
        """Stop what `start` started (servers the trainer did not launch keep running)."""
        ...

    def release(self) -> None:
        """Give the accelerator to the trainer before an update (colocated vLLM sleeps); nothing where the servers
        have their own. Called with no request in flight, from the update's worker thread (synchronous)."""
        ...

    def policy_versions(self) -> dict[str, int]:
        """Per policy, the version of the weights serving it, where the servers report none on their answers;
        empty otherwise."""
        ...
