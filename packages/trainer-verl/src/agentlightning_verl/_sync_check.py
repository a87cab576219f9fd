"""Checksums that compare the weights an actor sends with the weights a server received, tensor by tensor.

`tensor_digest` digests one named tensor (name, dtype, shape, raw bytes); `digests_checksum` combines the digests of
a whole model in name order. Both sides of a weight sync compute it the same way, each without holding the other's
tensors (the server digests each tensor as it arrives).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["digests_checksum", "named_tensors_digests", "tensor_digest"]


def tensor_digest(name: str, tensor: torch.Tensor) -> str:
    """SHA-256 of one tensor's name, dtype, shape and bytes (on the CPU)."""
    import torch

    value = tensor.detach().to("cpu").contiguous()
    digest = hashlib.sha256(f"{name}|{value.dtype}|{tuple(value.shape)}|".encode())
    digest.update(value.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def digests_checksum(digests: Mapping[str, str]) -> str:
    """One SHA-256 over ``{name: tensor_digest}``, in name order."""
    combined = hashlib.sha256()
    for name in sorted(digests):
        combined.update(f"{name}={digests[name]};".encode())
    return combined.hexdigest()


def named_tensors_digests(tensors: Iterable[tuple[str, torch.Tensor]]) -> dict[str, str]:
    """``{name: tensor_digest}`` of named tensors."""
    return {name: tensor_digest(name, tensor) for name, tensor in tensors}
