"""What `LocalBackend` counts (its ``stats``)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

__all__ = ["BackendStats"]


@dataclass
class BackendStats:
    """Counters of what the backend has done (read them, do not write them).

    Attributes:
        requests: Generation requests completed (one per choice).
        batches: Admission groups: sets of requests prefilled together and joined to the running batch.
        tokens: Tokens generated.
        last_batch_size: Requests in the most recent admission group.
        max_batch_size: Most sequences decoded together so far.
        batch_sizes: Size of every admission group, in order (capped at the last 10,000).
        busy_seconds: Wall time spent prefilling and decoding.
        cpu_seconds: CPU time the generation thread spent prefilling and decoding (its own, read with
            `time.thread_time`: what generation costs, whatever else the process and the machine are doing).
        steps: Decode steps run.
        row_steps: Sequences summed over decode steps (``row_steps / steps`` is the mean decode batch).
        kv_tokens: Token slots the KV cache holds now (read from the cache tensors).
        peak_kv_tokens: The most token slots the KV cache has held.
        preemptions: Sequences evicted to keep the KV cache under its bound (they resumed later).
    """

    requests: int = 0
    batches: int = 0
    tokens: int = 0
    last_batch_size: int = 0
    max_batch_size: int = 0
    batch_sizes: deque[int] = field(default_factory=lambda: deque(maxlen=10_000))
    busy_seconds: float = 0.0
    cpu_seconds: float = 0.0
    steps: int = 0
    row_steps: int = 0
    kv_tokens: int = 0
    peak_kv_tokens: int = 0
    preemptions: int = 0
